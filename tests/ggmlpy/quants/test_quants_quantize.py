"""quantize: equal to the gguf package where it has a quantiser, equal to ggml's own bytes on
a fixed input (known answers), and round trips within each format's error bound."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

from ggmlpy.ir.types import GGMLType, block_size, type_size
from ggmlpy.quants import block_dtype, dequantize, quantize
from ggmlpy.quants import quant as quant_module

F32 = np.float32
GGUF_QUANTIZERS = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1,
                   GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.MXFP4, GGMLType.TQ1_0,
                   GGMLType.TQ2_0]
ALL_QUANTIZERS = GGUF_QUANTIZERS + [GGMLType.Q8_1, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K,
                                    GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_K, GGMLType.IQ4_NL,
                                    GGMLType.IQ4_XS, GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_S,
                                    GGMLType.NVFP4, GGMLType.Q1_0, GGMLType.Q2_0]


def distributions(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Inputs that reach the corners of the scale searches: one sign only, heavy tails,
    all-zero and constant blocks, exact integers, extreme magnitudes."""
    sparse = rng.standard_normal(n)
    sparse[rng.random(n) < 0.7] = 0.0
    sparse[:256] = 0.0
    return {
        "normal": rng.standard_normal(n),
        "uniform": rng.uniform(-1, 1, n),
        "positive": rng.uniform(0, 1, n),
        "negative": -rng.uniform(0, 3, n),
        "heavy_tail": rng.standard_t(2, n) * 0.02,
        "sparse": sparse,
        "constant_16": np.repeat(rng.standard_normal(n // 16), 16),
        "integers": rng.integers(-8, 8, n),
        "tiny": rng.standard_normal(n) * 1e-30,
        "huge": rng.standard_normal(n) * 1e30,
    }


DATA = {name: x.astype(F32).reshape(4, -1)
        for name, x in distributions(np.random.default_rng(7), 4 * 1024).items()}


@pytest.mark.parametrize("t", GGUF_QUANTIZERS, ids=lambda t: t.name)
@pytest.mark.parametrize("name", list(DATA))
def test_equals_gguf_quantizer(t, name):
    x = DATA[name]
    with np.errstate(all="ignore"):
        ours = quantize(x, t)
        ref = gguf_quantize(x, GGMLQuantizationType(int(t)))
    assert ours.dtype == np.uint8 and ours.shape == (4, 1024 // block_size(t) * type_size(t))
    np.testing.assert_array_equal(ours, np.ascontiguousarray(ref).view(np.uint8).reshape(ours.shape))


def test_bf16_special_values_equal_gguf():
    rng = np.random.default_rng(3)
    patterns = np.concatenate([
        rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32),
        np.array([0x7F800000, 0xFF800000, 0x7FC00001, 0xFFFFFFFF, 0x80000000, 0x00000001,
                  0x3F808000, 0x3F818000, 0x7F7FFFFF], dtype=np.uint32)])  # inf, nan, ties
    x = patterns.view(F32).reshape(1, -1)
    np.testing.assert_array_equal(
        quantize(x, GGMLType.BF16).view(np.uint16),
        gguf_quantize(x, GGMLQuantizationType.BF16).view(np.uint16))


def kat_input() -> np.ndarray:
    """A fixed input built from integer arithmetic only (so identical on every platform):
    one row per kind of data, each at a different power-of-two scale."""
    rows, cols = 8, 1024
    i = np.arange(rows * cols, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64(12345)) % np.uint64(2**32)
    u = (h.astype(np.float64) / 2**32 - 0.5).reshape(rows, cols)
    x = np.empty((rows, cols))
    x[0] = u[0]
    x[1] = 8 * u[1] ** 3
    x[2] = u[2] + 0.5
    x[3] = -3 * (u[3] + 0.5)
    x[4] = np.where(h.reshape(rows, cols)[4] % 10 < 7, 0.0, u[4])
    x[5] = np.repeat(u[5, ::16], 16)
    x[6] = u[6] * 2.0**-60
    x[6, :256] = 0.0
    x[7] = np.floor(u[7] * 16)
    x *= 2.0 ** np.arange(-4, 4)[:, None]
    return x.astype(F32)


# sha256 of the bytes ggml's quantize_row_<type>_ref writes for kat_input(), computed with
# ggml's C code (ggml-org/ggml d99724f2, built with -O2 -DNDEBUG -ffp-contract=off).
GGML_KNOWN_ANSWERS = {
    GGMLType.Q4_0: "0039289a24c9aa92d1b306359dc4059caf19098f6ae46766653b60096a03203f",
    GGMLType.Q4_1: "7907c9a252b43cf5aae8b4a6423b4f7ca5ecb38159dd0379f4d1bb4a9daf3159",
    GGMLType.Q5_0: "bf2694091ebcb9e633e3eb610b2ea39ff1d5dbe32ac8b32cc8aa377b3b519343",
    GGMLType.Q5_1: "f5951d3b472f4bc8268cc72a929b95c58b309f563b159a2b995a840f061df398",
    GGMLType.Q8_0: "f275b357c0f9fb24f087822a81ae9fe2b729b3f738c3e4ace6da1d866ec9d9f1",
    GGMLType.Q8_1: "f448c5b731e7a3249916b0a1e1da3917d046b4afc5972fbdd28688279ca383f1",
    GGMLType.Q2_K: "4a497fbf60f42c8131df152db0fe56541f6acbd8aaba72d049088dc536acdbbe",
    GGMLType.Q3_K: "3726550e487432d1caf56c6d1e5009e01ac4be96b10b19f039744d477ff44e87",
    GGMLType.Q4_K: "347f06fe82d47b3107452e404b8d90dbb873b9018d4fccea54cd2ada4062e1de",
    GGMLType.Q5_K: "02cdd6fd0d2e9f2ed34490389ce7712e59efbb65b848c856d107ea5ed3e69c47",
    GGMLType.Q6_K: "a6f5eb84750b3623dde8b71f04b67d6e7fd7bef6e39eb2a0192c370e398959df",
    GGMLType.Q8_K: "3effc9353ab8885106e481a1bcd2f9077da64faab56e0ada8b68492c35d2453d",
    # quantize_row_mxfp4_ref of the ggml vendored by llama-cpp-python 0.3.36, same flags
    GGMLType.MXFP4: "9b716855df1fdb009e4ebd99396f39e708d1d0a7893b2680c348925f3cb48985",
}


@pytest.mark.parametrize("t", list(GGML_KNOWN_ANSWERS), ids=lambda t: t.name)
def test_bytes_equal_ggml_reference_quantizer(t):
    digest = hashlib.sha256(quantize(kat_input(), t).tobytes()).hexdigest()
    assert digest == GGML_KNOWN_ANSWERS[t]


# ---- round-trip bounds derived from each format ----

def blocks_of(x: np.ndarray, t: GGMLType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x as blocks, decoded values as blocks, structured blocks)."""
    q = quantize(x, t)
    y = dequantize(q, t, tuple(reversed(x.shape)))
    bs = block_size(t)
    return x.reshape(-1, bs), y.reshape(-1, bs), q.reshape(-1).view(block_dtype(t))


@pytest.mark.parametrize("t", [GGMLType.Q8_0, GGMLType.Q8_1], ids=lambda t: t.name)
@pytest.mark.parametrize("name", ["normal", "heavy_tail", "sparse", "positive"])
def test_q8_error_at_most_half_a_step(t, name):
    # q = round(x / d) with d = amax/127 in float32; decoding uses fp16(d): the error is at
    # most d/2 plus 127 times the scale's fp16 rounding
    x, y, blk = blocks_of(DATA[name], t)
    d32 = np.abs(x).max(axis=1) / F32(127)
    d16 = blk["d"].astype(F32)
    bound = d32 / 2 + 127 * np.abs(d32 - d16) + 1e-6 * d32
    assert np.all(np.abs(x - y) <= bound[:, None])


def test_q8_1_sum_field():
    x, _, blk = blocks_of(DATA["normal"], GGMLType.Q8_1)
    d32 = np.abs(x).max(axis=1) / F32(127)
    total = blk["qs"].astype(np.int32).sum(axis=1)
    np.testing.assert_array_equal(blk["s"], (total.astype(F32) * d32).astype(np.float16))
    np.testing.assert_allclose(blk["s"].astype(F32), blk["d"].astype(F32) * total, rtol=2e-3, atol=1e-6)


@pytest.mark.parametrize("t, levels", [(GGMLType.Q4_0, 8), (GGMLType.Q5_0, 16)], ids=["Q4_0", "Q5_0"])
@pytest.mark.parametrize("name", ["normal", "heavy_tail", "negative"])
def test_symmetric_legacy_error(t, levels, name):
    # d = max/-levels; values round to the nearest of 2*levels steps, except that the value
    # of largest magnitude's opposite end (+levels) is clamped one step short
    x, y, blk = blocks_of(DATA[name], t)
    mx = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)[:, 0]
    d32 = np.abs(mx / F32(-levels))
    slack = levels * np.abs(d32 - np.abs(blk["d"].astype(F32))) + 1e-6 * d32
    err = np.abs(x - y)
    clamped = x / (mx / F32(-levels))[:, None] > levels - 0.5
    assert np.all(err[~clamped] <= (d32 / 2 + slack)[:, None].repeat(x.shape[1], 1)[~clamped])
    assert np.all(err <= (d32 + slack)[:, None])


@pytest.mark.parametrize("t, top", [(GGMLType.Q4_1, 15), (GGMLType.Q5_1, 31)], ids=["Q4_1", "Q5_1"])
@pytest.mark.parametrize("name", ["normal", "positive", "sparse"])
def test_affine_legacy_error(t, top, name):
    x, y, blk = blocks_of(DATA[name], t)
    d32 = (x.max(axis=1) - x.min(axis=1)) / F32(top)
    slack = top * np.abs(d32 - blk["d"].astype(F32)) + np.abs(x.min(axis=1) - blk["m"].astype(F32))
    assert np.all(np.abs(x - y) <= (d32 / 2 + slack + 1e-6 * d32)[:, None])


def test_q8_k_error_and_block_sums():
    x, y, blk = blocks_of(DATA["heavy_tail"], GGMLType.Q8_K)
    d = np.abs(blk["d"])
    assert np.all(np.abs(x - y) <= (d * (0.5 + 1e-4))[:, None])
    np.testing.assert_array_equal(blk["bsums"], blk["qs"].reshape(-1, 16, 16).sum(axis=2))


def k_quant_grid(t: GGMLType, blk: np.ndarray) -> tuple[np.ndarray, np.ndarray, range]:
    """Decoded (scale, min) of every sub-block and the level range, read straight from the
    block fields (written from ggml-common.h, independently of the library's decoders)."""
    n = len(blk)
    d = blk["d"].astype(F32)[:, None]
    if t == GGMLType.Q2_K:
        sc = blk["scales"]
        return d * (sc & 15), blk["dmin"].astype(F32)[:, None] * (sc >> 4), range(0, 4)
    if t == GGMLType.Q3_K:
        packed = blk["scales"].astype(np.int32)
        sc = np.empty((n, 16), np.int32)
        for j in range(16):
            low = packed[:, j] & 15 if j < 8 else packed[:, j - 8] >> 4
            sc[:, j] = (low | (((packed[:, 8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
        return d * sc, np.zeros((n, 16), F32), range(-4, 4)
    if t == GGMLType.Q6_K:
        return d * blk["scales"], np.zeros((n, 16), F32), range(-32, 32)
    packed = blk["scales"].astype(np.int32)
    sc, mn = np.empty((n, 8), np.int32), np.empty((n, 8), np.int32)
    for j in range(8):
        if j < 4:
            sc[:, j], mn[:, j] = packed[:, j] & 63, packed[:, j + 4] & 63
        else:
            sc[:, j] = (packed[:, j + 4] & 15) | ((packed[:, j - 4] >> 6) << 4)
            mn[:, j] = (packed[:, j + 4] >> 4) | ((packed[:, j] >> 6) << 4)
    top = 16 if t == GGMLType.Q4_K else 32
    return d * sc, blk["dmin"].astype(F32)[:, None] * mn, range(0, top)


@pytest.mark.parametrize("t", [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K,
                               GGMLType.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("name", ["normal", "heavy_tail", "positive", "sparse", "constant_16"])
def test_k_quants_pick_the_nearest_representable_value(t, name):
    # After choosing the scales, ggml re-quantises every value to the nearest level of its
    # sub-block's decoded grid d*l - m, so no other level may be closer (up to float rounding)
    x, y, blk = blocks_of(DATA[name], t)
    scale, minimum, levels = k_quant_grid(t, blk)
    group = x.shape[1] // scale.shape[1]
    grid = scale[:, :, None] * np.array(levels, F32) - minimum[:, :, None]  # (n, subs, levels)
    xs = x.reshape(len(x), -1, group)
    best = np.abs(xs[..., None] - grid[:, :, None, :]).min(axis=-1)
    err = np.abs(xs - y.reshape(xs.shape))
    tol = 1e-5 * (np.abs(xs) + np.abs(minimum)[:, :, None] + np.abs(scale)[:, :, None] * len(levels))
    assert np.all(err <= best + tol)


def test_more_bits_means_less_error():
    x = DATA["normal"]
    order = [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K,
             GGMLType.Q5_1, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_K]
    rmse = [np.sqrt(np.mean((dequantize(quantize(x, t), t, (1024, 4)) - x) ** 2)) for t in order]
    assert rmse == sorted(rmse, reverse=True)
    assert rmse[order.index(GGMLType.Q4_K)] < 0.08  # ~1/14 of sigma for normal data


# the sixteen E2M1 codes of MXFP4, doubled (ggml's kvalues_mxfp4), written out from the OCP
# microscaling spec rather than imported: E2M1 is 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives
MXFP4_CODES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], F32)


def mxfp4_scales(e: np.ndarray) -> np.ndarray:
    """2^(e - 128) in float64 (exact for every byte), the scale of the doubled codes."""
    return np.ldexp(1.0, e.astype(np.int64) - 128)


@pytest.mark.parametrize("name", ["normal", "heavy_tail", "positive", "sparse", "tiny", "huge"])
def test_mxfp4_exponent_and_nearest_code(name):
    """e = floor(log2(amax)) - 2 + 127, so amax / 2^(e - 128) is in [8, 16); every value is
    the code nearest to it (the top code, 12, for the values past it)."""
    x, y, blk = blocks_of(DATA[name], GGMLType.MXFP4)
    amax = np.abs(x).max(axis=1).astype(np.float64)
    live = amax > 0
    d = mxfp4_scales(blk["e"])
    assert np.all(blk["e"][~live] == 0)
    ratio = amax[live] / d[live]
    assert np.all((ratio >= 8) & (ratio < 16))
    grid = d[:, None] * MXFP4_CODES                                   # [blocks, 16]
    best = np.abs(x[..., None].astype(np.float64) - grid[:, None, :]).min(axis=-1)
    np.testing.assert_array_equal(np.abs(x.astype(np.float64) - y), best)


def test_mxfp4_by_hand():
    """amax 5 -> e = 2 - 2 + 127 = 127, d = 0.5: 5 / 0.5 = 10 lies between codes 8 and 12 and
    goes to the first of the two equally near (8: value 4); 0.3 -> code 1 (0.5) is nearer than
    0; -5.9 -> -12 * 0.5 = -6."""
    x = np.zeros((1, 32), F32)
    x[0, :4] = [5.0, 0.3, -5.9, 0.7]
    blk = quantize(x, GGMLType.MXFP4).reshape(-1).view(block_dtype(GGMLType.MXFP4))[0]
    assert blk["e"] == 127
    assert list(blk["qs"][:4] & 15) == [6, 1, 15, 1] and not (blk["qs"] >> 4).any()
    np.testing.assert_array_equal(dequantize(quantize(x, GGMLType.MXFP4), GGMLType.MXFP4, (32,))[:4],
                                  [4.0, 0.5, -6.0, 0.5])


@pytest.mark.parametrize("t", [GGMLType.F16, GGMLType.F32], ids=lambda t: t.name)
def test_float_formats_round_trip(t):
    x = DATA["normal"]
    y = dequantize(quantize(x, t), t, (1024, 4))
    expected = x.astype(np.float16).astype(F32) if t == GGMLType.F16 else x
    np.testing.assert_array_equal(y, expected)


# ---- shapes, chunks and errors ----

@pytest.mark.parametrize("t", ALL_QUANTIZERS, ids=lambda t: t.name)
def test_shape_is_rows_by_row_bytes(t):
    x = np.random.default_rng(1).standard_normal((2, 3, 512)).astype(F32)
    q = quantize(x, t)
    assert q.shape == (2, 3, 512 // block_size(t) * type_size(t)) and q.dtype == np.uint8
    assert dequantize(q, t, (512, 3, 2)).shape == x.shape


def test_chunking_does_not_change_bytes(monkeypatch):
    x = DATA["heavy_tail"]
    whole = quantize(x, GGMLType.Q4_K)
    monkeypatch.setattr(quant_module, "CHUNK_ELEMENTS", 768)
    np.testing.assert_array_equal(quantize(x, GGMLType.Q4_K), whole)


def test_float64_input_is_rounded_to_float32_first():
    x = np.random.default_rng(2).standard_normal((2, 64))
    np.testing.assert_array_equal(quantize(x, GGMLType.Q8_0), quantize(x.astype(F32), GGMLType.Q8_0))


def test_row_not_a_multiple_of_the_block():
    with pytest.raises(ValueError, match=r"Q4_K .*ne\[0\] = 100 is not a multiple of the block size 256"):
        quantize(np.zeros((2, 100), F32), GGMLType.Q4_K)


def test_scalar_and_non_numeric_inputs():
    with pytest.raises(ValueError, match="0-d"):
        quantize(np.float32(1.0), GGMLType.Q8_0)
    with pytest.raises(TypeError, match="dtype"):
        quantize(np.array(["a"] * 32), GGMLType.Q8_0)


# ggml quantises these only with an importance matrix (ggml_quantize_requires_imatrix)
@pytest.mark.parametrize("t", [GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ1_S])
def test_quantizers_that_need_an_importance_matrix(t):
    with pytest.raises(ValueError, match=f"{t.name} needs an importance matrix"):
        quantize(np.zeros(256, F32), t)


def test_types_without_a_quantizer():
    with pytest.raises(NotImplementedError, match="I8"):
        quantize(np.zeros(256, F32), GGMLType.I8)
