"""Regenerate data/ggml_quant_cases.npz: ggml's own outputs for the block formats that ggml
alone can vouch for (the I-quants, the ternary types, NVFP4, Q1_0, Q2_0), which the tests
compare ggmlpy against without needing ggml.

- `dq_in_<T>` / `dq_out_<T>`: blocks built to reach every grid index, sign pattern, sub-block
  scale and E4M3 scale byte of type T (the rest random bytes, the fp16 scales finite values
  of every sign and size, zeros and subnormals included), and what ggml's to_float
  (dequantize_row_*) makes of them.
- `q_x` (rows of every kind: signs, tails, zeros, exact zero sub-blocks inside live blocks,
  tiny and large magnitudes) and `q_x_huge` (magnitudes near 1e30, which ggml's grid searches
  cannot take: their squares overflow and ggml aborts); `q_ref_<T>`: the bytes of ggml's
  from_float_ref (quantize_row_*_ref) for the rows of `q_x` (and `q_x_huge` but for the grid
  types), `q_chunk_<T>` those of ggml_quantize_chunk without an importance matrix (what
  llama-quantize writes), stored only where they differ from `q_ref_<T>`.
- `q_imatrix` (four importance matrices for the rows of `q_x`) and `q_im_<T>`: the bytes of
  ggml_quantize_chunk for `q_x` with each of them, for every type whose quantiser uses one;
  `q_chunk_IQ1_M` IQ1_M's without one (it has no quantize_row_*_ref).

Not a test and not a dependency of the project. It needs a libggml-base.so built from the
llama.cpp vendored by llama-cpp-python 0.3.36 (ggml's CMake Release build):

    .venv/bin/python tests/ggmlpy/quants/make_ggml_quant_cases.py PATH/build/bin/libggml-base.so
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from ggmlpy.ir.types import GGMLType, block_size, type_size  # noqa: E402
from ggmlpy.quants import block_dtype  # noqa: E402

T = GGMLType
OUT = HERE / "data" / "ggml_quant_cases.npz"
DEQUANT_TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ3_XXS, T.IQ1_S, T.IQ4_NL, T.IQ3_S, T.IQ2_S, T.IQ4_XS,
                 T.IQ1_M, T.TQ1_0, T.TQ2_0, T.NVFP4, T.Q1_0, T.Q2_0]
QUANT_TYPES = [T.IQ3_XXS, T.IQ4_NL, T.IQ3_S, T.IQ2_S, T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.NVFP4, T.Q1_0, T.Q2_0]
GRID_TYPES = {T.IQ3_XXS, T.IQ3_S, T.IQ2_S}   # ggml aborts on inputs whose squares overflow
# the types whose quantize_* weigh by an importance matrix (q_im_<T>: their bytes with one)
IMATRIX_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS,
                 T.IQ3_XXS, T.IQ3_S, T.IQ2_S, T.IQ2_XXS, T.IQ2_XS, T.IQ1_S, T.IQ1_M]


class Ggml:
    """ggml's type traits and ggml_quantize_chunk through ctypes (ggml.h's signatures)."""

    _FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

    class Traits(ctypes.Structure):
        _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                    ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                    ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                    ("from_float_ref", ctypes.c_void_p)]

    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        self.lib.ggml_get_type_traits.restype = ctypes.POINTER(self.Traits)
        self.lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        self.lib.ggml_quantize_init.argtypes = [ctypes.c_int]
        self.lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        self.lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                                 ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]

    def _fn(self, t: GGMLType, name: str):
        ptr = getattr(self.lib.ggml_get_type_traits(int(t)).contents, name)
        if not ptr:
            raise SystemExit(f"ggml has no {name} for {t.name}")
        return self._FN(ptr)

    def to_float(self, t: GGMLType, raw: np.ndarray) -> np.ndarray:
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        out = np.empty(raw.size // type_size(t) * block_size(t), dtype=np.float32)
        self._fn(t, "to_float")(raw.ctypes.data, out.ctypes.data, out.size)
        return out

    def from_float_ref(self, t: GGMLType, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros(x.size // block_size(t) * type_size(t), dtype=np.uint8)
        self.lib.ggml_quantize_init(int(t))     # the grid types' tables
        self._fn(t, "from_float_ref")(x.ctypes.data, out.ctypes.data, x.size)
        return out

    def quantize_chunk(self, t: GGMLType, x: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros(x.size // block_size(t) * type_size(t), dtype=np.uint8)
        im = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
        self.lib.ggml_quantize_chunk(int(t), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1],
                                     None if im is None else im.ctypes.data)
        return out


def every(count: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values 0 .. count-1, each at least once, in random order over `shape`."""
    n = int(np.prod(shape))
    assert n >= count, (count, shape)
    return rng.permutation(np.resize(np.arange(count), n)).reshape(shape)


