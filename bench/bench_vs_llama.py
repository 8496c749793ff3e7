"""`ggmlpy bench` and llama.cpp's `llama-bench`, alternated in one run on every model given,
so the ratios come from the same minutes of a shared machine. Prints one JSON object: each
round's figures from both, and per model the medians, the ratios (ggmlpy / llama.cpp), each
round's own ratios, and the spread of each side's tg128 over the rounds (max / min).

Usage: python bench/bench_vs_llama.py --llama-bench PATH [-m MODEL ...] [-t 2] [--rounds 2] [--depth D]
                                      [--kv TYPE]

With --kv TYPE, both sides use a KV cache of that type (-ctk/-ctv TYPE, flash attention on).
With --depth D, tg128 after a D-token prompt too (llama-bench's -d D, one repetition a
round on its side; ggmlpy decodes the prompt once and restores the cache before each run).

Start times and batched decode are measured in the first round only (they take longest and
have no llama-bench figure to alternate with); pp512 and tg128 in every round.

llama-bench is built outside the repo from llama.cpp's source (built as
`cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build --target llama-bench`).
The batched and roofline figures are ggmlpy's only (llama-bench has no batched decode).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from ggmlpy.hub import resolve_model

SHARED = ("pp512_tok_s", "tg128_tok_s")


def cache_flags(kv: str | None) -> list[str]:
    """-ctk T -ctv T -fa on for a KV cache of type T (both tools take these flags)."""
    return ["-ctk", kv, "-ctv", kv, "-fa", "1"] if kv else []


def llama_bench(binary: str, path: str, threads: int, depth: int = 0, kv: str | None = None) -> dict:
    out = subprocess.run([binary, "-m", path, "-t", str(threads), "-p", "512", "-n", "128", "-r", "3",
                          *cache_flags(kv), "-o", "json"], capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    by_test = {(r["n_prompt"], r["n_gen"]): r["avg_ts"] for r in rows}
    result = {"pp512_tok_s": round(by_test[(512, 0)], 2), "tg128_tok_s": round(by_test[(0, 128)], 2)}
    if depth:
        out = subprocess.run([binary, "-m", path, "-t", str(threads), "-p", "0", "-n", "128", "-d", str(depth),
                              "-r", "1", *cache_flags(kv), "-o", "json"],
                             capture_output=True, text=True, check=True).stdout
        result[f"tg128_d{depth}_tok_s"] = round(json.loads(out)[0]["avg_ts"], 2)
    return result


def ggmlpy_bench(path: str, threads: int, first: bool, depth: int = 0, kv: str | None = None) -> dict:
    args = [sys.executable, "-m", "ggmlpy", "bench", "-m", path, "-t", str(threads), *cache_flags(kv)]
    if depth:
        args += ["-d", str(depth)]
    if not first:
        args += ["--no-start-times", "--batched", ""]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-bench", required=True, help="path of llama.cpp's llama-bench")
    p.add_argument("-m", "--model", action="append", help="GGUF path or known name (repeatable)")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="alternations per model")
    p.add_argument("--depth", type=int, default=0, help="also tg128 after a prompt of this many tokens")
    p.add_argument("--kv", default=None, metavar="TYPE",
                   help="K and V cache type on both sides (-ctk TYPE -ctv TYPE -fa 1), e.g. q8_0")
    a = p.parse_args()
    shared = SHARED + ((f"tg128_d{a.depth}_tok_s",) if a.depth else ())
    models = a.model or ["smollm2-135m", "gemma3-270m"]
    report: dict = {"threads": a.threads, "kv": a.kv or "f16", "models": {}}
    for name in models:
        path = str(resolve_model(name))
        rounds = []
        for r in range(a.rounds):
            peer = llama_bench(a.llama_bench, path, a.threads, a.depth, a.kv)
            ours = ggmlpy_bench(path, a.threads, first=r == 0, depth=a.depth, kv=a.kv)
            rounds.append({"llama.cpp": peer, "ggmlpy": ours})
        sides = ("llama.cpp", "ggmlpy")
        med = {side: {k: statistics.median(x[side][k] for x in rounds) for k in shared} for side in sides}
        ratios = {k: round(med["ggmlpy"][k] / med["llama.cpp"][k], 2) for k in shared}
        per_round = [{k: round(x["ggmlpy"][k] / x["llama.cpp"][k], 2) for k in shared} for x in rounds]
        spread = {side: round(max(x[side]["tg128_tok_s"] for x in rounds)
                              / min(x[side]["tg128_tok_s"] for x in rounds), 2) for side in sides}
        report["models"][name] = {"rounds": rounds, "median": med, "ratio": ratios,
                                  "ratio_per_round": per_round, "tg128_spread": spread}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
