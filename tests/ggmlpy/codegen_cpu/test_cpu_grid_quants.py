"""The grid I-quants and ternary types on the CPU backend (kernels/qgrid.py) with blocks built
to reach every grid index and every sign pattern: random blocks reach most of a 2048-entry
grid only by chance, and a wrong table row or sign bit would hide in the ones they miss.

get_rows must give ggmlpy.quants.dequantize's values bit for bit (every conversion in the
kernels is exact, qgrid.py's docstring), and mul_mat must meet both of
test_cpu_quant_kernels.py's oracles, on every dot flavour the host runs.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cpu import repack_superblocks as superblocks
from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.kernels import qvec
from ggmlpy.codegen_cpu.kernels.qdot import KINDS
from ggmlpy.codegen_cpu.kernels.qgrid import GRID_KINDS, GridKind
from ggmlpy.codegen_cpu.kernels.qternary import TERNARY_KINDS
from ggmlpy.ir.ops import OpCase, SrcSpec
from ggmlpy.ir.types import GGMLType, block_size, type_size
from ggmlpy.quants import block_dtype, dequant_iq, dequantize
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.testing.ops import normalized_error, random_blocks, run_case

from .test_cpu_quant_kernels import EXACT_BAR, GGML_BAR, GRID, _flavours, _kernel_model

G = GGMLType
K = 512   # two super-blocks a row
# grid entries per type (qgrid's tables) and whether its signs are 7-bit fields (ksigns)
GRID_SIZE = {G.IQ2_XXS: 256, G.IQ2_XS: 512, G.IQ2_S: 1024, G.IQ3_XXS: 256, G.IQ3_S: 512, G.IQ1_S: 2048,
             G.IQ1_M: 2048}
SEVEN_BIT_SIGNS = (G.IQ2_XXS, G.IQ2_XS, G.IQ3_XXS)


def _groups(t: GGMLType) -> int:
    """Grid indices per block: one per 8 values, IQ3's one per 4."""
    return 64 if t in (G.IQ3_XXS, G.IQ3_S) else 32


def _field(raw: np.ndarray, t: GGMLType, name: str, nbytes: int, at: int = 0) -> np.ndarray:
    """Bytes at..at+nbytes of field `name` of every block (rows of raw), as a copy."""
    start = block_dtype(t).fields[name][1] + at
    return raw[:, start:start + nbytes].copy()


def _put(raw: np.ndarray, t: GGMLType, name: str, value: np.ndarray, at: int = 0) -> None:
    b = np.ascontiguousarray(value).view(np.uint8).reshape(len(raw), -1)
    start = block_dtype(t).fields[name][1] + at
    raw[:, start:start + b.shape[1]] = b


def _seven_bit_words(old: np.ndarray, fields: np.ndarray) -> np.ndarray:
    """Words (u32) whose low 28 bits are four 7-bit fields, keeping old's top 4 (the scale)."""
    w = old & np.uint32(0xF0000000)
    for l in range(4):
        w |= fields[..., l].astype(np.uint32) << np.uint32(7 * l)
    return w


