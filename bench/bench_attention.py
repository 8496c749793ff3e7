"""The attention of a decode step alone (K.q, masked softmax, V.p; the model's own ops and
passes, so the fused kernels), per layer, with its K/V cache in cache or in DRAM; prints JSON.

In a model the attention runs right after the layer's weights streamed through, so its K
and V rows come from DRAM; here `--flush MB` streams that much memory before each timed
run (0: everything stays in cache). `--layout blocks` gives each token of the step its own
sequence, whose cells lie in 64-cell blocks interleaved with the others' (as
`llama/kv_cells.py` places the sequences of a server step); `shared` lets every token see
the same first cells (one sequence's K/V read for all of them). SmolLM2-135M's shapes: 9
query heads over 3 K/V heads of 64, f16 cache, 30 layers of distinct caches.

    python bench/bench_attention.py --tokens 1,4 --visible 100,400 --flush 0,96

Every variant of one invocation runs in this process, one after another; each reports the
best and the median of its runs (µs per layer).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.types import GGMLType
from ggmlpy.codegen_cpu.fusion import CPU_RULES
from ggmlpy.passes.pipeline import run_pipeline
from ggmlpy.sched.store import TensorStore

HEAD_DIM, N_HEAD, N_HEAD_KV, LAYERS, CELLS, BLOCK = 64, 9, 3, 30, 4096, 64


def build(n_tok: int, n_kv: int):
    """LAYERS attention blocks in a chain (each layer's output is the next one's queries)."""
    b = GraphBuilder()
    q = b.input("q", GGMLType.F32, (HEAD_DIM, N_HEAD, n_tok, 1))
    mask = b.input("mask", GGMLType.F32, (n_kv, n_tok, 1, 1))
    cur, caches = q, []
    for il in range(LAYERS):
        ck = b.cache(f"cache_k_l{il}", GGMLType.F16, (HEAD_DIM * N_HEAD_KV, CELLS))
        cv = b.cache(f"cache_v_l{il}", GGMLType.F16, (HEAD_DIM * N_HEAD_KV, CELLS))
        caches += [ck, cv]
        k = b.permute(b.view(ck, (HEAD_DIM, N_HEAD_KV, n_kv), (2 * HEAD_DIM, ck.nb[1])), 0, 2, 1, 3)
        v = b.permute(b.view(cv, (HEAD_DIM, N_HEAD_KV, n_kv), (2 * HEAD_DIM, cv.nb[1])), 1, 2, 0, 3)
        kq = b.soft_max_ext(b.mul_mat(k, b.permute(cur, 0, 2, 1, 3)), mask, HEAD_DIM ** -0.5, 0.0)
        cur = b.cont(b.permute(b.mul_mat(v, kq), 0, 2, 1, 3), HEAD_DIM, N_HEAD, n_tok, 1)
    return b.build([cur]), caches


def mask_rows(n_tok: int, n_kv: int, visible: int, layout: str) -> np.ndarray:
    """0 where token t sees cell j, -inf elsewhere."""
    mask = np.full((n_tok, n_kv), -np.inf, np.float32)
    for t in range(n_tok):
        if layout == "blocks":   # sequence t owns blocks t, t + n_tok, t + 2 n_tok, ...
            cells = [blk * BLOCK + c for blk in range(t, n_kv // BLOCK, n_tok) for c in range(BLOCK)]
        elif layout == "runs":   # sequence t owns one run of n_kv / n_tok cells
            cells = list(range(t * (n_kv // n_tok), (t + 1) * (n_kv // n_tok)))
        else:
            cells = list(range(n_kv))
        mask[t, cells[:visible]] = 0.0
    return mask


def cache_array(rng, huge: bool) -> np.ndarray:
    """One layer's K or V cache (random f16), in 2 MB pages when `huge` (madvise; the
    kernel gives them only where transparent huge pages are enabled for madvise)."""
    shape = (CELLS, HEAD_DIM * N_HEAD_KV)
    if not huge:
        return rng.standard_normal(shape).astype(np.float16)
    import ctypes
    page = 2 << 20
    n = CELLS * HEAD_DIM * N_HEAD_KV * 2
    raw = np.empty(n + page, np.uint8)
    buf = raw[(-raw.ctypes.data) % page:][:n]
    ctypes.CDLL(None).madvise(ctypes.c_void_p(buf.ctypes.data), ctypes.c_size_t(-(-n // page) * page), 14)
    out = buf.view(np.float16).reshape(shape)
    out[...] = rng.standard_normal(shape)
    return out


def measure(n_tok: int, visible: int, layout: str, flush_mb: int, threads: int, runs: int,
            huge: bool = False) -> dict:
    per_seq = -(-visible // BLOCK) * BLOCK
    n_kv = -(-(per_seq * (1 if layout == "shared" else n_tok)) // 256) * 256
    graph, caches = build(n_tok, n_kv)
    optimized = run_pipeline(graph, "cpu", rules=CPU_RULES).graph
    backend = CpuBackend(n_threads=threads, worst_env={"n_tokens": n_tok, "n_kv": n_kv, "n_outputs": n_tok})
    split = backend.compile(optimized, optimized.nodes)
    rng = np.random.default_rng(0)
    bindings = {"q": rng.standard_normal((n_tok, N_HEAD, HEAD_DIM)).astype(np.float32),
                "mask": mask_rows(n_tok, n_kv, visible, layout)}
    for c in caches:
        bindings[c.name] = cache_array(rng, huge)
    store = TensorStore(bindings)
    flush = np.ones(flush_mb * 250_000, np.float32) if flush_mb else None
    split.run(store, {})
    times = []
    for _ in range(runs):
        if flush is not None:
            flush.sum()   # stream flush_mb through the caches, as a layer's weights do
        times.append(_timed(lambda: split.run(store, {})))
    times.sort()
    return {"tokens": n_tok, "visible": visible, "layout": layout, "n_kv": n_kv, "flush_mb": flush_mb, "huge": huge,
            "kv_kb_per_layer": round(2 * visible * (1 if layout == "shared" else n_tok) * 2 * HEAD_DIM * N_HEAD_KV / 1024, 1),
            "us_per_layer_best": round(times[0] / LAYERS * 1e6, 2),
            "us_per_layer_median": round(times[len(times) // 2] / LAYERS * 1e6, 2)}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,4", help="tokens of the step (one sequence each with --layout blocks)")
    ap.add_argument("--visible", default="100", help="cells each token sees")
    ap.add_argument("--layout", default="blocks", choices=("blocks", "runs", "shared"))
    ap.add_argument("--flush", default="0,96", help="MB streamed before each run (0: hot)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--huge", default="0", help="0, 1 or 0,1: the caches in 2 MB pages (alternated)")
    args = ap.parse_args()
    rows = [measure(n, v, args.layout if n > 1 else "shared", f, args.threads, args.runs, bool(h))
            for f in map(int, args.flush.split(",")) for v in map(int, args.visible.split(","))
            for n in map(int, args.tokens.split(",")) for h in map(int, args.huge.split(","))]
    print(json.dumps({"threads": args.threads, "layers": LAYERS, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
