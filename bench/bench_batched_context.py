"""Batched decode with long contexts (a server's step once its conversations have grown):
aggregate tokens/s of one-token steps of N sequences that each already hold L tokens, for
every (N, L) asked, against one sequence of the same length in the same run. JSON on stdout.

The figure depends on where the KV cache puts each sequence's cells: llama.cpp's placement
interleaves the sequences' new tokens, so every token's attention spans every sequence's
cells, masked; ggmlpy keeps each sequence in blocks of its own (llama/kv_cells.py) that the
CPU attention kernels skip for the other tokens (codegen_cpu/kernels/extent.py).

    python bench/bench_batched_context.py [-m MODEL] [-t THREADS] [--seqs 1,4] [--context 100,1000]
                                          [--steps 32] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import llama


def _filled(model: llama.Model, n_seqs: int, context: int, threads: int, toks: list[int]) -> llama.Context:
    """A context whose n_seqs sequences each hold `context` tokens (prompts in ubatches of 512)."""
    ctx = llama.Context(model, n_ctx=max(1024, -(-(context + 512) * n_seqs // 256) * 256), n_batch=512,
                        n_ubatch=512, n_threads=threads, n_seq_max=n_seqs)
    for s in range(n_seqs):
        for i in range(0, context, 512):
            part = toks[i:min(i + 512, context)]
            if ctx.decode(llama.Batch(tokens=part, pos=list(range(i, i + len(part))), seq_ids=[[s]] * len(part))):
                raise RuntimeError(f"prompt of sequence {s} did not decode")
    return ctx


def _step_seconds(ctx: llama.Context, n_seqs: int, steps: int, toks: list[int]) -> float:
    t0 = time.perf_counter()
    for i in range(steps):
        batch = llama.Batch(tokens=[toks[(i + s) % len(toks)] for s in range(n_seqs)],
                            seq_ids=[[s] for s in range(n_seqs)], logits=[True] * n_seqs)
        if ctx.decode(batch):
            raise RuntimeError("a batched step did not decode")
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seqs", default="1,4", help="sequences per step, comma-separated")
    ap.add_argument("--context", default="100,1000", help="tokens each sequence holds, comma-separated")
    ap.add_argument("--steps", type=int, default=32, help="steps timed per round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds, every setup once each, alternated")
    args = ap.parse_args()
    model = llama.Model.load(args.model)
    seqs = [int(x) for x in args.seqs.split(",")]
    contexts = [int(x) for x in args.context.split(",")]
    toks = [int(t) for t in np.random.default_rng(0).integers(100, model.hparams.n_vocab - 100, max(contexts) + 64)]
    setups = {(n, c): _filled(model, n, c, args.threads, toks) for c in contexts for n in seqs}
    for (n, _), ctx in setups.items():   # graphs compiled, caches warm
        _step_seconds(ctx, n, 2, toks)
    times: dict[tuple[int, int], list[float]] = {k: [] for k in setups}
    for _ in range(args.rounds):
        for (n, c), ctx in setups.items():
            times[(n, c)].append(_step_seconds(ctx, n, args.steps, toks))
    out = {"model": model.path.name, "threads": args.threads, "steps": args.steps, "rounds": args.rounds,
           "runs": []}
    for (n, c), ts in times.items():
        step = statistics.median(ts)
        out["runs"].append({"seqs": n, "context": c, "step_ms": round(step * 1e3, 2),
                            "tok_s": round(n / step, 1)})
    for run in out["runs"]:
        one = times.get((1, run["context"]))
        if one is not None:
            run["vs_one_sequence"] = round(run["tok_s"] / (1 / statistics.median(one)), 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
