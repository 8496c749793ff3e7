"""Open time and RSS growth of the real models: ggmlpy's reader next to gguf.GGUFReader.

Every measurement runs in a fresh process with the imports done before the clock starts, so
it includes the page faults of reading the header but not Python's start-up; the open time
reported is the median over the runs. RSS growth is VmRSS (anonymous and file-backed pages)
after the open minus before it. Prints one JSON object.

    python bench/bench_gguf_open.py [--runs 7] [--oracle-runs 3] [--models smollm2-135m,gemma3-270m]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from ggmlpy.hub import KNOWN_MODELS, resolve_model

MiB = 1 << 20
TARGETS = {"open_ms": 50.0, "rss_growth_mib": 10.0}  # the loader's targets for either real model

PROBE = r"""
import json, sys, time
import numpy as np
which, path = sys.argv[1], sys.argv[2]
if which == "ggmlpy":
    from ggmlpy.gguf import GGUFFile as open_model
else:
    from gguf import GGUFReader as open_model

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

before = rss()
start = time.perf_counter()
model = open_model(path)
seconds = time.perf_counter() - start
after = rss()
n_tensors = len(model.tensors)
print(json.dumps({"open_s": seconds, "rss_growth": after - before, "n_tensors": n_tensors}))
"""


def measure(which: str, path: str, runs: int) -> dict:
    times, growth, n_tensors = [], [], set()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", PROBE, which, path], capture_output=True,
                              text=True, check=True, env=env)
        result = json.loads(done.stdout)
        times.append(result["open_s"] * 1e3)
        growth.append(result["rss_growth"] / MiB)
        n_tensors.add(result["n_tensors"])
    return {
        "open_ms": round(statistics.median(times), 2),
        "open_ms_runs": [round(t, 2) for t in times],
        "rss_growth_mib": round(statistics.median(growth), 2),
        "n_tensors": n_tensors.pop() if len(n_tensors) == 1 else sorted(n_tensors),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per model for ggmlpy")
    parser.add_argument("--oracle-runs", type=int, default=3,
                        help="fresh processes per model for gguf.GGUFReader (slow on Gemma)")
    parser.add_argument("--models", default=",".join(KNOWN_MODELS))
    args = parser.parse_args()

    report: dict = {"bench": "gguf_open", "runs": args.runs, "oracle_runs": args.oracle_runs,
                    "targets": TARGETS, "models": {}}
    for name in args.models.split(","):
        path = str(resolve_model(name))
        ours = measure("ggmlpy", path, args.runs)
        theirs = measure("gguf", path, args.oracle_runs)
        report["models"][name] = {
            "file": path,
            "file_mib": round(os.path.getsize(path) / MiB, 2),
            "ggmlpy": ours,
            "gguf": theirs,
            "open_speedup_vs_gguf": round(theirs["open_ms"] / ours["open_ms"], 1),
            "meets_targets": (ours["open_ms"] < TARGETS["open_ms"]
                              and ours["rss_growth_mib"] < TARGETS["rss_growth_mib"]),
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
