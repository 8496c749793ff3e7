"""`ggmlpy bench`: pp512 / tg128 tokens per second, start-up times, memory (see ggmlpy.cli.bench_run)."""
from __future__ import annotations

import argparse
import json

from ggmlpy.cli.cache_args import add_cache_args, cache_kwargs
from ggmlpy.cli.placement_args import add_placement_args, load_kwargs
from ggmlpy.hub import DEFAULT_MODEL


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="llama-bench style speed and memory figures")
    p.add_argument("-m", "--model", default=DEFAULT_MODEL, help="GGUF path or known model name")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--backend", default=None, help="backend name (default: the best available)")
    p.add_argument("-r", "--reps", type=int, default=3, help="timed repetitions after one warm-up")
    p.add_argument("-p", "--n-prompt", type=int, default=512)
    p.add_argument("-n", "--n-gen", type=int, default=128)
    p.add_argument("-d", "--depth", type=int, default=0,
                   help="also decode n-gen tokens after a prompt of this many (tg at depth, llama-bench's -d)")
    p.add_argument("--no-start-times", action="store_true", help="skip the cold/warm start subprocesses")
    p.add_argument("--batched", default="1,2,4,8", type=_counts,
                   help="sequence counts for batched decode (tg128_batched), comma-separated; '' skips it")
    p.add_argument("--json", action="store_true", help="print one JSON object (the default output too)")
    add_placement_args(p)
    add_cache_args(p)
    p.set_defaults(func=run)


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batched takes comma-separated counts, got {text!r}") from None
    if any(not 1 <= c <= 64 for c in counts):
        raise argparse.ArgumentTypeError(f"--batched counts must be in [1, 64], got {text!r}")
    return counts


def run(args: argparse.Namespace) -> int:
    from ggmlpy.cli.bench_run import run_bench

    if args.threads < 1 or args.reps < 1 or args.n_prompt < 1 or args.n_gen < 1 or args.depth < 0:
        raise ValueError("threads, reps, n-prompt and n-gen must be positive, depth at least 0")
    result = run_bench(args.model, threads=args.threads, backend=args.backend, n_prompt=args.n_prompt,
                       n_gen=args.n_gen, reps=args.reps, start_times=not args.no_start_times, batched=args.batched,
                       depth=args.depth, kv=cache_kwargs(args), **load_kwargs(args))
    print(json.dumps(result))
    return 0
