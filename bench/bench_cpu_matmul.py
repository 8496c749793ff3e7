"""Quantised matrix products of the CPU backend next to numpy's f32 matmul; prints JSON.

For the matrix shapes of SmolLM2-135M (Q4_1, output Q8_0) and Gemma 3 270M (Q5_0, Q8_0,
Q4_K, Q6_K; and Q5_1, Q2_K and Q3_K at the shapes of its Q5_0 and Q4_K FFN, for comparison):
one compiled mul_mat graph per shape, run on random quantised weights.

- decode (n_tokens = 1): GB/s of quantised weights read, two ways, each a graph of many
  products (so Python's per-run cost is spread out, as in a model graph, with a barrier
  after each product): "hot" (16 products of one matrix: it stays in L2) and "chain"
  (products over distinct copies of the matrix, about a model's worth of weights: 96 MB);
- prefill (n_tokens = 512): GFLOP/s (2 * M * K * N per product).

numpy runs the same products in f32 (x @ W.T with W dequantised) in the same process, with
OpenBLAS limited to the same thread count; `vs_numpy` = numpy's time / ours (above 1: ours
is faster). Each figure is the best of --reps timings (the machine is shared and other
processes only ever slow a run down): read the ratios rather than the absolute figures.

Run: python bench/bench_cpu_matmul.py [--threads 1 2] [--reps 7] [--only smollm2]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (model, name, weight type, K, M)
SHAPES = [
    ("smollm2", "attn_q/o 576x576", "Q4_1", 576, 576),
    ("smollm2", "attn_k/v 576x192", "Q4_1", 576, 192),
    ("smollm2", "ffn_gate/up 576x1536", "Q4_1", 576, 1536),
    ("smollm2", "ffn_down 1536x576", "Q4_1", 1536, 576),
    ("smollm2", "output 576x49152", "Q8_0", 576, 49152),
    ("gemma3", "attn_q 640x1024", "Q5_0", 640, 1024),
    ("gemma3", "attn_k/v 640x256", "Q5_0", 640, 256),
    ("gemma3", "attn_v 640x256", "Q8_0", 640, 256),
    ("gemma3", "ffn_gate/up 640x2048", "Q5_0", 640, 2048),
    ("gemma3", "ffn_gate/up 640x2048", "Q5_1", 640, 2048),
    ("gemma3", "attn_out 1024x640", "Q4_K", 1024, 640),
    ("gemma3", "ffn_down 2048x640", "Q4_K", 2048, 640),
    ("gemma3", "ffn_down 2048x640", "Q3_K", 2048, 640),
    ("gemma3", "ffn_down 2048x640", "Q2_K", 2048, 640),
    ("gemma3", "ffn_down 2048x640", "Q6_K", 2048, 640),
    ("gemma3", "output 640x262144", "Q8_0", 640, 262144),
]
CHAIN_BYTES = 96_000_000  # about SmolLM2's weights read per token


def _best_time(fn, reps: int, inner: int = 1) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return min(times)


def _graph(wtype, k: int, m: int, n: int, products: int, distinct: bool):
    """`products` mul_mats of x, by distinct weight tensors or all by one."""
    from ggmlpy.ir.builder import GraphBuilder
    from ggmlpy.ir.types import GGMLType

    b = GraphBuilder()
    x = b.input("x", GGMLType.F32, (k, n, 1, 1))
    weights = [b.weight(f"w{i}", wtype, (k, m, 1, 1)) for i in range(products if distinct else 1)]
    outs = [b.make("mul_mat", (weights[i % len(weights)], x)) for i in range(products)]
    return b.build(outs)


def _weights(wtype, k: int, m: int, rng):
    import numpy as np

    from ggmlpy.quants import dequantize, quantize

    values = rng.standard_normal((m, k)).astype(np.float32)
    data = np.ascontiguousarray(quantize(values, wtype))
    return data, dequantize(data, wtype, (k, m, 1, 1)).reshape(m, k)


def _ours(wtype, k: int, m: int, n: int, products: int, distinct: bool, threads: int, reps: int,
          rng) -> float:
    """Seconds per product."""
    import numpy as np

    from ggmlpy.codegen_cpu.backend import CpuBackend
    from ggmlpy.sched.store import TensorStore

    graph = _graph(wtype, k, m, n, products, distinct)
    data, _ = _weights(wtype, k, m, rng)
    bindings = {f"w{i}": data.copy() for i in range(products if distinct else 1)}
    bindings["x"] = rng.standard_normal((n, k)).astype(np.float32)
    backend = CpuBackend(n_threads=threads, worst_env={"n_tokens": n, "n_kv": 1, "n_outputs": n})
    split = backend.compile(graph, graph.nodes)
    store = TensorStore(bindings)
    inner = max(1, int(2e-3 / max(1e-6, 2 * m * k * n * products / 50e9)))
    return _best_time(lambda: split.run(store, {}), reps, inner) / products


def _numpy(k: int, m: int, n: int, w, reps: int, rng) -> float:
    import numpy as np

    x = rng.standard_normal((n, k)).astype(np.float32)
    inner = max(1, int(2e-3 / max(1e-6, 2 * m * k * n / 50e9)))
    return _best_time(lambda: x @ w.T, reps, inner)


def run_one(threads: int, reps: int, only: str | None, match: str | None = None) -> dict:
    import numpy as np

    from ggmlpy.codegen_cpu.kernels.qvec import flavour
    from ggmlpy.ir.types import GGMLType, row_size

    rng = np.random.default_rng(0)
    rows = []
    for model, name, tname, k, m in SHAPES:
        if (only and model != only) or (match and match not in f"{name} {tname}"):
            continue
        wtype = GGMLType[tname]
        nbytes = row_size(wtype, k) * m
        _, w32 = _weights(wtype, k, m, rng)
        copies = max(1, min(256, CHAIN_BYTES // nbytes))
        t_hot = _ours(wtype, k, m, 1, 16, False, threads, reps, rng)
        t_chain = _ours(wtype, k, m, 1, copies, True, threads, max(3, reps // 2), rng)
        t_np1 = _numpy(k, m, 1, w32, reps, rng)
        n = 512
        t_pp = _ours(wtype, k, m, n, 1, False, threads, max(3, reps // 2), rng)
        t_nppp = _numpy(k, m, n, w32, max(3, reps // 2), rng)
        flops = 2.0 * m * k * n
        rows.append({
            "model": model, "matrix": name, "type": tname, "K": k, "M": m, "weight_mb": nbytes / 1e6,
            "decode_hot_gb_s": nbytes / t_hot / 1e9, "decode_chain_gb_s": nbytes / t_chain / 1e9,
            "decode_chain_copies": copies, "decode_us": t_hot * 1e6, "numpy_decode_us": t_np1 * 1e6,
            "decode_vs_numpy": t_np1 / t_hot,
            "prefill_gflop_s": flops / t_pp / 1e9, "numpy_prefill_gflop_s": flops / t_nppp / 1e9,
            "prefill_vs_numpy": t_nppp / t_pp,
        })
    return {"threads": threads, "flavour": flavour(), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", choices=["smollm2", "gemma3"], default=None)
    ap.add_argument("--match", default=None, help="only matrices whose 'name type' contains this")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_one(args.threads[0], args.reps, args.only, args.match)))
        return
    results = []
    for n in args.threads:  # a fresh process per thread count: OpenBLAS reads its limit at start
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n),
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, __file__, "--child", "--threads", str(n), "--reps", str(args.reps)]
        if args.only:
            cmd += ["--only", args.only]
        if args.match:
            cmd += ["--match", args.match]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    print(json.dumps({"machine": platform.processor() or platform.machine(), "runs": results}, indent=1))


if __name__ == "__main__":
    main()
