"""Dequantisation throughput of ggmlpy next to the `gguf` package; prints one JSON object.

For each tensor type found in the two real models: all tensors of that type in that model,
decoded by both libraries in the same run. For every other supported type: a synthetic
tensor of random blocks (finite random scales). Throughput is MB/s of float32 output, the
median of --reps repetitions; ratio = ggmlpy / gguf (above 1: ggmlpy is faster).

F32 is a zero-copy view in both libraries, so its "throughput" only measures per-call
argument checking; it is reported but left out of `min_ratio_decoding`.

Run: python bench/bench_dequant.py [--reps 5] [--synthetic-elements 4194304]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402

from ggmlpy.hub import resolve_model  # noqa: E402
from ggmlpy.ir.types import GGMLType, block_size, type_size  # noqa: E402
from ggmlpy.quants import block_dtype, dequantize  # noqa: E402

MODELS = ["smollm2-135m", "gemma3-270m"]
# gguf 0.19 has no decoder for Q8_1, Q8_K, Q1_0 and Q2_0; they are timed for ggmlpy alone
GGUF_DECODES = {GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1,
                GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K,
                GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.MXFP4, GGMLType.NVFP4,
                GGMLType.TQ1_0, GGMLType.TQ2_0, GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S,
                GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.IQ4_NL,
                GGMLType.IQ4_XS}
ALL_TYPES = sorted(GGUF_DECODES | {GGMLType.Q8_1, GGMLType.Q8_K, GGMLType.Q1_0, GGMLType.Q2_0})

Tensor = tuple[np.ndarray, tuple[int, ...]]  # (bytes, ggml shape)


def model_tensors(path: Path) -> dict[GGMLType, list[Tensor]]:
    """Tensors grouped by type: ggmlpy's reader, else the gguf package's."""
    groups: dict[GGMLType, list[Tensor]] = defaultdict(list)
    try:
        from ggmlpy.gguf import GGUFFile
        f = GGUFFile(path)
        for info in f.tensors.values():
            groups[GGMLType(info.type)].append((info.data, tuple(int(n) for n in info.ne)))
    except ImportError:
        from gguf import GGUFReader
        for t in GGUFReader(path).tensors:
            raw = np.ascontiguousarray(t.data).reshape(-1).view(np.uint8)
            groups[GGMLType(int(t.tensor_type))].append((raw, tuple(int(n) for n in t.shape)))
    return groups


def synthetic(t: GGMLType, n_elements: int, rng: np.random.Generator) -> Tensor:
    ne = (4096, n_elements // 4096)
    dt = block_dtype(t)
    n_blocks = n_elements // block_size(t)
    if t in (GGMLType.F32, GGMLType.F16):
        return rng.standard_normal(n_elements).astype(dt["v"]).view(np.uint8), ne
    raw = rng.integers(0, 256, n_blocks * dt.itemsize, dtype=np.uint8)
    blocks = raw.view(dt)
    for name in dt.names:
        if dt[name].kind == "f":
            blocks[name] = (rng.standard_normal(n_blocks) * 0.01).astype(dt[name])
    return raw, ne


def gguf_input(raw: np.ndarray, t: GGMLType, ne: tuple[int, ...]) -> np.ndarray:
    """The array gguf.quants.dequantize expects: rows of bytes, or typed floats."""
    rows = raw.reshape(-1, ne[0] // block_size(t) * type_size(t))
    if t == GGMLType.F32:
        return rows.view(np.float32)
    if t == GGMLType.F16:
        return rows.view(np.float16)
    return rows


def median_seconds(fn, reps: int) -> float:
    fn()  # warm up: page in the memory map, allocator
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(source: str, t: GGMLType, tensors: list[Tensor], reps: int) -> dict:
    out_mb = sum(int(np.prod(ne)) for _, ne in tensors) * 4 / 1e6
    ours = median_seconds(lambda: [dequantize(raw, t, ne) for raw, ne in tensors], reps)
    row = {"type": t.name, "source": source, "tensors": len(tensors), "output_mb": round(out_mb, 3),
           "ggmlpy_mb_s": round(out_mb / ours, 1)}
    if t in GGUF_DECODES:
        inputs = [gguf_input(raw, t, ne) for raw, ne in tensors]
        qtype = GGMLQuantizationType(int(t))
        theirs = median_seconds(lambda: [gguf_dequantize(x, qtype) for x in inputs], reps)
        row["gguf_mb_s"] = round(out_mb / theirs, 1)
        row["ratio"] = round(theirs / ours, 2)
    else:
        row["gguf_mb_s"] = None
        row["ratio"] = None
    if t == GGMLType.F32:
        row["note"] = "zero-copy view in both libraries: measures per-call overhead only"
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--synthetic-elements", type=int, default=1 << 22)
    args = ap.parse_args()
    rng = np.random.default_rng(0)

    results = []
    seen: set[GGMLType] = set()
    for name in MODELS:
        for t, tensors in sorted(model_tensors(resolve_model(name)).items()):
            results.append(measure(name, t, tensors, args.reps))
            seen.add(t)
    for t in ALL_TYPES:
        if t not in seen:
            tensor = synthetic(t, args.synthetic_elements, rng)
            results.append(measure("synthetic", t, [tensor], args.reps))

    decoding = [r["ratio"] for r in results if r["ratio"] is not None and r["type"] != "F32"]
    print(json.dumps({
        "benchmark": "dequantize",
        "unit": "MB/s of float32 output, median of reps",
        "reps": args.reps,
        "numpy": np.__version__,
        "machine": platform.processor() or platform.machine(),
        "results": results,
        "min_ratio_decoding": min(decoding) if decoding else None,
    }, indent=2))


if __name__ == "__main__":
    main()
