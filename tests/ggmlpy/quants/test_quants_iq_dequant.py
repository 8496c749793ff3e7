"""Decoders of the I-quants, the ternary types, NVFP4, Q1_0 and Q2_0: bit-exact against ggml's
own to_float (stored by make_ggml_quant_cases.py) and the gguf package, on blocks that reach
every grid index, sign pattern and scale, plus blocks worked out by hand and the tables."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from ggmlpy.ir.types import GGMLType, block_size, type_size
from ggmlpy.quants import block_dtype, dequantizable_types, dequantize
from ggmlpy.quants import iq_grids
from ggmlpy.quants.dequant_blocks import UE4M3_HALF
from ggmlpy.quants.validate import can_validate, first_invalid

T = GGMLType
CASES = np.load(Path(__file__).with_name("data") / "ggml_quant_cases.npz")
NEW_TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ3_XXS, T.IQ1_S, T.IQ4_NL, T.IQ3_S, T.IQ2_S, T.IQ4_XS, T.IQ1_M,
             T.TQ1_0, T.TQ2_0, T.NVFP4, T.Q1_0, T.Q2_0]
GGUF_LACKS = {T.Q1_0, T.Q2_0}


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def ggml_case(t: GGMLType) -> tuple[np.ndarray, np.ndarray]:
    return CASES[f"dq_in_{t.name}"], CASES[f"dq_out_{t.name}"]


@pytest.mark.parametrize("t", NEW_TYPES, ids=lambda t: t.name)
def test_equals_ggml_to_float(t):
    raw, expected = ggml_case(t)
    out = dequantize(raw, t, (expected.size,))
    np.testing.assert_array_equal(bits(out), bits(expected))


@pytest.mark.parametrize("t", [t for t in NEW_TYPES if t not in GGUF_LACKS], ids=lambda t: t.name)
def test_equals_gguf(t):
    raw, expected = ggml_case(t)
    with np.errstate(all="ignore"):
        ref = np.asarray(gguf_dequantize(raw, GGMLQuantizationType(int(t))), dtype=np.float32)
    np.testing.assert_array_equal(bits(dequantize(raw, t, (expected.size,))), bits(ref.reshape(-1)))


def test_every_type_is_decoded():
    assert set(dequantizable_types()) == set(GGMLType)


# ---- the stored blocks reach every value of every field (read from ggml-common.h's structs,
# independently of the decoders) ----

def _u8(field: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(field).view(np.uint8).reshape(len(field), -1)


def _nib(field: np.ndarray) -> np.ndarray:
    b = _u8(field)
    return np.concatenate([b & 15, b >> 4], axis=1)


def field_values(t: GGMLType, blk: np.ndarray) -> dict[str, tuple[np.ndarray, int]]:
    """Each index, sign and scale field of the blocks: (values, how many values it can hold)."""
    if t in (T.IQ2_XXS, T.IQ3_XXS):
        qs = _u8(blk["qs"])
        idx, words = (qs[:, :64], qs[:, 64:]) if t == T.IQ3_XXS else \
            (qs.reshape(-1, 8, 8)[:, :, :4], qs.reshape(-1, 8, 8)[:, :, 4:])
        w = np.ascontiguousarray(words).view("<u4")
        signs = np.stack([(w >> s) & 127 for s in (0, 7, 14, 21)])
        return {"grid": (idx, 256), "signs": (signs, 128), "scale": (w >> 28, 16)}
    if t == T.IQ2_XS:
        return {"grid": (blk["qs"] & 511, 512), "signs": (blk["qs"] >> 9, 128), "scale": (_nib(blk["scales"]), 16)}
    if t == T.IQ2_S:
        qs, qh = _u8(blk["qs"]).astype(int), _u8(blk["qh"]).astype(int)
        g = np.arange(32)
        idx = qs[:, g] | (((qh[:, g // 4] >> (2 * (g % 4))) & 3) << 8)
        return {"grid": (idx, 1024), "signs": (qs[:, 32:], 256), "scale": (_nib(blk["scales"]), 16)}
    if t == T.IQ3_S:
        qh = _u8(blk["qh"]).astype(int)
        g = np.arange(64)
        idx = _u8(blk["qs"]) | (((qh[:, g // 8] >> (g % 8)) & 1) << 8)
        return {"grid": (idx, 512), "signs": (_u8(blk["signs"]), 256), "scale": (_nib(blk["scales"]), 16)}
    if t == T.IQ1_S:
        qh = blk["qh"].astype(int)
        g = np.arange(32)
        idx = _u8(blk["qs"]) | (((qh[:, g // 4] >> (3 * (g % 4))) & 7) << 8)
        return {"grid": (idx, 2048), "scale": ((qh >> 12) & 7, 8), "delta": (qh >> 15, 2)}
    if t == T.IQ1_M:
        qh, sc = _u8(blk["qh"]).astype(int), _u8(blk["scales"]).view("<u2").astype(int)
        g, j = np.arange(32), np.arange(16)
        nib = (qh[:, g // 2] >> (4 * (g % 2))) & 15
        scales = (sc[:, j // 4] >> (3 * (j % 4))) & 7
        return {"grid": (_u8(blk["qs"]) | ((nib & 7) << 8), 2048), "scale": (scales, 8), "delta": (nib >> 3, 2)}
    if t == T.IQ4_XS:
        low = _u8(blk["scales_l"])
        low = np.stack([low & 15, low >> 4], axis=2).reshape(len(blk), 8)     # sub-block i: nibble i % 2
        high = (blk["scales_h"][:, None].astype(int) >> np.arange(0, 16, 2)) & 3
        return {"levels": (_nib(blk["qs"]), 16), "scale": (low | (high << 4), 64)}
    if t == T.TQ1_0:
        return {"qs": (_u8(blk["qs"]), 256), "qh": (_u8(blk["qh"]), 256)}
    if t == T.NVFP4:
        return {"codes": (_nib(blk["qs"]), 16), "scale": (_u8(blk["d"]), 256)}
    if t in (T.TQ2_0, T.Q2_0):
        return {"codes": (np.stack([(_u8(blk["qs"]) >> s) & 3 for s in (0, 2, 4, 6)]), 4)}
    if t == T.Q1_0:
        return {"bits": (np.unpackbits(_u8(blk["qs"])), 2)}
    return {"levels": (_nib(blk["qs"]), 16)}          # IQ4_NL


@pytest.mark.parametrize("t", NEW_TYPES, ids=lambda t: t.name)
def test_cases_reach_every_field_value(t):
    raw, _ = ggml_case(t)
    blk = raw.view(block_dtype(t))
    for name, (values, count) in field_values(t, blk).items():
        assert np.array_equal(np.unique(values), np.arange(count)), (t.name, name)
    if "d" in blk.dtype.names and blk.dtype["d"] == np.dtype("<f2"):
        d = blk["d"]
        assert (d == 0).any() and (d < 0).any() and (d > 0).any() and np.isfinite(d).all()


# ---- the tables ----

def test_tables_hold_ggml_common_h_values():
    """Spot values copied by hand from ggml-common.h (the .npz is generated from it)."""
    assert iq_grids.KVALUES_IQ4NL.dtype == np.int8
    assert list(iq_grids.KVALUES_IQ4NL) == [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
    assert list(iq_grids.KMASK_IQ2XS) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert list(iq_grids.KSIGNS_IQ2XS[:8]) == [0, 129, 130, 3, 132, 5, 6, 135]
    assert int(iq_grids.IQ2XXS_GRID[1]) == 0x080808080808082B
    assert int(iq_grids.IQ2XXS_GRID[252]) == 0x2B2B082B08080808
    assert int(iq_grids.IQ2XS_GRID[508]) == 0x2B2B2B2B082B2B08
    assert int(iq_grids.IQ2S_GRID[1023]) == 0x2B2B2B2B2B2B2B2B
    assert int(iq_grids.IQ3XXS_GRID[0]) == 0x04040404 and int(iq_grids.IQ3XXS_GRID[248]) == 0x3E1C1C1C
    assert int(iq_grids.IQ3S_GRID[511]) == 0x0F0F0101
    assert int(iq_grids.IQ1S_GRID[0]) == 0xFFFFFFFFFFFFFFFF and int(iq_grids.IQ1S_GRID[2047]) == 0x0101010101010101
    grids = (iq_grids.IQ2XXS_GRID, iq_grids.IQ2XS_GRID, iq_grids.IQ2S_GRID, iq_grids.IQ3XXS_GRID,
             iq_grids.IQ3S_GRID, iq_grids.IQ1S_GRID)
    assert [len(g) for g in grids] == [256, 512, 1024, 256, 512, 2048]


def test_sign_table_makes_an_even_number_of_minus_signs():
    for i, s in enumerate(iq_grids.KSIGNS_IQ2XS):
        assert s & 127 == i and bin(int(s)).count("1") % 2 == 0


def test_grid_values_are_the_entries_bytes():
    assert list(iq_grids.IQ2XXS_VALUES[1]) == [0x2B, 8, 8, 8, 8, 8, 8, 8]
    assert list(iq_grids.IQ1S_VALUES[1]) == [1, -1, -1, -1, -1, -1, -1, -1]
    assert sorted(set(iq_grids.IQ3S_VALUES.reshape(-1))) == list(range(1, 16, 2))
    # every grid point is distinct (the searches map levels back to one index)
    for values in (iq_grids.IQ2XXS_VALUES, iq_grids.IQ2XS_VALUES, iq_grids.IQ2S_VALUES, iq_grids.IQ3XXS_VALUES,
                   iq_grids.IQ3S_VALUES, iq_grids.IQ1S_VALUES):
        assert len(np.unique(values, axis=0)) == len(values)


def test_ue4m3_scale_table():
    """ggml_ue4m3_to_fp32, halved: bias 7, subnormals man * 2^-9, 0x7F read as 0, bit 7 ignored."""
    assert UE4M3_HALF[0x38] == 0.5 and UE4M3_HALF[0x7E] == 224.0 and UE4M3_HALF[0x01] == 2.0**-10
    assert UE4M3_HALF[0x7F] == 0.0 and UE4M3_HALF[0x80] == 0.0 and UE4M3_HALF[0xFF] == 240.0
    assert UE4M3_HALF[0x39] == 0.5 * 1.125 and UE4M3_HALF[0x08] == 2.0**-7


# ---- blocks worked out by hand from the C decoders ----

def one_block(t: GGMLType, **fields) -> np.ndarray:
    blk = np.zeros(1, dtype=block_dtype(t))
    for name, value in fields.items():
        blk[name] = value
    return blk.view(np.uint8)


def test_iq4_nl_by_hand():
    j = np.arange(16)
    out = dequantize(one_block(T.IQ4_NL, d=0.5, qs=j | ((15 - j) << 4)), T.IQ4_NL, (32,))
    kv = iq_grids.KVALUES_IQ4NL.astype(np.float32)
    np.testing.assert_array_equal(out, np.concatenate([0.5 * kv, 0.5 * kv[::-1]]))


def test_iq2_xxs_by_hand():
    # first 8 elements: grid 1 (bytes 0x2b, 8 x 7), sign field 1 -> ksigns 129 (elements 0
    # and 7 negative), scale 3 -> db = (0.5 + 3) * 0.25; the rest grid 0 (all 8), signs 0
    qs = np.zeros(64, np.uint8)
    qs[0] = 1
    qs[4:8] = np.frombuffer(np.uint32(1 | (3 << 28)).tobytes(), np.uint8)
    out = dequantize(one_block(T.IQ2_XXS, d=1.0, qs=qs.view("<u2")), T.IQ2_XXS, (256,))
    db = 0.875
    assert list(out[:8]) == [-43 * db] + [8 * db] * 6 + [-8 * db]
    assert np.all(out[8:32] == 8 * db) and np.all(out[32:] == 8 * 0.125)


def test_ternary_by_hand():
    # TQ1_0: a byte is ceil(q * 256 / 243) for the base-3 number q of its trits, the first most
    # significant: 207 holds 2,1,0,2,1 (elements 0, 32, 64, 96, 128), 128 holds 1,1,1,1,1 (all
    # zeros), and qh's 127 the four trits 1 (times 3). TQ2_0: bits 2l of byte m: element 32l + m
    qs = np.full(48, 128, np.uint8)
    qs[0] = 207
    out = dequantize(one_block(T.TQ1_0, d=2.0, qs=qs, qh=np.full(4, 127, np.uint8)), T.TQ1_0, (256,))
    assert [out[32 * i] for i in range(5)] == [2.0, 0.0, -2.0, 2.0, 0.0]
    assert np.count_nonzero(out) == 3
    out = dequantize(one_block(T.TQ2_0, d=0.5, qs=np.array([0b10_01_00_10] + [0x55] * 63, np.uint8)), T.TQ2_0, (256,))
    assert [out[32 * i] for i in range(4)] == [0.5, -0.5, 0.0, 0.5] and not out[1:32].any()


def test_q1_0_and_q2_0_by_hand():
    qs = np.zeros(16, np.uint8)
    qs[0] = 0b101
    out = dequantize(one_block(T.Q1_0, d=1.5, qs=qs), T.Q1_0, (128,))
    assert list(out[:3]) == [1.5, -1.5, 1.5] and np.all(out[3:] == -1.5)
    zero = dequantize(one_block(T.Q1_0, d=0.0, qs=qs), T.Q1_0, (128,))
    assert bits(zero)[1] == 0x80000000 and bits(zero)[0] == 0   # -d of a zero d is -0.0
    qs = np.full(16, 0x55, np.uint8)                             # code 1 everywhere: 0
    qs[0] = 0b11_10_01_00
    out = dequantize(one_block(T.Q2_0, d=0.25, qs=qs), T.Q2_0, (64,))
    assert list(out[:4]) == [-0.25, 0.0, 0.25, 0.5] and not out[4:].any()


def test_iq3_s_and_iq1_s_by_hand():
    # IQ3_S: index 256 + 0 via bit 0 of qh[0]; scale nibble 2 -> d * 5; IQ1_S: index 0 (all
    # -1), scale 1 (dl = 3d), negative shift: 3 * (-1 - 0.125)
    qh = np.zeros(8, np.uint8)
    qh[0] = 1
    out = dequantize(one_block(T.IQ3_S, d=1.0, qh=qh, scales=[2, 0, 0, 0]), T.IQ3_S, (256,))
    np.testing.assert_array_equal(out[:4], 5.0 * iq_grids.IQ3S_VALUES[256])
    assert np.all(out[4:32] == 5.0) and np.all(out[32:64] == 1.0)
    raw = one_block(T.IQ1_S, d=1.0, qh=np.array([(1 << 12) | 0x8000] + [0] * 7, np.uint16))
    out = dequantize(raw, T.IQ1_S, (256,))
    assert np.all(out[:32] == np.float32(3 * -1.125)) and np.all(out[32:] == np.float32(-0.875))


@pytest.mark.parametrize("t", NEW_TYPES, ids=lambda t: t.name)
def test_shapes_and_rows(t):
    raw, _ = ggml_case(t)
    n = raw.size // type_size(t) * block_size(t)
    width = 256 if n % 256 == 0 and block_size(t) <= 256 else block_size(t)
    out = dequantize(raw, t, (width, n // width))
    assert out.shape == (n // width, width) and out.dtype == np.float32


@pytest.mark.parametrize("t", [T.IQ2_XS, T.IQ3_S, T.IQ4_XS, T.TQ1_0, T.Q1_0, T.IQ1_M], ids=lambda t: t.name)
def test_non_finite_scales_are_found(t):
    """check_tensors (ggml_validate_row_data) finds a non-finite fp16 scale; IQ1_M's is the
    top nibbles of its four scale words."""
    blk = np.zeros(5, dtype=block_dtype(t))
    if t == T.IQ1_M:
        words = blk["scales"].view("<u2")
        words[3] = [0x0000, 0x0000, 0xC000, 0x7000]    # 0x7C00: +inf
        blk["scales"] = words.view(np.uint8).reshape(5, 8)
    else:
        blk["d"][3] = np.inf
    bad = first_invalid(blk.view(np.uint8), t)
    assert (bad.index, bad.field, bad.value) == (3, "d", np.inf)
    assert first_invalid(np.zeros(5, dtype=block_dtype(t)).view(np.uint8), t) is None


def test_nvfp4_has_nothing_to_validate():
    raw = np.random.default_rng(0).integers(0, 256, 36 * 8, dtype=np.uint8)
    assert can_validate(T.NVFP4) and first_invalid(raw, T.NVFP4) is None
