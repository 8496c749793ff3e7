"""`ggmlpy quantize` against `llama-quantize`: the same F16 file to the same mix, in turns.

Each model given is first written as F16 by llama-quantize (`--allow-requantize IN F16`,
kept beside the other bench files), then both tools quantise that F16 file to the mix, the
two alternating for `--rounds` rounds with the same thread count. Prints one JSON line per
model: wall and CPU seconds (the children's user + system time) of every run, the medians,
their ratio (ggmlpy ÷ llama-quantize: below 1 is faster), and whether the two outputs are the
same bytes.

Usage: python bench/bench_quantize.py --llama-quantize PATH -m smollm2-135m -m FILE.gguf
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ggmlpy.hub import resolve_model, sha256_of


def timed(cmd: list[str]) -> dict:
    """Wall and CPU seconds of one command (its output discarded; a failure stops the bench)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{cmd[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}


def f16_of(binary: str, model: Path, folder: Path) -> Path:
    """The model written as F16 by llama-quantize (made once)."""
    out = folder / f"{model.stem}-f16.gguf"
    if not out.exists():
        partial = out.with_suffix(".partial")
        timed([binary, "--allow-requantize", str(model), str(partial), "F16"])
        partial.rename(out)
    return out


def compare(binary: str, f16: Path, mix: str, threads: int, rounds: int, folder: Path) -> dict:
    ours, theirs = folder / f"{f16.stem}-{mix}.ggmlpy.gguf", folder / f"{f16.stem}-{mix}.llama.gguf"
    ggmlpy = [sys.executable, "-m", "ggmlpy", "quantize", "--no-progress", str(f16), str(ours), mix, str(threads)]
    peer = [binary, str(f16), str(theirs), mix, str(threads)]
    runs: dict[str, list[dict]] = {"ggmlpy": [], "llama_quantize": []}
    for _ in range(rounds):
        runs["llama_quantize"].append(timed(peer))
        runs["ggmlpy"].append(timed(ggmlpy))
    median = {side: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s")} for side, rs in runs.items()}
    result = {"model": f16.name, "f16_bytes": f16.stat().st_size, "mix": mix, "threads": threads, "runs": runs,
              "median": median,
              "ratio_wall": round(median["ggmlpy"]["wall_s"] / median["llama_quantize"]["wall_s"], 3),
              "ratio_cpu": round(median["ggmlpy"]["cpu_s"] / median["llama_quantize"]["cpu_s"], 3),
              "identical": sha256_of(ours) == sha256_of(theirs)}
    ours.unlink()
    theirs.unlink()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-quantize", required=True, help="path of llama.cpp's llama-quantize")
    ap.add_argument("-m", "--model", action="append", required=True, help="hub name or GGUF path (repeatable)")
    ap.add_argument("--mix", default="Q4_K_M", help="the mix both tools write (default Q4_K_M)")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(Path.home() / ".cache" / "ggmlpy" / "bench-models"),
                    help="where the F16 files are kept and the outputs written")
    args = ap.parse_args()
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    for name in args.model:
        f16 = f16_of(args.llama_quantize, Path(resolve_model(name)), folder)
        print(json.dumps(compare(args.llama_quantize, f16, args.mix, args.threads, args.rounds, folder)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
