"""LLVM in a child process: IR text in, object code out (python -m ggmlpy.codegen_cpu.compile_worker).

Why a child: loading libllvmlite.so costs the process that runs a model 40-70 MiB of resident
memory for the rest of its life, and peak RSS is a target. A worker is started on the first
cache miss, serves compiles (and the one-time host detection) over its stdin/stdout, and
exits when its parent closes the pipe or after IDLE_SECONDS without work; compiles asked
from several threads at once each get a worker of their own. If it cannot be
started or dies, the parent compiles in-process (with a warning); GGMLPY_COMPILE_INPROCESS=1
asks for that directly.

Protocol: a request is one command byte (b"C" compile, b"H" host) and an 8-byte little-endian
length, then that many payload bytes (UTF-8 IR for b"C"). A reply is b"O" (payload: object
code, or the host as JSON) or b"E" (payload: LLVM's error message), length, payload.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import select
import struct
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path

from ggmlpy.codegen_cpu.target import HostTarget

log = logging.getLogger("ggmlpy.codegen_cpu")

HEADER = struct.Struct("<cQ")
IDLE_SECONDS = 120.0
INPROCESS_ENV = "GGMLPY_COMPILE_INPROCESS"


class WorkerFailed(Exception):
    """The child process could not be started, died, or broke the protocol."""


def inprocess_requested() -> bool:
    return os.environ.get(INPROCESS_ENV, "") not in ("", "0")


def emit_object(ir_text: str, optimize_ir: bool = True) -> bytes:
    """Parse, verify, optimise (O3) and emit object code in this process (loads LLVM)."""
    import llvmlite.binding as llvm

    from ggmlpy.codegen_cpu.target import optimize, target_machine

    tm = target_machine()
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    if optimize_ir:
        optimize(mod)
    return tm.emit_object(mod)


# ---- parent side ---------------------------------------------------------------------------

def _read_exact(stream, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise WorkerFailed(f"the compile worker closed its output ({n - left} of {n} bytes read)")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _Worker:
    def __init__(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # the tree this ggmlpy is imported from
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "ggmlpy.codegen_cpu.compile_worker"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        except OSError as e:
            raise WorkerFailed(f"could not start the compile worker: {e}") from e

    def request(self, command: bytes, payload: bytes) -> bytes:
        try:
            self.proc.stdin.write(HEADER.pack(command, len(payload)))
            self.proc.stdin.write(payload)
            self.proc.stdin.flush()
            status, n = HEADER.unpack(_read_exact(self.proc.stdout, HEADER.size))
            body = _read_exact(self.proc.stdout, n)
        except (OSError, ValueError, struct.error) as e:
            raise WorkerFailed(f"lost the compile worker: {e}") from e
        if status == b"E":
            raise RuntimeError(f"LLVM could not compile the module: {body.decode(errors='replace')}")
        if status != b"O":
            raise WorkerFailed(f"unexpected reply {status!r} from the compile worker")
        return body

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


# Idle workers. A compile takes one (starting a new one if none is idle), so as many compiles
# run at once as threads ask: a context's two graphs compile side by side on two cores.
_lock = threading.Lock()
_idle: list[_Worker] = []


def _ask(command: bytes, payload: bytes) -> bytes:
    """One request; a worker that has exited (idle, killed) is replaced once."""
    for attempt in (0, 1):
        with _lock:
            worker = _idle.pop() if _idle else None
        if worker is None or worker.proc.poll() is not None:
            worker = _Worker()
        try:
            body = worker.request(command, payload)
        except WorkerFailed:
            worker.proc.kill()
            if attempt:
                raise
            continue
        except RuntimeError:  # LLVM refused the module: the worker answered and is fine
            _release(worker)
            raise
        _release(worker)
        return body
    raise AssertionError("unreachable")


def _release(worker: _Worker) -> None:
    with _lock:
        _idle.append(worker)


def shutdown() -> None:
    """Stop the workers (they also stop by themselves when idle or when this process exits)."""
    with _lock:
        workers = list(_idle)
        _idle.clear()
    for worker in workers:
        worker.close()


atexit.register(shutdown)


def compile_ir(ir_text: str) -> bytes:
    """Object code for the host, compiled by the worker process (in-process if it fails)."""
    if inprocess_requested():
        return emit_object(ir_text)
    try:
        return _ask(b"C", ir_text.encode())
    except WorkerFailed as e:
        log.warning("compile worker failed (%s); compiling in this process", e)
        return emit_object(ir_text)


def detect_host() -> HostTarget:
    """The host as LLVM sees it, asked in the worker so that this process stays LLVM-free."""
    from ggmlpy.codegen_cpu.target import detect_host_with_llvm

    if inprocess_requested():
        return detect_host_with_llvm()
    try:
        return HostTarget(**json.loads(_ask(b"H", b"")))
    except (WorkerFailed, ValueError, TypeError) as e:
        log.warning("compile worker failed (%s); detecting the host in this process", e)
        return detect_host_with_llvm()


# ---- child side ----------------------------------------------------------------------------

def _serve(inp, out) -> None:
    from ggmlpy.codegen_cpu.target import detect_host_with_llvm

    while True:
        ready, _, _ = select.select([inp], [], [], IDLE_SECONDS)
        if not ready:
            return
        header = inp.read(HEADER.size)
        if len(header) < HEADER.size:
            return  # the parent closed the pipe
        command, n = HEADER.unpack(header)
        payload = _read_exact(inp, n)
        try:
            if command == b"C":
                body, status = emit_object(payload.decode()), b"O"
            elif command == b"H":
                body, status = json.dumps(asdict(detect_host_with_llvm())).encode(), b"O"
            else:
                body, status = f"unknown command {command!r}".encode(), b"E"
        except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
            body, status = f"{type(e).__name__}: {e}".encode(), b"E"
        try:
            out.write(HEADER.pack(status, len(body)))
            out.write(body)
            out.flush()
        except BrokenPipeError:  # the parent is gone (it exited while this compile ran)
            return


def main() -> None:
    os.environ[INPROCESS_ENV] = "1"  # this process is the one that may load LLVM
    # the protocol owns the original stdout; anything else printed goes to stderr
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
