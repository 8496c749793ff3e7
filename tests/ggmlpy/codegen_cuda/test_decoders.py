"""The dq8_<type> decoders of common.cu.j2, bit for bit: get_rows of every row of a table of
random blocks (any bit pattern in every field, finite scales: ggmlpy/testing/ops.py
random_blocks) against ggmlpy.quants.dequantize (ggml's dequantize_row_*), for every
quantised weight type, on each device. The grid I-quants' tables reach every grid index, as
do the inputs of their op cases (cases.py WEIGHT_ROWS, test_ops.py's seed)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cuda.backend import CudaBackend
from ggmlpy.codegen_cuda.steps import DQ8_TYPES
from ggmlpy.ir.ops.registry import OpCase, SrcSpec
from ggmlpy.ir.types import GGMLType, is_quantized
from ggmlpy.quants import block_dtype, dequantize
from ggmlpy.testing.ops import build_case_graph, make_inputs, random_blocks, run_case

from .cases import WEIGHT_ROWS, extra_cases, graph_specs, lower_options

G = GGMLType
K = 256
QUANT_TYPES = [t for t in DQ8_TYPES if is_quantized(t)]


def grid_indices(t: GGMLType, data: np.ndarray) -> tuple[np.ndarray, int] | None:
    """Every grid index the blocks in `data` use, and the grid's size (None: not a grid type)."""
    blk = np.ascontiguousarray(data).reshape(-1).view(block_dtype(t))
    n = len(blk)

    def raw(field: str) -> np.ndarray:
        return np.ascontiguousarray(blk[field]).view(np.uint8).reshape(n, -1).astype(np.int64)

    if t == G.IQ2_XXS:   # per 32 elements: 4 index bytes, then a sign/scale word
        return raw("qs").reshape(n, 8, 8)[:, :, :4], 256
    if t == G.IQ2_XS:    # 9-bit index in each u16
        return blk["qs"].astype(np.int64) & 511, 512
    if t == G.IQ2_S:     # qs[g] | bits 2 (g % 4) of qh[g / 4] << 8
        g = np.arange(32)
        return raw("qs")[:, :32] | (((raw("qh")[:, g // 4] >> (2 * (g % 4))) & 3) << 8), 1024
    if t == G.IQ3_XXS:   # 64 index bytes
        return raw("qs")[:, :64], 256
    if t == G.IQ3_S:     # qs[g] | bit g % 8 of qh[g / 8] << 8
        g = np.arange(64)
        return raw("qs") | (((raw("qh")[:, g // 8] >> (g % 8)) & 1) << 8), 512
    if t == G.IQ1_S:     # qs[4 i + l] | bits 3 l of qh[i] << 8
        g = np.arange(32)
        qh = blk["qh"].astype(np.int64)
        return raw("qs") | (((qh[:, g // 4] >> (3 * (g % 4))) & 7) << 8), 2048
    if t == G.IQ1_M:     # qs[g] | (nibble g % 2 of qh[g / 2] & 7) << 8
        g = np.arange(32)
        return raw("qs") | (((raw("qh")[:, g // 2] >> (4 * (g % 2))) & 7) << 8), 2048
    return None


def assert_every_index(t: GGMLType, data: np.ndarray) -> None:
    found = grid_indices(t, data)
    if found is not None:
        idx, size = found
        missing = np.setdiff1d(np.arange(size), idx)
        assert missing.size == 0, f"{t.name}: {missing.size} of {size} grid indices not reached"


def table_case(t: GGMLType) -> OpCase:
    rows = WEIGHT_ROWS.get(t, 8)
    return OpCase((SrcSpec(t, (K, rows, 1, 1)), SrcSpec(G.I32, (rows,))), label=t.name)


@pytest.fixture(scope="module")
def backend(device):
    """One backend for every type's get_rows, its kernels compiled in one module."""
    kind, driver = device
    be = CudaBackend(driver=driver)
    specs = {}
    for t in QUANT_TYPES:
        g, _ = build_case_graph("get_rows", table_case(t))
        specs.update({s.name: s for s in graph_specs(g, lower_options("default"))})
    be.ensure_kernels(specs.values())
    return kind, be


@pytest.mark.parametrize("ttype", QUANT_TYPES, ids=lambda t: t.name)
def test_decoder_is_bit_exact(backend, ttype):
    kind, be = backend
    case = table_case(ttype)
    rows = case.srcs[0].ne[1]
    table = random_blocks(ttype, (rows, K), np.random.default_rng(11))
    assert_every_index(ttype, table)
    ours, _ = run_case("get_rows", case, be, {"src0": table, "src1": np.arange(rows, dtype=np.int32)})
    ref = dequantize(table, ttype, (K, rows, 1, 1)).reshape(ours.shape)
    same = ours.view(np.uint32) == ref.view(np.uint32)
    bad = np.argwhere(~same)
    assert same.all(), f"{kind}: {len(bad)} values differ, first at (row, col) {tuple(bad[0])}: " \
                       f"{ours[tuple(bad[0])]!r} vs {ref[tuple(bad[0])]!r}"


@pytest.mark.parametrize("ttype", [t for t in WEIGHT_ROWS if grid_indices(t, random_blocks(
    t, (1, K), np.random.default_rng(0))) is not None], ids=lambda t: t.name)
def test_op_cases_reach_every_grid_index(ttype):
    """The mul_mat cases of a grid type (test_ops.py's inputs: seed 7) use every grid point."""
    cases = [c for op, c in extra_cases() if op == "mul_mat" and c.srcs[0].type == ttype]
    assert cases
    for case in cases:
        assert_every_index(ttype, make_inputs(case, np.random.default_rng(7))["src0"])
