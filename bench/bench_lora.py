"""What a LoRA adapter costs a decode step: tokens/s of one-token steps with and without an
adapter, two contexts of the same model alternated in one process (so the machine's noise
falls on both), median of the rounds. The adapter is a random one (ggmlpy.testing.lora)
of rank r on every layer matrix, as a fine-tune's usually is.

Usage: python bench/bench_lora.py [-m MODEL] [--rank 8] [-n 64] [--rounds 3] [-t THREADS]
Prints JSON: tok/s with and without, their ratio, the adapter's bytes and matrices.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import llama
from ggmlpy.hub import resolve_model
from ggmlpy.ir.types import GGMLType
from ggmlpy.testing.lora import write_lora


def steps_per_second(ctx: llama.Context, n: int) -> float:
    ctx.memory.clear()
    ctx.decode(llama.Batch.from_tokens([1, 2, 3, 4]))
    t0 = time.perf_counter()
    for i in range(n):
        ctx.decode(llama.Batch.from_tokens([100 + i]))
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("-n", "--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    path = resolve_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        lora = write_lora(path, Path(tmp) / "lora.gguf", rank=args.rank, alpha=2.0 * args.rank,
                          dtype=GGMLType.F16, seed=1)
        model = llama.Model.load(path)
        adapter = model.load_lora(lora)
        ctxs = {"plain": llama.Context(model, n_ctx=512, n_threads=args.threads),
                "lora": llama.Context(model, n_ctx=512, n_threads=args.threads)}
        ctxs["lora"].set_adapter_lora(adapter, 1.0)
        ctxs["lora"].reserve_lora_graphs()
        runs: dict[str, list[float]] = {k: [] for k in ctxs}
        for _ in range(args.rounds):
            for name, ctx in ctxs.items():
                runs[name].append(steps_per_second(ctx, args.tokens))
        med = {k: float(np.median(v)) for k, v in runs.items()}
        print(json.dumps({"model": args.model, "rank": args.rank, "matrices": len(adapter.weights),
                          "adapter_bytes": adapter.nbytes, "tok_s": med,
                          "lora_over_plain": round(med["lora"] / med["plain"], 3),
                          "runs": {k: [round(x, 1) for x in v] for k, v in runs.items()}}))
        model.close()


if __name__ == "__main__":
    main()
