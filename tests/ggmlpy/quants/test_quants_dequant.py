"""dequantize / dequantize_rows: bit-exact against the gguf package, hand-computed blocks,
and clear errors for inconsistent input."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from ggmlpy.ir.types import GGMLType, block_size, type_size
from ggmlpy.quants import block_dtype, dequantize, dequantize_rows
from ggmlpy.quants import dequant as dequant_module

GGUF_HAS = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1,
            GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K,
            GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.MXFP4, GGMLType.IQ2_XXS,
            GGMLType.IQ2_XS, GGMLType.IQ3_XXS, GGMLType.IQ1_S, GGMLType.IQ4_NL, GGMLType.IQ3_S,
            GGMLType.IQ2_S, GGMLType.IQ4_XS, GGMLType.IQ1_M, GGMLType.TQ1_0, GGMLType.TQ2_0,
            GGMLType.NVFP4]


def bits(a: np.ndarray) -> np.ndarray:
    """float32 values as their bit patterns, so -0.0 != 0.0 and NaN == NaN when equal."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def random_tensor(t: GGMLType, ne: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random bytes, except that the float scales are finite values of mixed sign and size
    (and some exact zeros), so every path of a decoder is exercised."""
    rng = np.random.default_rng(seed)
    n_elems = int(np.prod(ne))
    dt = block_dtype(t)
    n_blocks = n_elems // block_size(t)
    raw = rng.integers(0, 256, n_blocks * dt.itemsize, dtype=np.uint8)
    blocks = raw.view(dt)
    for name in dt.names:
        if dt[name].kind == "f" and t not in (GGMLType.F32, GGMLType.F16):
            scale = rng.standard_normal(n_blocks) * np.exp(rng.uniform(-12, 2, n_blocks))
            scale[rng.random(n_blocks) < 0.05] = 0.0
            blocks[name] = scale.astype(dt[name])
    if t in (GGMLType.F32, GGMLType.F16):
        raw = rng.standard_normal(n_elems).astype(dt["v"]).view(np.uint8)
    return raw


def gguf_reference(raw: np.ndarray, t: GGMLType, ne: tuple[int, ...]) -> np.ndarray:
    rows = raw.reshape(-1, ne[0] // block_size(t) * type_size(t))
    if t == GGMLType.F32:
        rows = rows.view(np.float32)
    elif t == GGMLType.F16:
        rows = rows.view(np.float16)
    with np.errstate(over="ignore"):   # MXFP4's largest exponents overflow to inf, as in ggml
        out = gguf_dequantize(rows, GGMLQuantizationType(int(t)))
    return np.asarray(out, dtype=np.float32).reshape(tuple(reversed(ne)))


@pytest.mark.parametrize("t", GGUF_HAS, ids=lambda t: t.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_blocks_match_gguf(t, seed):
    ne = (4 * 256, 3, 2)
    raw = random_tensor(t, ne, seed)
    ours = dequantize(raw, t, ne)
    assert ours.shape == (2, 3, 1024) and ours.dtype == np.float32
    np.testing.assert_array_equal(bits(ours), bits(gguf_reference(raw, t, ne)))


@pytest.mark.parametrize("t", [GGMLType.Q8_1, GGMLType.Q8_K], ids=lambda t: t.name)
def test_8bit_formats_without_gguf_decoder(t):
    # ggml: y = d * qs[j] (Q8_1's s field is not part of the value)
    raw = random_tensor(t, (512, 2))
    blocks = raw.view(block_dtype(t))
    expected = blocks["d"].astype(np.float32)[:, None] * blocks["qs"].astype(np.float32)
    np.testing.assert_array_equal(bits(dequantize(raw, t, (512, 2))), bits(expected.reshape(2, 512)))


@pytest.mark.parametrize("t, np_type", [(GGMLType.I8, "i1"), (GGMLType.I16, "<i2"),
                                        (GGMLType.I32, "<i4"), (GGMLType.I64, "<i8"),
                                        (GGMLType.F64, "<f8")], ids=lambda v: str(v))
def test_plain_numeric_types(t, np_type):
    values = np.array([0, 1, -7, 100, -128, 127, 3, 42], dtype=np_type)
    out = dequantize(values.view(np.uint8), t, (4, 2))
    np.testing.assert_array_equal(out, values.astype(np.float32).reshape(2, 4))


@pytest.mark.parametrize("flush_denormals", [False, True])
def test_f16_every_bit_pattern(monkeypatch, flush_denormals):
    """All 65536 halves, NaN payloads and subnormals included, through both the fast path
    and the fallback used when the FPU flushes denormals."""
    if flush_denormals:
        monkeypatch.setattr(dequant_module, "_denormals_work", lambda: False)
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    out = dequantize(halves.view(np.uint8), GGMLType.F16, (256, 256))
    np.testing.assert_array_equal(bits(out).reshape(-1), bits(halves.view(np.float16).astype(np.float32)))


def test_bf16_every_bit_pattern():
    patterns = np.arange(65536, dtype=np.uint32)
    out = dequantize(patterns.astype(np.uint16).view(np.uint8), GGMLType.BF16, (65536,))
    np.testing.assert_array_equal(bits(out), patterns << 16)


def test_f32_is_a_view():
    values = np.arange(8, dtype=np.float32)
    out = dequantize(values.view(np.uint8), GGMLType.F32, (8,))
    assert np.shares_memory(out, values)
    np.testing.assert_array_equal(out, values)


# ---- blocks worked out by hand from the C decoders ----

def one_block(t: GGMLType, **fields) -> np.ndarray:
    blk = np.zeros(1, dtype=block_dtype(t))
    for name, value in fields.items():
        blk[name] = value
    return blk.view(np.uint8)


def test_q4_0_by_hand():
    j = np.arange(16)
    raw = one_block(GGMLType.Q4_0, d=0.5, qs=(j | ((15 - j) << 4)).astype(np.uint8))
    expected = np.concatenate([(j - 8) * 0.5, (7 - j) * 0.5])
    np.testing.assert_array_equal(dequantize(raw, GGMLType.Q4_0, (32,)), expected)


def test_mxfp4_by_hand():
    """Code j of the low nibbles is element j, the high nibbles elements 16..31; the scale is
    2^(e - 128), the doubled E2M1 value's half: e = 127 gives the plain E2M1 values. e = 0
    and 1 are the subnormal scales 2^-128 and 2^-127, e = 255 the largest, 2^127."""
    e2m1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6]
    j = np.arange(16)
    qs = (j | ((15 - j) << 4)).astype(np.uint8)
    for e, scale in [(127, 1.0), (130, 8.0), (0, 2.0**-127), (1, 2.0**-126), (2, 2.0**-125),
                     (255, 2.0**128), (200, 2.0**73)]:
        out = dequantize(one_block(GGMLType.MXFP4, e=e, qs=qs), GGMLType.MXFP4, (32,))
        expected = np.array(e2m1 + e2m1[::-1]) * scale
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(out, expected.astype(np.float32))
    assert bits(dequantize(one_block(GGMLType.MXFP4, e=0, qs=qs), GGMLType.MXFP4, (32,)))[1] == 0x00200000


def test_q5_1_by_hand():
    # element 3 gets bit 3 of qh (16 + 1), element 17 bit 17 (16 + 2); value = q*d + m
    qs = np.zeros(16, np.uint8)
    qs[3] = 1
    qs[1] = 2 << 4
    qh = np.frombuffer(np.uint32((1 << 3) | (1 << 17)).tobytes(), np.uint8)
    raw = one_block(GGMLType.Q5_1, d=2.0, m=-1.0, qs=qs, qh=qh)
    out = dequantize(raw, GGMLType.Q5_1, (32,))
    expected = np.full(32, -1.0)
    expected[3] = 17 * 2.0 - 1.0
    expected[17] = 18 * 2.0 - 1.0
    np.testing.assert_array_equal(out, expected)


def test_q4_k_by_hand():
    # sub-block 0: scale 2, min 4 (bytes 0 and 4); sub-block 4: scale from byte 8's low
    # nibble plus byte 0's top bits (1 | 1 << 4 = 17), min from byte 8's high nibble (2)
    scales = np.zeros(12, np.uint8)
    scales[0] = 2 | (1 << 6)
    scales[4] = 4
    scales[8] = 0x21
    qs = np.zeros(128, np.uint8)
    qs[0:32] = np.arange(32) % 16
    qs[64:96] = np.arange(32) % 16
    raw = one_block(GGMLType.Q4_K, d=1.0, dmin=0.5, scales=scales, qs=qs)
    out = dequantize(raw, GGMLType.Q4_K, (256,))
    q = np.arange(32) % 16
    expected = np.zeros(256)
    expected[0:32] = 2 * q - 0.5 * 4
    expected[128:160] = 17 * q - 0.5 * 2
    np.testing.assert_array_equal(out, expected)


def test_q6_k_by_hand():
    # element 0: low nibble of ql[0], bits 0-1 of qh[0]; element 64: high nibble of ql[0],
    # bits 4-5; element 96: high nibble of ql[32], bits 6-7; scale index = element // 16
    ql = np.zeros(128, np.uint8)
    ql[0] = 0x5 | (0xA << 4)
    qh = np.zeros(64, np.uint8)
    qh[0] = 0b11_10_01_00
    scales = np.zeros(16, np.int8)
    scales[0], scales[4], scales[6] = -3, 2, 1
    raw = one_block(GGMLType.Q6_K, d=0.25, ql=ql, qh=qh, scales=scales)
    out = dequantize(raw, GGMLType.Q6_K, (256,))
    assert out[0] == 0.25 * -3 * (5 - 32)
    assert out[64] == 0.25 * 2 * ((0xA | (2 << 4)) - 32)
    assert out[96] == 0.25 * 1 * ((3 << 4) - 32)
    assert out[1] == 0.25 * -3 * -32 and out[16] == 0.0


# ---- chunking, inputs, rows ----

def test_chunk_boundaries_do_not_matter(monkeypatch):
    raw = random_tensor(GGMLType.Q4_K, (256, 13), seed=3)
    whole = dequantize(raw, GGMLType.Q4_K, (256, 13))
    monkeypatch.setattr(dequant_module, "CHUNK_ELEMENTS", 3 * 256)
    np.testing.assert_array_equal(bits(dequantize(raw, GGMLType.Q4_K, (256, 13))), bits(whole))


def test_accepts_bytes_memoryview_and_2d_arrays():
    raw = random_tensor(GGMLType.Q8_0, (64, 4))
    expected = dequantize(raw, GGMLType.Q8_0, (64, 4))
    for data in (raw.tobytes(), memoryview(raw.tobytes()), bytearray(raw.tobytes()),
                 raw.reshape(4, -1), np.repeat(raw, 2)[::2]):
        np.testing.assert_array_equal(bits(dequantize(data, int(GGMLType.Q8_0), [64, 4])), bits(expected))


def test_empty_tensor():
    assert dequantize(b"", GGMLType.Q4_0, (32, 0)).shape == (0, 32)


def test_rows_equal_slices_of_the_whole_tensor():
    ne = (256, 5, 3)
    raw = random_tensor(GGMLType.Q6_K, ne, seed=4)
    whole = dequantize(raw, GGMLType.Q6_K, ne).reshape(15, 256)
    rows = [14, 0, 7, 7, 3]
    out = dequantize_rows(raw, GGMLType.Q6_K, ne, rows)
    assert out.shape == (5, 256)
    np.testing.assert_array_equal(bits(out), bits(whole[rows]))
    one = dequantize_rows(raw, GGMLType.Q6_K, ne, np.array([2]))
    np.testing.assert_array_equal(bits(one), bits(whole[[2]]))
    assert dequantize_rows(raw, GGMLType.Q6_K, ne, []).shape == (0, 256)


@pytest.mark.parametrize("rows", [[15], [-1]])
def test_rows_out_of_range(rows):
    raw = random_tensor(GGMLType.Q8_0, (32, 15))
    with pytest.raises(IndexError, match=f"row {rows[0]} is out of range.*15 rows"):
        dequantize_rows(raw, GGMLType.Q8_0, (32, 15), rows)


def test_rows_must_be_1d_integers():
    raw = random_tensor(GGMLType.Q8_0, (32, 15))
    for rows in ([[1, 2]], [1.5]):
        with pytest.raises(ValueError, match="rows must be"):
            dequantize_rows(raw, GGMLType.Q8_0, (32, 15), rows)


# ---- errors ----

@pytest.mark.parametrize("delta", [-1, 1, -18])
def test_wrong_length_names_type_shape_and_bytes(delta):
    raw = np.zeros(18 * 4 + delta, np.uint8)
    with pytest.raises(ValueError, match=r"Q4_0 tensor of shape \[64, 2\] needs 72 bytes, got"):
        dequantize(raw, GGMLType.Q4_0, (64, 2))


def test_row_not_a_multiple_of_the_block():
    with pytest.raises(ValueError, match=r"Q4_K .*ne\[0\] = 128 is not a multiple of the block size 256"):
        dequantize(np.zeros(144, np.uint8), GGMLType.Q4_K, (128, 2))


@pytest.mark.parametrize("ne", [(), (32, 1, 1, 1, 1), (32, -1), ("a",)])
def test_bad_shapes(ne):
    with pytest.raises(ValueError, match="shape"):
        dequantize(np.zeros(18, np.uint8), GGMLType.Q4_0, ne)


@pytest.mark.parametrize("t, name", [(4, "Q4_2"), (99, "unknown type 99")])
def test_unknown_or_removed_type_ids(t, name):
    with pytest.raises(ValueError, match=name):
        dequantize(np.zeros(18, np.uint8), t, (32,))


@pytest.mark.parametrize("t", list(GGMLType), ids=lambda t: t.name)
def test_every_type_decodes(t):
    """No type ggml numbers is left undecoded (removed and unknown ids are refused above)."""
    raw = np.zeros(2 * type_size(t), np.uint8)
    assert dequantize(raw, t, (block_size(t), 2)).shape == (2, block_size(t))
    assert dequantize_rows(raw, t, (block_size(t), 2), [1]).shape == (1, block_size(t))


def test_data_must_be_bytes_like():
    with pytest.raises(TypeError, match="list"):
        dequantize([0] * 18, GGMLType.Q4_0, (32,))
