"""Software prefetch settings of the repacked products, A/B in a whole model's decode.

Each variant changes qrepacked's tables (PREFETCH_AHEAD per type, PREFETCH_MIN_TOKENS for
the host's dot flavour) before its context compiles, into an object cache of its own (plan
keys follow the generator's source, not these tables). All contexts share the model's
repacked weights, so every variant reads the same memory; bursts of one-token decode steps
alternate between them, round after round, in both orders, so a neighbour's load hits every
variant alike. bench/prefetch_ab.py does the same for one product alone.

    python bench/prefetch_model_ab.py -m gemma3-270m -v base: -v q8off:Q8_0=0 -v kq:Q4_K=4096,Q6_K=4096
    python bench/prefetch_model_ab.py -v base: -v one-token-off:min=2

A variant is NAME:SETTINGS, SETTINGS a comma-separated list of TYPE=BYTES (0: no prefetch
for that type), far.TYPE=BYTES (the streaming prefetch, qrepacked.PREFETCH_FAR) and min=N (the smallest prefetching tile), empty for the tables as they are.
Prints JSON: per variant the median and best tokens/s and the ratio of its median to the
first variant's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import llama
from ggmlpy.ir.types import GGMLType
from ggmlpy.options import Options

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefetch_ab import kernel_flavour, prefetch_tables  # noqa: E402  (the same tables, set the same way)

PROMPT = list(range(100, 108))


@dataclass
class Variant:
    name: str
    ahead: dict[GGMLType, int] = field(default_factory=dict)   # the prefetch distances to set
    far: dict[GGMLType, int] = field(default_factory=dict)     # the streaming prefetch's
    min_tokens: int | None = None                              # the smallest prefetching tile


def parse_variant(text: str) -> Variant:
    """NAME:TYPE=BYTES,...,far.TYPE=BYTES,...,min=N -> a Variant."""
    name, _, settings = text.partition(":")
    variant = Variant(name)
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        if key == "min":
            variant.min_tokens = int(value)
        elif key.startswith("far."):
            variant.far[GGMLType[key.removeprefix("far.")]] = int(value)
        else:
            variant.ahead[GGMLType[key]] = int(value)
    return variant


def make_context(model: llama.Model, variant: Variant, threads: int) -> llama.Context:
    """A context whose kernels are built with the variant's tables (prefetch_tables)."""
    # A fresh cache, so the variant's tables are compiled; removed once the kernels are loaded.
    with prefetch_tables(variant.ahead, variant.min_tokens, variant.far), tempfile.TemporaryDirectory(prefix="ggmlpy-pf-") as cache:
        ctx = llama.Context(model, n_ctx=1024, n_threads=threads,
                            backend_options=Options(cache_dir=cache))
        assert ctx.decode(llama.Batch.from_tokens(PROMPT)) == 0   # compiles, with these tables
        for _ in range(3):
            assert ctx.decode(llama.Batch.from_tokens([5])) == 0
    return ctx


def burst(ctx: llama.Context, steps: int) -> float:
    """Seconds per one-token decode step over `steps` steps after the prompt."""
    ctx.memory.seq_rm(0, len(PROMPT), -1)
    t0 = time.perf_counter()
    for i in range(steps):
        assert ctx.decode(llama.Batch.from_tokens([5 + i])) == 0
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-v", "--variant", action="append", required=True, help="NAME:TYPE=BYTES,...,min=N")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32, help="decode steps per burst")
    args = ap.parse_args()
    model = llama.Model.load(args.model)
    variants = [parse_variant(v) for v in args.variant]
    ctxs = {v.name: make_context(model, v, args.threads) for v in variants}
    times: dict[str, list[float]] = {name: [] for name in ctxs}
    for rnd in range(args.rounds):
        order = list(ctxs) if rnd % 2 == 0 else list(reversed(ctxs))
        for name in order:
            times[name].append(burst(ctxs[name], args.steps))
    first = statistics.median(times[variants[0].name])
    print(json.dumps({
        "model": args.model, "flavour": kernel_flavour(), "threads": args.threads, "rounds": args.rounds,
        "variants": [{"name": name, "tok_s_median": round(1 / statistics.median(t), 1),
                      "tok_s_best": round(1 / min(t), 1), "vs_first": round(first / statistics.median(t), 3)}
                     for name, t in times.items()]}, indent=1))


if __name__ == "__main__":
    main()
