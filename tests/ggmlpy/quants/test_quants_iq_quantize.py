"""Reference quantisation of the I-quants without an importance matrix, the ternary types,
NVFP4, Q1_0 and Q2_0: byte for byte against ggml's quantize_row_*_ref and ggml_quantize_chunk
(stored by make_ggml_quant_cases.py), against the gguf package where it quantises, and
round-trip properties that follow from each format."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggmlpy.ir.types import GGMLType, block_size, type_size
from ggmlpy.quants import QUANTIZABLE, block_dtype, dequantize, quantize
from ggmlpy.quants import iq_grids
from ggmlpy.quants import quant as quant_module
from ggmlpy.quants.dequant_blocks import UE4M3_HALF
from ggmlpy.quants.quant_blocks import fp32_to_ue4m3
from ggmlpy.quants.quant_iq import iq4_nl_file
from ggmlpy.quants.quant_iq_grid import grid

T = GGMLType
F32 = np.float32
CASES = np.load(Path(__file__).with_name("data") / "ggml_quant_cases.npz")
GRID_TYPES = [T.IQ3_XXS, T.IQ3_S, T.IQ2_S]
QUANT_TYPES = GRID_TYPES + [T.IQ4_NL, T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.NVFP4, T.Q1_0, T.Q2_0]


def rows_for(t: GGMLType) -> np.ndarray:
    """The stored inputs of t: every row, and the huge ones but for the grid searches (ggml
    aborts on them: their squares overflow)."""
    x = CASES["q_x"]
    return x if t in GRID_TYPES else np.concatenate([x, CASES["q_x_huge"]])


def encode(x: np.ndarray, t: GGMLType) -> np.ndarray:
    with np.errstate(all="ignore"):
        return quantize(x, t)


def skipped_blocks(x: np.ndarray) -> np.ndarray:
    """IQ4_NL blocks below GROUP_MAX_EPS, whose quants ggml leaves as its buffer held them."""
    return np.abs(x.reshape(-1, 32)).max(axis=1) < F32(1e-15)


@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_equals_ggml_reference_quantizer(t):
    x = rows_for(t)
    ours = encode(x, t).reshape(-1)
    ref = CASES[f"q_ref_{t.name}"]
    assert ours.shape == ref.shape
    if t == T.IQ4_NL:   # compare only the scales of the blocks ggml skips
        keep = np.ones((len(ours) // 18, 18), bool)
        keep[skipped_blocks(x), 2:] = False
        ours, ref = ours[keep.reshape(-1)], ref[keep.reshape(-1)]
    np.testing.assert_array_equal(ours, ref)


def test_cases_cover_the_search_corners():
    x = CASES["q_x"]
    assert skipped_blocks(x).any() and (~skipped_blocks(x)).any()
    sub32 = np.abs(x.reshape(-1, 8, 32)).max(axis=2)
    assert ((sub32 == 0).any(axis=1) & (sub32 > 0).any(axis=1)).any()   # IQ3_S's zero sub-blocks
    assert (np.signbit(x) & (x == 0)).any()


def test_iq4_nl_file_quantizer_equals_ggml_quantize_chunk():
    """quantize_iq4_nl (ntry = 7, what llama-quantize writes) differs from the _ref; zero
    blocks are defined there: d = 0 and every level 8."""
    x = rows_for(T.IQ4_NL)
    with np.errstate(all="ignore"):
        ours = iq4_nl_file(x.reshape(-1, 32)).view(np.uint8)
    np.testing.assert_array_equal(ours, CASES["q_chunk_IQ4_NL"])
    assert not np.array_equal(ours, CASES["q_ref_IQ4_NL"])


@pytest.mark.parametrize("t", [t for t in QUANT_TYPES if t != T.IQ4_NL], ids=lambda t: t.name)
def test_ggml_writes_files_with_the_same_quantizer(t):
    """ggml_quantize_chunk without an imatrix gave the _ref's bytes (so none were stored)."""
    assert f"q_chunk_{t.name}" not in CASES.files


@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_quantizable(t):
    assert t in QUANTIZABLE


@pytest.mark.parametrize("t", GRID_TYPES + [T.IQ4_XS], ids=lambda t: t.name)
def test_chunking_does_not_change_bytes(monkeypatch, t):
    x = CASES["q_x"][:6]
    whole = encode(x, t)
    monkeypatch.setattr(quant_module, "CHUNK_ELEMENTS", 768)
    np.testing.assert_array_equal(encode(x, t), whole)


# ---- properties of each format's choice ----

def decoded(x: np.ndarray, t: GGMLType) -> tuple[np.ndarray, np.ndarray]:
    q = encode(x, t)
    return q.reshape(-1).view(block_dtype(t)), dequantize(q, t, tuple(reversed(x.shape))).reshape(-1, block_size(t))


def test_ternary_values_are_nearest_of_minus_d_zero_d():
    x = CASES["q_x"][:8]
    for t in (T.TQ1_0, T.TQ2_0):
        blk, y = decoded(x, t)
        d = blk["d"].astype(F32)[:, None]
        xs = x.reshape(y.shape).astype(np.float64)
        amax = np.abs(xs).max(axis=1, keepdims=True)
        np.testing.assert_array_equal(np.broadcast_to(d, y.shape)[y != 0], np.abs(y)[y != 0])
        assert np.all(np.sign(y) == np.sign(xs) * (y != 0))
        ratio = np.abs(xs) / np.where(amax > 0, amax, 1)       # nonzero from half of amax on
        clear = np.abs(ratio - 0.5) > 1e-6
        np.testing.assert_array_equal((y != 0)[clear], (ratio >= 0.5)[clear])


