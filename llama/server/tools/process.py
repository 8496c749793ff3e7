"""Running a command for a tool (llama-server's `run_subprocess`): its output collected up to
a cap, streamed as it comes, and the command killed on a timeout or when the client leaves.
The command runs in a process group of its own, so a kill also ends what it started."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

READ_CHUNK = 4096
EXIT_FAILURE = 1                              # what a child killed by a signal reports
_NO_WINDOW = 0x08000000  # Windows' CREATE_NO_WINDOW: a command must not pop up a console

OnChunk = Callable[[bytes], bool]   # gets each chunk of output; False stops the command


@dataclass
class ExecResult:
    """What a command left: its output (raw bytes), exit code (-1 when it could not start)
    and whether the timeout ended it."""
    data: bytes
    exit_code: int = -1
    timed_out: bool = False

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def _kill(proc: subprocess.Popen) -> None:
    """Kill the command and what it started: it runs in a process group of its own (which
    may have exited already: then there is nothing to kill)."""
    with contextlib.suppress(OSError):
        if os.name == "nt":
            proc.kill()
        else:
            os.killpg(proc.pid, signal.SIGKILL)


def run_process(argv: list[str], max_output: int, timeout: float, on_chunk: Optional[OnChunk] = None, *,
                alive: Optional[Callable[[], bool]] = None, cwd: str = "", stdin_data: Optional[bytes] = None,
                combine_stderr: bool = True) -> ExecResult:
    """Run `argv` and collect its output, at most `max_output` bytes (the rest is drained, so the
    child never blocks on a full pipe, and marked "[output truncated]"). `on_chunk` sees the
    output as it comes; the command is killed when it returns False, when `alive` says the
    client left, or after `timeout` seconds. stderr is kept apart when the bytes must stay raw
    (reading a file's contents)."""
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if combine_stderr else subprocess.DEVNULL,
            cwd=cwd or None, start_new_session=os.name != "nt",
            creationflags=_NO_WINDOW if os.name == "nt" else 0)
    except (OSError, ValueError):
        return ExecResult(b"failed to spawn process")

    done = threading.Event()
    timed_out = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() >= deadline:
                timed_out.set()
                _kill(proc)
                return
            if alive is not None and not alive():
                _kill(proc)
                return
            if done.wait(0.1):
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # always close stdin: a client such as `docker exec -i` waits as long as it is open (a
    # command that exits without reading it breaks the pipe, which is no error of ours)
    with contextlib.suppress(OSError):
        if stdin_data:
            proc.stdin.write(stdin_data)
        proc.stdin.close()

    out = bytearray()
    truncated = False
    fd = proc.stdout.fileno()
    try:
        while data := os.read(fd, READ_CHUNK):
            if truncated:
                continue
            if len(out) + len(data) <= max_output:
                out += data
                if on_chunk is not None and not on_chunk(data):
                    _kill(proc)
                    break
            else:
                remaining = max(0, max_output - len(out))
                out += data[:remaining]
                if on_chunk is not None and remaining > 0:
                    on_chunk(data[:remaining])
                truncated = True
    except BaseException:  # `on_chunk` failed: the command must not outlive the call
        _kill(proc)
        raise
    finally:
        proc.stdout.close()
        code = proc.wait()
        done.set()
        watcher.join()
    if truncated:
        out += b"\n[output truncated]"
    return ExecResult(bytes(out), EXIT_FAILURE if code < 0 else code, timed_out.is_set())