def scales_f16(n: int, rng: np.random.Generator) -> np.ndarray:
    """Finite fp16 scales of both signs over many magnitudes, led by the corner cases."""
    d = (rng.standard_normal(n) * np.exp(rng.uniform(-12, 2, n))).astype(np.float16)
    d[rng.random(n) < 0.05] = 0.0
    special = np.array([0.0, -0.0, 65504.0, -6e-8, 1.0, -1.0], dtype=np.float16)
    d[:len(special)] = special[:n]
    return d


def _nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (lo | (hi << 4)).astype(np.uint8)


def _sign_words(signs: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Words of four 7-bit sign fields and a 4-bit scale on top (IQ2_XXS, IQ3_XXS)."""
    fields = (signs.astype(np.uint32) << np.array([0, 7, 14, 21], np.uint32)).sum(axis=2, dtype=np.uint32)
    return fields | (scales.astype(np.uint32) << 28)


def coverage_blocks(t: GGMLType, rng: np.random.Generator) -> np.ndarray:
    """Blocks of t whose fields reach every value they can hold (see the module docstring)."""
    nb = {T.IQ2_XXS: 16, T.IQ2_XS: 16, T.IQ2_S: 32, T.IQ3_XXS: 8, T.IQ3_S: 16, T.IQ1_S: 64, T.IQ1_M: 64,
          T.IQ4_NL: 16, T.IQ4_XS: 16, T.TQ1_0: 64, T.TQ2_0: 8, T.NVFP4: 64, T.Q1_0: 16, T.Q2_0: 16}[t]
    raw = rng.integers(0, 256, nb * type_size(t), dtype=np.uint8)
    blk = raw.view(block_dtype(t))
    if "d" in blk.dtype.names and blk.dtype["d"] == np.dtype("<f2"):
        blk["d"] = scales_f16(nb, rng)
    if t == T.IQ2_XXS:
        idx = every(256, (nb, 8, 4), rng).astype(np.uint8)
        signs = every(128, (nb, 8, 4), rng).astype(np.uint32)
        word = _sign_words(signs, every(16, (nb, 8), rng))
        qs = np.concatenate([idx, word.astype("<u4").view(np.uint8).reshape(nb, 8, 4)], axis=2)
        blk["qs"] = qs.reshape(nb, 64).view("<u2")
    elif t == T.IQ2_XS:
        blk["qs"] = every(512, (nb, 32), rng) | (every(128, (nb, 32), rng) << 9)
        blk["scales"] = _nibbles(every(16, (nb, 8), rng), every(16, (nb, 8), rng))
    elif t == T.IQ2_S:
        idx = every(1024, (nb, 32), rng)
        blk["qs"] = np.concatenate([idx & 255, every(256, (nb, 32), rng)], axis=1)
        blk["qh"] = ((idx >> 8).reshape(nb, 8, 4) << np.arange(0, 8, 2)).sum(axis=2)
        blk["scales"] = _nibbles(every(16, (nb, 8), rng), every(16, (nb, 8), rng))
    elif t == T.IQ3_XXS:
        signs = every(128, (nb, 8, 4), rng).astype(np.uint32)
        word = _sign_words(signs, every(16, (nb, 8), rng))
        blk["qs"] = np.concatenate([every(256, (nb, 64), rng), word.astype("<u4").view(np.uint8)], axis=1)
    elif t == T.IQ3_S:
        idx = every(512, (nb, 64), rng)
        blk["qs"] = idx & 255
        blk["qh"] = np.packbits((idx >> 8).astype(bool).reshape(nb, 8, 8), axis=2, bitorder="little")[:, :, 0]
        blk["signs"] = every(256, (nb, 32), rng)
        blk["scales"] = _nibbles(every(16, (nb, 4), rng), every(16, (nb, 4), rng))
    elif t == T.IQ1_S:
        idx = every(2048, (nb, 8, 4), rng)
        tops = ((idx >> 8) << np.array([0, 3, 6, 9])).sum(axis=2)
        blk["qs"] = (idx & 255).reshape(nb, 32)
        blk["qh"] = tops | (every(8, (nb, 8), rng) << 12) | (every(2, (nb, 8), rng) << 15)
    elif t == T.IQ1_M:
        idx = every(2048, (nb, 16, 2), rng)
        tops = (idx >> 8) | (every(2, (nb, 16, 2), rng) << 3)
        blk["qs"] = (idx & 255).reshape(nb, 32)
        blk["qh"] = _nibbles(tops[:, :, 0], tops[:, :, 1])
        d_bits = scales_f16(nb, rng).view(np.uint16).astype(np.int64)
        words = (every(8, (nb, 4, 4), rng) << np.array([0, 3, 6, 9])).sum(axis=2)
        words |= ((d_bits[:, None] >> (4 * np.arange(4))) & 15) << 12
        blk["scales"] = words.astype("<u2").view(np.uint8).reshape(nb, 8)
    elif t == T.IQ4_XS:
        ls = every(64, (nb, 8), rng)
        blk["scales_l"] = _nibbles(ls[:, 0::2] & 15, ls[:, 1::2] & 15)
        blk["scales_h"] = ((ls >> 4) << np.arange(0, 16, 2)).sum(axis=1)
    elif t == T.TQ1_0:
        blk["qs"] = every(256, (nb, 48), rng)
        blk["qh"] = every(256, (nb, 4), rng)
    elif t == T.NVFP4:
        blk["d"] = every(256, (nb, 4), rng)
    return raw


def _heavy(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_t(2, n) * 0.02


def quant_rows(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(q_x, q_x_huge): rows of 1024 (four 256-blocks, eight Q1_0 blocks)."""
    n = 1024
    holes = rng.standard_normal(n)
    for start, size in [(32, 32), (256 + 64, 32), (256 + 160, 32), (512 + 16, 16), (768, 32), (768 + 96, 16)]:
        holes[start:start + size] = 0.0      # whole sub-blocks of 16 or 32 inside live blocks
    sparse = rng.standard_normal(n)
    sparse[rng.random(n) < 0.7] = 0.0
    sparse[:256] = 0.0
    signed_zeros = np.where(rng.random(n) < 0.5, -0.0, 0.0)
    signed_zeros[::37] = rng.standard_normal(len(signed_zeros[::37]))
    rows = [rng.standard_normal(n), rng.uniform(-1, 1, n), rng.uniform(0, 1, n), -rng.uniform(0, 3, n),
            _heavy(rng, n), sparse, np.repeat(rng.standard_normal(n // 16), 16), rng.integers(-8, 8, n),
            rng.standard_normal(n) * 1e-30, rng.standard_normal(n) * 1e-6, rng.standard_normal(n) * 1e4,
            rng.standard_normal(n) * 1e8, np.zeros(n), holes, signed_zeros,
            rng.standard_normal(n) * np.repeat(10.0 ** rng.uniform(-3, 3, n // 256), 256)]
    huge = [rng.standard_normal(n) * 1e30, _heavy(rng, n) * 1e36]
    return np.array(rows, dtype=np.float32), np.array(huge, dtype=np.float32)


def importance_matrices(rng: np.random.Generator, n: int) -> np.ndarray:
    """Importance matrices for rows of n: log-normal, all ones, a third zeros among uniform
    values, and a spread over 40 orders of magnitude."""
    return np.array([np.exp(rng.standard_normal(n)), np.ones(n),
                     np.where(rng.random(n) < 0.3, 0.0, rng.random(n) * 5), np.exp(rng.uniform(-20, 20, n))],
                    dtype=np.float32)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("libggml_base", type=Path, help="libggml-base.so of the vendored llama.cpp")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    ggml = Ggml(args.libggml_base)
    rng = np.random.default_rng(20240611)
    data: dict[str, np.ndarray] = {}
    for t in DEQUANT_TYPES:
        raw = coverage_blocks(t, rng)
        data[f"dq_in_{t.name}"] = raw
        data[f"dq_out_{t.name}"] = ggml.to_float(t, raw)
    x, huge = quant_rows(rng)
    data["q_x"], data["q_x_huge"] = x, huge
    for t in QUANT_TYPES:
        rows = x if t in GRID_TYPES else np.concatenate([x, huge])
        ref = ggml.from_float_ref(t, rows)
        data[f"q_ref_{t.name}"] = ref
        chunk = ggml.quantize_chunk(t, rows)
        if not np.array_equal(chunk, ref):
            data[f"q_chunk_{t.name}"] = chunk
    imatrices = importance_matrices(np.random.default_rng(20261207), x.shape[1])
    data["q_imatrix"] = imatrices
    for t in IMATRIX_TYPES:   # ggml_quantize_chunk with each matrix (the grid types: no huge rows)
        data[f"q_im_{t.name}"] = np.stack([ggml.quantize_chunk(t, x, im) for im in imatrices])
    data["q_chunk_IQ1_M"] = ggml.quantize_chunk(T.IQ1_M, x)   # it has no _ref; without a matrix: x*x
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **data)
    print(f"{args.out}: {args.out.stat().st_size} bytes, {len(data)} arrays")


if __name__ == "__main__":
    main()