def test_q1_0_keeps_signs_and_mean_magnitude():
    x = CASES["q_x"][:8]
    blk, y = decoded(x, T.Q1_0)
    xs = x.reshape(y.shape)
    assert np.all((y >= 0) == (xs >= 0) | (blk["d"][:, None] == 0) & (xs >= 0))
    np.testing.assert_allclose(blk["d"].astype(np.float64), np.abs(xs).mean(axis=1), rtol=1e-3)


def test_q2_0_codes():
    x = CASES["q_x"][:8]
    blk, y = decoded(x, T.Q2_0)
    d = blk["d"].astype(F32)[:, None]
    codes = np.where(d != 0, y / np.where(d != 0, d, 1), 0)
    assert set(np.unique(codes)) <= {-1.0, 0.0, 1.0}      # 2d (code 3) is never chosen


def test_nvfp4_scale_and_nearest_code():
    x = CASES["q_x"][:8]
    blk, y = decoded(x, T.NVFP4)
    sub = x.reshape(-1, 16).astype(np.float64)
    d = UE4M3_HALF[blk["d"].reshape(-1)].astype(np.float64)
    codes = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float64)
    best = np.abs(sub[:, :, None] - d[:, None, None] * codes).min(axis=2)
    np.testing.assert_array_equal(np.abs(sub - y.reshape(sub.shape)), best)


def test_ue4m3_encoding_round_trips_codes_below_256():
    """Codes 1-0x77 encode back to themselves; ggml's encoder saturates every value from 256
    (exponent field 15) on to 0x7E = 448, so 0x78-0x7D are never written."""
    codes = np.arange(1, 0x78).astype(np.uint8)
    np.testing.assert_array_equal(fp32_to_ue4m3(2 * UE4M3_HALF[codes]), codes)
    assert np.all(fp32_to_ue4m3(2 * UE4M3_HALF[np.arange(0x78, 0x7F)]) == 0x7E)
    corners = np.array([0, -1, np.nan, 1e9, 2.0**-12, 0.49 * 2.0**-9, 2.0**-10], F32)
    assert list(fp32_to_ue4m3(corners)) == [0, 0, 0, 0x7E, 0, 0, 1]


def test_iq4_xs_levels_are_nearest_for_the_decoded_scales():
    x = CASES["q_x"][:8]
    blk, y = decoded(x, T.IQ4_XS)
    xs = x.reshape(-1, 8, 32)
    kv = iq_grids.KVALUES_IQ4NL.astype(np.float64)
    ls = np.stack([blk["scales_l"] & 15, blk["scales_l"] >> 4], axis=2).reshape(-1, 8)
    ls = (ls | (((blk["scales_h"][:, None] >> np.arange(0, 16, 2)) & 3) << 4)).astype(np.float64) - 32
    dl = blk["d"].astype(np.float64)[:, None] * ls
    grid_ = dl[:, :, None, None] * kv
    best = np.abs(xs[..., None] - grid_).min(axis=-1)
    err = np.abs(xs - y.reshape(xs.shape))
    assert np.all(err <= best + 1e-3 * np.abs(dl)[:, :, None] * 127 + 1e-30)


def test_more_bits_means_less_error():
    x = CASES["q_x"][:2]   # normal and uniform rows
    order = [T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ4_XS]
    rmse = [np.sqrt(np.mean((dequantize(encode(x, t), t, (1024, 2)) - x) ** 2)) for t in order]
    assert rmse == sorted(rmse, reverse=True), dict(zip([t.name for t in order], rmse))


@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_shape(t):
    x = np.random.default_rng(1).standard_normal((2, 3, 512)).astype(F32)
    q = encode(x, t)
    assert q.shape == (2, 3, 512 // block_size(t) * type_size(t)) and q.dtype == np.uint8


# ---- the grid searches' neighbour tables (ggml's iq*_init_impl) ----

@pytest.mark.parametrize("t, nwant", [(T.IQ3_XXS, 2), (T.IQ3_S, 3), (T.IQ2_S, 1)], ids=lambda v: str(v))
def test_neighbours_are_the_nearest_grid_points(t, nwant):
    g = grid(t)
    pos = 2 * g.levels.astype(np.int64) + 1
    rng = np.random.default_rng(0)
    off = np.flatnonzero(g.row > 0)
    for code in rng.choice(off, 50, replace=False):
        point = np.array([(code >> (g.bits * i)) & ((1 << g.bits) - 1) for i in range(pos.shape[1])])
        d2 = ((pos - (2 * point + 1)) ** 2).sum(axis=1)
        listed = g.neighbours[g.row[code], :g.count[g.row[code]]]
        wanted = np.flatnonzero(d2 <= np.unique(d2)[nwant - 1])
        assert sorted(listed) == sorted(wanted)
        assert list(np.lexsort((listed, d2[listed]))) == list(range(len(listed)))   # by (distance, index)
    assert (g.kmap >= 0).sum() == len(g.levels)
