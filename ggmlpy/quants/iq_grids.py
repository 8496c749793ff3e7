"""The lookup tables of ggml's I-quants, as numpy arrays.

The tables themselves are ggml's (ggml-common.h), copied into iq_grids.npz beside this file
by make_iq_grids.py; they are too long to keep readable as Python literals. Each grid entry
packs 8 (IQ2, IQ1) or 4 (IQ3) small values one per byte, little-endian, which ggml reads
through a byte pointer: the `*_VALUES` arrays here are those bytes, one row per grid index,
ready for a fancy-indexing gather.

The quantisers search grid points by their *levels* (each value's rank among the grid's
distinct values, the `2*l + 1` positions of ggml's kgrid tables), so the level form of each
searched grid is derived here too; make_iq_grids.py checks that it equals ggml's kgrid_*.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

# ggml's kvalues_iq4nl: the sixteen non-linear 4-bit levels of IQ4_NL and IQ4_XS (the CPU
# kernels import this name)
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                         dtype=np.int8)

with np.load(Path(__file__).resolve().with_name("iq_grids.npz")) as _tables:
    _T = {name: _tables[name] for name in _tables.files}

KMASK_IQ2XS: np.ndarray = _T["kmask_iq2xs"]       # bit j of a sign byte: 1 << j
# 7 stored sign bits -> 8: bit 7 makes the number of set bits even (an even number of minus
# signs, which the quantiser guarantees by flipping the least important element)
KSIGNS_IQ2XS: np.ndarray = _T["ksigns_iq2xs"]
IQ2XXS_GRID: np.ndarray = _T["iq2xxs_grid"]       # 256 x 8 bytes
IQ2XS_GRID: np.ndarray = _T["iq2xs_grid"]         # 512 x 8 bytes
IQ2S_GRID: np.ndarray = _T["iq2s_grid"]           # 1024 x 8 bytes
IQ3XXS_GRID: np.ndarray = _T["iq3xxs_grid"]       # 256 x 4 bytes
IQ3S_GRID: np.ndarray = _T["iq3s_grid"]           # 512 x 4 bytes
IQ1S_GRID: np.ndarray = _T["iq1s_grid"]           # 2048 x 8 signed bytes, each -1, 0 or 1

if not np.array_equal(_T["kvalues_iq4nl"], KVALUES_IQ4NL):
    raise ImportError("iq_grids.npz disagrees with KVALUES_IQ4NL: regenerate it (make_iq_grids.py)")


def grid_values(grid: np.ndarray, signed: bool = False) -> np.ndarray:
    """A grid's entries as rows of their bytes (uint8, or int8 for IQ1S's -1/0/1)."""
    width = grid.dtype.itemsize
    rows = np.ascontiguousarray(grid.astype(grid.dtype.newbyteorder("<"))).view(np.uint8)
    return rows.reshape(-1, width).view(np.int8 if signed else np.uint8)


IQ2XXS_VALUES = grid_values(IQ2XXS_GRID)
IQ2XS_VALUES = grid_values(IQ2XS_GRID)
IQ2S_VALUES = grid_values(IQ2S_GRID)
IQ3XXS_VALUES = grid_values(IQ3XXS_GRID)
IQ3S_VALUES = grid_values(IQ3S_GRID)
IQ1S_VALUES = grid_values(IQ1S_GRID, signed=True)

# sign byte -> the eight factors ggml multiplies by: -1.0f where the byte's bit j is set
SIGN_FACTORS = np.where(np.arange(256)[:, None] & KMASK_IQ2XS[None, :], -1.0, 1.0).astype(np.float32)


def levels(values: np.ndarray) -> np.ndarray:
    """Grid rows -> each value's rank among the grid's distinct values (ggml's level l,
    the value 2*l + 1 of its kgrid tables), as int8."""
    return np.searchsorted(np.unique(values), values).astype(np.int8)
