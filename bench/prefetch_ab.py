"""Software prefetch distances of the repacked quantised products, A/B in one process.

For each distance, one graph multiplies the activations by a chain of distinct copies of
the same weight (together more than the last-level cache, so every product streams its
weight from DRAM), once for 1 token and once for N. The variants take turns round after
round, so a neighbour's load hits each alike; each turn is a burst of runs of which only
the second half is timed, because each variant's backend has a thread pool of its own whose
idle workers spin (then sched_yield) for milliseconds after their last run: timing runs one
after another across variants measured one variant in four up to 2x slower, by its position
alone. This is how qrepacked.PREFETCH_AHEAD was chosen per type (bench/prefetch_model_ab.py:
the same in a whole model's decode).

    python bench/prefetch_ab.py --type Q4_1 --ahead 0,2048,4096,8192 --tokens 1,4

Prints JSON: per distance and token count, the best ms per product (one weight copy) and
its GB/s, and the ratio to the first token count.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from typing import Iterator, Mapping

import numpy as np

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.kernels import qrepacked
from ggmlpy.codegen_cpu.kernels.qvec import flavour
from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.types import GGMLType
from ggmlpy.options import Options
from ggmlpy.quants import quantize
from ggmlpy.quants.quant import REQUIRES_IMATRIX
from ggmlpy.sched.store import TensorStore


def kernel_flavour() -> str:
    """The dot flavour kernels are built with (GGMLPY_CPU_QDOT, else the host's best)."""
    return Options.from_env().cpu_qdot or flavour()


@contextlib.contextmanager
def prefetch_tables(ahead: Mapping[GGMLType, int], min_tokens: int | None,
                    far: Mapping[GGMLType, int] | None = None) -> Iterator[None]:
    """qrepacked's prefetch tables changed while kernels are built inside (bytes ahead per
    type, 0 for none; the smallest prefetching tile of the kernels' flavour, None: as it
    is; `far`: the streaming prefetch's distances for the kernels' flavour, 0 for none,
    a type left out as it is), restored afterwards. The tables are not part of plan keys: give each setting an
    object cache of its own."""
    saved_ahead, saved_min = dict(qrepacked.PREFETCH_AHEAD), dict(qrepacked.PREFETCH_MIN_TOKENS)
    saved_far = {f: dict(table) for f, table in qrepacked.PREFETCH_FAR.items()}
    try:
        far_table = qrepacked.PREFETCH_FAR.setdefault(kernel_flavour(), {})
        for t, n in (far or {}).items():   # the far prefetch of the kernels' flavour
            if n:
                far_table[t] = n
            else:
                far_table.pop(t, None)
        for t, n in ahead.items():
            if n:
                qrepacked.PREFETCH_AHEAD[t] = n
            else:
                qrepacked.PREFETCH_AHEAD.pop(t, None)
        if min_tokens is not None:
            qrepacked.PREFETCH_MIN_TOKENS[kernel_flavour()] = min_tokens
        yield
    finally:
        qrepacked.PREFETCH_AHEAD.clear()
        qrepacked.PREFETCH_AHEAD.update(saved_ahead)
        qrepacked.PREFETCH_FAR.clear()
        qrepacked.PREFETCH_FAR.update(saved_far)
        qrepacked.PREFETCH_MIN_TOKENS.clear()
        qrepacked.PREFETCH_MIN_TOKENS.update(saved_min)


def chain_graph(t: GGMLType, k: int, m: int, n: int, copies: int) -> Graph:
    """`copies` products of the same activations x (k x n), each by a weight of its own."""
    b = GraphBuilder()
    x = b.input("x", GGMLType.F32, (k, n, 1, 1))
    return b.build([b.make("mul_mat", (b.weight(f"w{i}", t, (k, m, 1, 1)), x)) for i in range(copies)])


def burst_best(split, store: TensorStore, seconds: float) -> float:
    """The best run of a burst `seconds` long, timing only its second half (see above)."""
    start = time.perf_counter()
    best = float("inf")
    while True:
        t0 = time.perf_counter()
        split.run(store, {})
        t1 = time.perf_counter()
        if t0 - start >= seconds / 2:
            best = min(best, t1 - t0)
        if t1 - start >= seconds:
            return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--type", default="Q4_1")
    ap.add_argument("-k", type=int, default=2048)
    ap.add_argument("-m", type=int, default=4096, help="rows (4096 x 2048 Q4_1: 5.2 MB a copy)")
    ap.add_argument("--chain-mb", type=float, default=48.0, help="weight copies per graph, in MB (> L3)")
    ap.add_argument("--ahead", default="0,2048,4096,8192",
                    help="prefetch distances in bytes (0: none); NEAR+FAR adds the streaming prefetch "
                         "FAR bytes ahead (NEAR alone: none)")
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--burst-ms", type=float, default=200.0,
                    help="each variant runs this long per round; only its second half is timed")
    ap.add_argument("--min-tokens", type=int, default=None,
                    help="smallest tile that prefetches (1: one-token decode too; default: the "
                         "flavour's own, qrepacked.PREFETCH_MIN_TOKENS)")
    args = ap.parse_args()
    t = GGMLType[args.type]
    aheads = args.ahead.split(",")
    tokens = [int(n) for n in args.tokens.split(",")]
    rng = np.random.default_rng(0)
    imatrix = np.ones(args.k, np.float32) if t in REQUIRES_IMATRIX else None   # the types that need one
    weight = np.ascontiguousarray(quantize(rng.standard_normal((args.m, args.k)).astype(np.float32), t, imatrix))
    copies = max(1, round(args.chain_mb * 1e6 / weight.nbytes))
    xs = {n: rng.standard_normal((n, args.k)).astype(np.float32) for n in tokens}
    qdot = kernel_flavour()
    if args.min_tokens is None:
        args.min_tokens = qrepacked.PREFETCH_MIN_TOKENS[qdot]
    runs = {}
    for ahead in aheads:
        # a cache of its own per distance: plan keys do not see the tables
        backend = CpuBackend(n_threads=args.threads, options=Options(cache_dir=tempfile.mkdtemp()))
        near, _, far = ahead.partition("+")
        with prefetch_tables({t: int(near)}, args.min_tokens, {t: int(far or 0)}):   # read when the IR is built
            for n in tokens:
                graph = chain_graph(t, args.k, args.m, n, copies)
                store = TensorStore({"x": xs[n], **{f"w{i}": weight.copy() for i in range(copies)}})
                split = backend.compile(graph, graph.nodes)
                split.run(store, {})
                runs[(ahead, n)] = (split, store)
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.rounds):
        for key, (split, store) in runs.items():
            best[key] = min(best[key], burst_best(split, store, args.burst_ms / 1e3) / copies)
    out = {"type": t.name, "flavour": qdot, "k": args.k, "m": args.m, "threads": args.threads,
           "min_tokens": args.min_tokens, "weight_mb": round(weight.nbytes / 1e6, 1), "copies": copies, "results": []}
    for ahead in aheads:
        one = best[(ahead, tokens[0])]
        out["results"].append({"ahead": ahead, **{f"{n}_ms": round(best[(ahead, n)] * 1e3, 3) for n in tokens},
                               **{f"{n}_gb_s": round(weight.nbytes / best[(ahead, n)] / 1e9, 1) for n in tokens},
                               **{f"{n}_over_{tokens[0]}": round(best[(ahead, n)] / one, 2) for n in tokens[1:]}})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
