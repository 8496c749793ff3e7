"""llama.cpp's own server test suite (tools/server/tests/unit/*.py with its utils.py, in the
llama.cpp source that llama-cpp-python 0.3.36 vendors) against `ggmlpy serve`, llama-server,
or both side by side, every preset pointed at one local model file.

Not a test of this repository and not a dependency: the suite needs its own environment
(its tests/requirements.txt: pytest, requests, wget, openai, aiohttp, filelock,
prometheus-client) and, for the llama-server side, a llama-server binary. Run as

    SUITE/bin/python tests/tools/llama_server_suite.py --suite LLAMA_CPP/tools/server/tests \\
        --model smollm2-135m.gguf [--llama-server PATH] [--ggmlpy-python .venv/bin/python] [-k EXPR]

It prints one JSON object: per server the passed, failed and skipped test ids, and with both
servers the tests llama-server passes and ggmlpy does not.

How: the suite starts its server with `LLAMA_SERVER_BIN_PATH` and llama-server's flags. For
ggmlpy that path is a small script running `python -m ggmlpy serve` with the same flags. A
pytest plugin, written next to it, makes every `ServerProcess` load the given model instead
of a preset's Hugging Face download, and skips the suite's session-start downloads.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PLUGIN = '''
import utils

_start = utils.ServerProcess.start


def start(self, *args, **kwargs):
    self.model_file = {model!r}
    self.model_hf_repo = None
    self.model_hf_file = None
    self.model_url = None
    self.offline = True
    return _start(self, *args, **kwargs)


utils.ServerProcess.start = start
utils.ServerPreset.load_all = staticmethod(lambda: None)
'''

WRAPPER = '''#!/bin/sh
exec {python} -m ggmlpy serve "$@"
'''

RESULT = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+?)(?: - .*)?$")


def run_suite(suite: Path, model: Path, server: str, extra: list[str], timeout: int,
              log: Path | None = None) -> dict[str, list[str]]:
    """The suite's unit tests with LLAMA_SERVER_BIN_PATH = server: test ids by outcome
    (pytest's whole output to `log` when given)."""
    with tempfile.TemporaryDirectory(prefix="ggmlpy-suite-") as tmp:
        (Path(tmp) / "suite_local_model.py").write_text(PLUGIN.format(model=str(model)))
        env = dict(os.environ, LLAMA_SERVER_BIN_PATH=server,
                   PYTHONPATH=os.pathsep.join([tmp, str(suite), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "pytest", "unit", "-p", "suite_local_model", "-rA", "-q", "-p", "no:cacheprovider",
               *extra]
        proc = subprocess.run(cmd, cwd=suite, env=env, capture_output=True, text=True, timeout=timeout)
    if log is not None:
        log.write_text(proc.stdout + proc.stderr)
    outcomes: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        m = RESULT.match(line)
        if m:
            outcomes.setdefault(m.group(1).lower(), []).append(m.group(2))
    return {k: sorted(set(v)) for k, v in outcomes.items()}


def ggmlpy_wrapper(folder: Path, python: str) -> str:
    path = folder / "ggmlpy-serve"
    path.write_text(WRAPPER.format(python=python))
    path.chmod(0o755)
    return str(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", required=True, type=Path, help="llama.cpp's tools/server/tests folder")
    ap.add_argument("--model", required=True, type=Path, help="the GGUF file every preset loads")
    ap.add_argument("--llama-server", help="llama-server binary: run the suite against it too")
    ap.add_argument("--ggmlpy-python", default=sys.executable, help="the Python with ggmlpy installed")
    ap.add_argument("-k", default=None, help="pytest -k expression")
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--log-dir", type=Path, help="write each server's pytest output there")
    a = ap.parse_args()
    extra = ["-k", a.k] if a.k else []
    report: dict = {"model": str(a.model)}
    with tempfile.TemporaryDirectory() as d:
        servers = {"ggmlpy": ggmlpy_wrapper(Path(d), a.ggmlpy_python)}
        if a.llama_server:
            servers["llama-server"] = a.llama_server
        for name, path in servers.items():
            log = a.log_dir / f"{name}.log" if a.log_dir else None
            if log is not None:
                log.parent.mkdir(parents=True, exist_ok=True)
            report[name] = run_suite(a.suite.resolve(), a.model.resolve(), path, extra, a.timeout, log)
    if "llama-server" in report:
        theirs = set(report["llama-server"].get("passed", []))
        ours = set(report["ggmlpy"].get("passed", []))
        report["llama_server_passes"] = len(theirs)
        report["ggmlpy_passes_of_those"] = len(theirs & ours)
        report["only_llama_server"] = sorted(theirs - ours)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
