"""Where a decode step's time goes on the CPU backend: per op kind and per node, the cycles
spent in kernels and waiting at the barrier after them (thread 0's view; `per_thread` adds up
every thread's), from a profiled
build of the graphs (GGMLPY_PROFILE=1).

Usage: python bench/profile_decode.py [-m MODEL] [-t THREADS] [-n TOKENS] [--seqs N] [--context N]
                                     [--prompt N] [--top K] [-ctk TYPE] [-ctv TYPE]
(--seqs N: batched decode, one token of each of N sequences per step; --context N: each
sequence holds N tokens before the steps profiled)
Prints JSON: per op (kernel and barrier µs per step, share of the step) and the top nodes.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import time

os.environ["GGMLPY_PROFILE"] = "1"

import numpy as np  # noqa: E402

import llama  # noqa: E402
from ggmlpy.viz.profile import tsc_ghz  # noqa: E402


def _compiled(ctx: llama.Context) -> list:
    return [c for e in ctx.graph_cache.entries.values() for c in e.compiled]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--tokens", type=int, default=64)
    ap.add_argument("--seqs", type=int, default=1, help="sequences decoded together per step")
    ap.add_argument("--context", type=int, default=0, help="tokens each sequence holds before the steps")
    ap.add_argument("--prompt", type=int, default=0,
                    help="profile one prompt of N tokens instead (in ubatches of 512)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("-ctk", "--cache-type-k", default="f16", help="the KV cache's K type (llama.cpp's names)")
    ap.add_argument("-ctv", "--cache-type-v", default="f16", help="the KV cache's V type")
    args = ap.parse_args()
    model = llama.Model.load(args.model)
    n = args.seqs
    n_ctx = max(1024 * n, -(-args.prompt // 512) * 512, -(-(args.context + args.tokens + 16) * n // 256) * 256)
    ctx = llama.Context(model, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=args.threads, n_seq_max=n,
                        type_k=args.cache_type_k, type_v=args.cache_type_v)
    rng = np.random.default_rng(0)
    toks = [int(t) for t in rng.integers(100, model.n_vocab - 100, max(512, args.prompt))]
    # warm-up: both graphs run once (weights repacked, pages touched) before anything is timed
    ctx.decode(llama.Batch.from_tokens(toks[:8]))
    def step(i: int) -> None:
        ctx.decode(llama.Batch(tokens=[toks[(i + s) % 512] for s in range(n)], seq_ids=[[s] for s in range(n)],
                               logits=[True] * n))

    step(8)
    if args.prompt or args.context:
        ctx.memory.clear()
    for s in range(n if args.context else 0):   # each sequence's context, in ubatches of 512
        for i in range(0, args.context, 512):
            part = [toks[j % len(toks)] for j in range(i, min(i + 512, args.context))]
            ctx.decode(llama.Batch(tokens=part, pos=list(range(i, i + len(part))), seq_ids=[[s]] * len(part)))
    for c in _compiled(ctx):
        c.reset_profile()
    t0 = time.perf_counter()
    if args.prompt:
        for i in range(0, args.prompt, 512):   # ubatches of 512, as llama-bench's pp runs them
            ctx.decode(llama.Batch.from_tokens(toks[i:min(i + 512, args.prompt)]))
        steps = 1
    else:
        for i in range(args.tokens):
            step(9 + i)
        steps = args.tokens
    wall = (time.perf_counter() - t0) / steps
    ghz = tsc_ghz()
    per_op: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    nodes = []
    per_thread = np.zeros((args.threads, 2))
    for c in _compiled(ctx):
        for node, cyc in c.profile():
            per_thread += cyc[:args.threads] / ghz / 1e3 / steps
            k_us, b_us = (cyc[0] / ghz / 1e3 / steps).tolist()
            if k_us == 0 and b_us == 0:
                continue
            key = node.op if node.op != "mul_mat" else f"mul_mat {node.src[0].type.name}"
            acc = per_op[key]
            acc[0] += k_us
            acc[1] += b_us
            acc[2] += 1
            nodes.append((k_us + b_us, k_us, b_us, node))
    native = sum(a[0] + a[1] for a in per_op.values())
    ops = {k: {"kernel_us": round(v[0], 1), "barrier_us": round(v[1], 1), "nodes": v[2],
               "share": round((v[0] + v[1]) / (wall * 1e6), 3)}
           for k, v in sorted(per_op.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))}
    nodes.sort(key=lambda x: -x[0])
    top = [{"node": n.name, "op": n.op, "ne": " x ".join(str(d) for d in n.ne),
            "src0": n.src[0].type.name if n.src else "", "kernel_us": round(k, 2), "barrier_us": round(b, 2)}
           for _, k, b, n in nodes[:args.top]]
    print(json.dumps({"model": model.path.name, "threads": args.threads,
                      "mode": f"prompt {args.prompt}" if args.prompt else
                      f"decode, {n} sequence(s)" + (f" of {args.context} tokens" if args.context else ""),
                      "step_us": round(wall * 1e6, 1), "native_us": round(native, 1),
                      "outside_native_us": round(wall * 1e6 - native, 1), "tsc_ghz": round(ghz, 3),
                      # every thread's kernel and barrier time: a thread that computes longer
                      # than the others (a neighbour on its core) shows as the others' waits
                      "per_thread": [{"kernel_us": round(k, 1), "barrier_us": round(w, 1)}
                                     for k, w in per_thread.tolist()],
                      "per_op": ops, "top_nodes": top}, indent=1))


if __name__ == "__main__":
    main()