def grid_blocks(t: GGMLType, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks (random_blocks) whose grid indices run through the whole grid, in a
    shuffled order, and whose sign fields through every pattern (7 or 8 bits), given enough
    blocks: (n_blocks, type_size) bytes."""
    raw = random_blocks(t, (n_blocks * block_size(t),), rng).reshape(n_blocks, type_size(t))
    n_g = n_blocks * _groups(t)
    idx = rng.permutation(np.arange(n_g) % GRID_SIZE[t]).reshape(n_blocks, -1).astype(np.uint16)
    n_s = n_blocks * 32
    signs = ((np.arange(n_s) * 37) % (128 if t in SEVEN_BIT_SIGNS else 256)).reshape(n_blocks, 32).astype(np.uint8)
    low = (idx & 255).astype(np.uint8)
    if t == G.IQ2_XXS:   # per 32 values: 4 index bytes, then a word of sign fields and the scale
        q = _field(raw, t, "qs", 64).reshape(n_blocks, 8, 8)
        q[:, :, :4] = low.reshape(n_blocks, 8, 4)
        words = np.ascontiguousarray(q[:, :, 4:]).view("<u4")[..., 0]
        q[:, :, 4:] = _seven_bit_words(words, signs.reshape(n_blocks, 8, 4))[..., None].view(np.uint8)
        _put(raw, t, "qs", q)
    elif t == G.IQ2_XS:
        _put(raw, t, "qs", (idx | (signs.astype(np.uint16) << 9)).astype("<u2"))
    elif t == G.IQ2_S:
        _put(raw, t, "qs", low)
        _put(raw, t, "qs", signs, at=32)
        high = ((idx >> 8) & 3).reshape(n_blocks, 8, 4) << np.arange(0, 8, 2, dtype=np.uint16)
        _put(raw, t, "qh", high.sum(axis=2).astype(np.uint8))
    elif t == G.IQ3_XXS:
        _put(raw, t, "qs", low)
        words = np.ascontiguousarray(_field(raw, t, "qs", 32, at=64)).view("<u4")
        _put(raw, t, "qs", _seven_bit_words(words, signs.reshape(n_blocks, 8, 4)), at=64)
    elif t == G.IQ3_S:
        _put(raw, t, "qs", low)
        _put(raw, t, "signs", signs)
        high = (idx >> 8).reshape(n_blocks, 8, 8) << np.arange(8, dtype=np.uint16)
        _put(raw, t, "qh", high.sum(axis=2).astype(np.uint8))
    elif t == G.IQ1_S:   # signs: none; the delta's sign (bit 15) stays random
        _put(raw, t, "qs", low)
        qh = np.ascontiguousarray(_field(raw, t, "qh", 16)).view("<u2")
        high = ((idx >> 8) & 7).reshape(n_blocks, 8, 4) << np.arange(0, 12, 3, dtype=np.uint16)
        _put(raw, t, "qh", ((qh & 0xF000) | high.sum(axis=2)).astype("<u2"))
    elif t == G.IQ1_M:   # a nibble per 8 values: bits 0-2 the index top, bit 3 (kept) the delta's sign
        _put(raw, t, "qs", low)
        nib = np.stack([_field(raw, t, "qh", 16) & 15, _field(raw, t, "qh", 16) >> 4], axis=2).reshape(n_blocks, 32)
        nib = (nib & 8) | ((idx >> 8) & 7).astype(np.uint8)
        _put(raw, t, "qh", (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8))
    return raw


def ternary_blocks(t: GGMLType, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """TQ1_0 / TQ2_0 blocks whose code bytes take every value 0..255 (TQ2_0: every two-bit code,
    3 included, which ggml decodes to 2 though its quantiser never writes it)."""
    raw = random_blocks(t, (n_blocks * 256,), rng).reshape(n_blocks, type_size(t))
    codes = block_dtype(t).fields["d"][1]   # the code bytes come before d in both
    raw[:, :codes] = (np.arange(n_blocks * codes) % 256).astype(np.uint8).reshape(n_blocks, codes)
    return raw


TYPES = GRID   # IQ3_S ... TQ1_0


def _blocks(t: GGMLType) -> np.ndarray:
    rng = np.random.default_rng(int(t))
    # at least 16 rows of K: ggml's bar is for more than a handful of results
    if t in GRID_SIZE:
        n = max(GRID_SIZE[t], 256) // _groups(t)
        return grid_blocks(t, max(n + n % 2, 32), rng)
    return ternary_blocks(t, 32, rng)


MARKED = {G.IQ2_XXS: "IQ2XXS_VALUES", G.IQ2_XS: "IQ2XS_VALUES", G.IQ2_S: "IQ2S_VALUES", G.IQ3_XXS: "IQ3XXS_VALUES",
          G.IQ3_S: "IQ3S_VALUES", G.IQ1_S: "IQ1S_VALUES", G.IQ1_M: "IQ1S_VALUES"}


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_blocks_reach_every_index_and_sign(t, monkeypatch):
    """The test blocks reach every grid index and sign pattern as ggmlpy's own decoder reads
    them: decoded with a marker grid whose row i is (1, 2 + i % 64, 2 + i // 64, 1 ...) (and
    IQ1's delta 0), each group's values over its first give i back, and their signs against
    d's give the sign byte."""
    data = _blocks(t)
    if t not in GRID_SIZE:
        assert sorted(set(data[:, :block_dtype(t).fields["d"][1]].reshape(-1))) == list(range(256))
        return
    width = 4 if _groups(t) == 64 else 8
    marker = np.ones((GRID_SIZE[t], width), dtype=np.int8 if t in (G.IQ1_S, G.IQ1_M) else np.uint8)
    marker[:, 1] = 2 + np.arange(GRID_SIZE[t]) % 64
    marker[:, 2] = 2 + np.arange(GRID_SIZE[t]) // 64
    monkeypatch.setattr(dequant_iq, MARKED[t], marker)
    monkeypatch.setattr(dequant_iq, "IQ1S_DELTA", np.float32(0.0))
    out = dequantize(data, t, (block_size(t) * len(data),)).reshape(len(data), -1, width)
    ratio = np.abs(out / out[:, :, :1]).astype(np.int64)
    idx = (ratio[:, :, 1] - 2) + 64 * (ratio[:, :, 2] - 2)
    assert sorted(set(idx.reshape(-1))) == list(range(GRID_SIZE[t]))
    if t in (G.IQ1_S, G.IQ1_M):   # no signs
        return
    d = data.reshape(-1).view(block_dtype(t))["d"].astype(np.float32)
    minus = (out.reshape(len(data), 32, 8) < 0) != (d < 0)[:, None, None]
    signs = (minus << np.arange(8)).sum(axis=2)
    expected = dequant_iq.KSIGNS_IQ2XS if t in SEVEN_BIT_SIGNS else np.arange(256)
    assert sorted(set(signs.reshape(-1))) == sorted(set(expected.tolist()))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_get_rows_is_dequantize_bit_for_bit(t):
    data = _blocks(t).reshape(-1, K // 256 * type_size(t))
    rows = len(data)
    case = OpCase((SrcSpec(t, (K, rows, 1, 1)), SrcSpec(G.I32, (rows,), fill=f"rows:{rows}")))
    ids = np.random.default_rng(3).permutation(rows).astype(np.int32)
    ours, _ = run_case("get_rows", case, CpuBackend(n_threads=2), inputs={"src0": data, "src1": ids})
    expected = dequantize(data, t, (K, rows))[ids]
    assert np.array_equal(ours.reshape(rows, K), expected)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("flavour", _flavours(), indirect=True)
@pytest.mark.parametrize("n", [1, 5, 40])
def test_mul_mat_on_every_index(flavour, t, n):
    """Decode (one token), the direct tiles and qgemm's repacked groups (32 tokens and more)."""
    check_mul_mat(t, _blocks(t).reshape(-1, K // 256 * type_size(t)), n)


def check_mul_mat(t: GGMLType, data: np.ndarray, n: int) -> None:
    """The rows of blocks `data` (rows of K values) against n random tokens on the CPU backend
    meet both of test_cpu_quant_kernels.py's oracles."""
    rows, k = len(data), len(data[0]) // type_size(t) * block_size(t)
    case = OpCase((SrcSpec(t, (k, rows, 1, 1)), SrcSpec(G.F32, (k, n, 1, 1))))
    x = np.random.default_rng(n).standard_normal((1, 1, n, k)).astype(np.float32)
    inputs = {"src0": data.reshape(1, 1, rows, -1), "src1": x}
    ours, _ = run_case("mul_mat", case, CpuBackend(n_threads=2), inputs=inputs)
    expected, _ = run_case("mul_mat", case, RefBackend(), inputs=inputs)
    weights = dequantize(data, t, (k, rows))
    assert normalized_error(ours, expected) <= GGML_BAR
    assert normalized_error(ours[0, 0], _kernel_model(t, data, weights, x[0, 0])) <= EXACT_BAR


@pytest.mark.parametrize("t", sorted(superblocks.CODE_VALUES), ids=lambda t: t.name)
@pytest.mark.parametrize("flavour", _flavours(), indirect=True)
@pytest.mark.parametrize("n", [1, 5, 40])
def test_weights_repacked_as_codes_on_every_index(flavour, t, n):
    """A model's IQ3_S, IQ2_XS and IQ2_S weights are repacked as codes (repack_superblocks):
    the same blocks as model weights, each grid index and sign pattern through the codes'
    table lookup, meet both oracles on every flavour."""
    data = _blocks(t).reshape(-1, K // 256 * type_size(t))
    rows = len(data)
    assert rows % 16 == 0   # whole groups: the weight is repacked
    case = OpCase((SrcSpec(t, (K, rows, 1, 1), weight=True), SrcSpec(G.F32, (K, n, 1, 1))))
    x = np.random.default_rng(n).standard_normal((1, 1, n, K)).astype(np.float32)
    inputs = {"src0": data.reshape(1, 1, rows, -1), "src1": x}
    backend = CpuBackend(n_threads=2)
    ours, _ = run_case("mul_mat", case, backend, inputs=inputs)
    assert backend.weight_layouts.arrays   # read from the repacked copy
    expected, _ = run_case("mul_mat", case, RefBackend(), inputs=inputs)
    weights = dequantize(data, t, (K, rows))
    assert normalized_error(ours, expected) <= GGML_BAR
    assert normalized_error(ours[0, 0], _kernel_model(t, data, weights, x[0, 0])) <= EXACT_BAR


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_byte_range_is_what_the_dots_are_told(t):
    """WEIGHT_BYTE_MAX (which picks the avx2 flavour's i16 grouping and mul_small) covers
    every byte the decoder can give: a grid's largest value twice (offset +- it), IQ1's
    8 * 1 + 1 + 9, the ternary types' codes."""
    kind = KINDS[t]
    assert isinstance(kind, GridKind) and {**GRID_KINDS, **TERNARY_KINDS}[t] is kind
    tableless = {G.IQ1_S: 18, G.IQ1_M: 18, G.TQ1_0: 2, G.TQ2_0: 3}   # no offset grid: their byte maxima
    if t in tableless:
        assert qvec.WEIGHT_BYTE_MAX[t] == tableless[t]
    else:
        assert kind.offset == int(kind.grid.max())
        assert qvec.WEIGHT_BYTE_MAX[t] == 2 * kind.offset
