"""Software prefetch distances of the repacked quantised products, A/B in one process.

For each distance, the same DRAM-resident weight (several copies: one per distance and
token count, so nothing stays in L3) is multiplied by 1 and by N tokens; the runs are
interleaved round after round and each keeps its best time, so a neighbour's load hits
every variant alike. This is how qrepacked.PREFETCH_AHEAD was chosen per type
(bench/prefetch_model_ab.py: the same in a whole model's decode).

    python bench/prefetch_ab.py --type Q4_1 --ahead 0,2048,4096,8192 --tokens 1,4

Prints JSON: per distance and token count, the best ms and the ratio to one token.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.kernels import qrepacked
from ggmlpy.codegen_cpu.kernels.qvec import flavour
from ggmlpy.ir.ops import OpCase, SrcSpec
from ggmlpy.ir.types import GGMLType
from ggmlpy.options import Options
from ggmlpy.sched.store import TensorStore
from ggmlpy.testing.ops import build_case_graph, make_inputs


def _case(t: GGMLType, k: int, m: int, n: int) -> OpCase:
    return OpCase((SrcSpec(t, (k, m, 1, 1), weight=True), SrcSpec(GGMLType.F32, (k, n, 1, 1))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--type", default="Q4_1")
    ap.add_argument("-k", type=int, default=2048)
    ap.add_argument("-m", type=int, default=16384, help="rows (16384 x 2048 Q4_1: 21 MB a copy)")
    ap.add_argument("--ahead", default="0,2048,4096,8192", help="prefetch distances in bytes (0: none)")
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--min-tokens", type=int, default=None,
                    help="smallest tile that prefetches (1: one-token decode too; default: the "
                         "host flavour's, qrepacked.PREFETCH_MIN_TOKENS)")
    args = ap.parse_args()
    t = GGMLType[args.type]
    aheads = [int(a) for a in args.ahead.split(",")]
    tokens = [int(n) for n in args.tokens.split(",")]
    inputs = make_inputs(_case(t, args.k, args.m, max(tokens)), np.random.default_rng(0))
    runs = {}
    qdot = Options.from_env().cpu_qdot or flavour()   # the kernels' flavour (GGMLPY_CPU_QDOT)
    saved, saved_min = dict(qrepacked.PREFETCH_AHEAD), dict(qrepacked.PREFETCH_MIN_TOKENS)
    if args.min_tokens is None:
        args.min_tokens = saved_min[qdot]
    qrepacked.PREFETCH_MIN_TOKENS[qdot] = args.min_tokens
    try:
        for ahead in aheads:
            qrepacked.PREFETCH_AHEAD[t] = ahead   # read when the kernel's IR is built
            # a cache of its own: plan keys do not see this setting
            backend = CpuBackend(n_threads=args.threads, options=Options(cache_dir=tempfile.mkdtemp()))
            for n in tokens:
                graph, _ = build_case_graph("mul_mat", _case(t, args.k, args.m, n))
                store = TensorStore({"src0": inputs["src0"],
                                     "src1": np.ascontiguousarray(inputs["src1"][..., :n, :])})
                split = backend.compile(graph, graph.nodes)
                split.run(store, {})
                runs[(ahead, n)] = (split, store)
    finally:
        qrepacked.PREFETCH_AHEAD.clear()
        qrepacked.PREFETCH_AHEAD.update(saved)
        qrepacked.PREFETCH_MIN_TOKENS.update(saved_min)
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.rounds):
        for key, (split, store) in runs.items():
            t0 = time.perf_counter()
            split.run(store, {})
            best[key] = min(best[key], time.perf_counter() - t0)
    out = {"type": t.name, "flavour": qdot, "k": args.k, "m": args.m, "threads": args.threads, "min_tokens": args.min_tokens,
           "weight_mb": round(inputs["src0"].nbytes / 1e6, 1), "results": []}
    for ahead in aheads:
        one = best[(ahead, tokens[0])]
        out["results"].append({"ahead": ahead, **{f"{n}_ms": round(best[(ahead, n)] * 1e3, 3) for n in tokens},
                               **{f"{n}_over_{tokens[0]}": round(best[(ahead, n)] / one, 2) for n in tokens[1:]}})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
