"""`--sleep-idle-seconds N`: llama-server's idle sleep. After N seconds without a request
that needs the model (and with nothing running), the model is unloaded to give its memory
back; the next such request loads it again and waits for it. `/health`, `/props` (with
`is_sleeping`), `/models` and `/metrics` answer without waking it; `/metrics` then reports
the snapshot taken as it fell asleep (llama/server/metrics.py)."""
from __future__ import annotations

import threading
import time
from typing import Callable

from llama.server.state import ServerState

POLL_SECONDS = 0.1


class IdleSleeper:
    def __init__(self, state: ServerState, seconds: float, snapshot: Callable[[], list]):
        """`snapshot`: the metrics as they are now (taken as the server falls asleep)."""
        self.state, self.seconds, self.snapshot = state, seconds, snapshot
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ggmlpy-sleep", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        state = self.state
        while not self._stop.wait(POLL_SECONDS):
            sched = state.scheduler
            if state.sleeping or sched is None:
                continue
            if not sched.idle:
                state.last_used = time.monotonic()
            elif time.monotonic() - state.last_used >= self.seconds:
                state.sleep(self.snapshot, self.seconds)
