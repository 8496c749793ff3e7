"""A llama-server process on a loopback port, for the tools that record its answers
(lora_vectors.py, infill_vectors.py): `with llama_server(path, args) as call:` then
`status, body = call("POST", "/completion", {...})`."""
from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
from contextlib import contextmanager, suppress
from typing import IO, Any, Callable, Iterator

Call = Callable[..., tuple[int, Any]]


@contextmanager
def llama_server(server: str, args: list[str], timeout: float = 120.0,
                 stderr: IO[bytes] | None = None) -> Iterator[Call]:
    """`stderr`: a file for the server's log (None: discarded)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, *args, "--host", "127.0.0.1", "--port", str(port), "--no-webui"],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL if stderr is None else stderr)

    def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request(method, path, None if body is None else json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, json.loads(data) if data else None

    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with suppress(OSError):   # not listening yet
                if call("GET", "/health")[0] == 200:
                    break
            time.sleep(0.2)
        else:
            raise TimeoutError(f"{server} did not become healthy")
        yield call
    finally:
        proc.terminate()
        proc.wait()
