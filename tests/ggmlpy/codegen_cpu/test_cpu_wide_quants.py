"""Q2_0, Q1_0 and NVFP4 on the CPU backend (kernels/qwide.py) with blocks whose code bytes take
every value 0..255 and whose NVFP4 scale bytes do too (UE4M3's subnormals, its largest
exponent and 0x7F, which ggml reads as 0): quantised random numbers reach few of them.

get_rows must give ggmlpy.quants.dequantize's values bit for bit (signs of zero included: Q1_0
with d = 0 gives -0.0 for a clear bit), and mul_mat must meet test_cpu_quant_kernels.py's two
oracles on every dot flavour the host runs.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.kernels import qvec
from ggmlpy.codegen_cpu.kernels.qdot import KINDS
from ggmlpy.codegen_cpu.kernels.qwide import WIDE_KINDS
from ggmlpy.ir.ops import OpCase, SrcSpec
from ggmlpy.ir.types import GGMLType, block_size, type_size
from ggmlpy.quants import block_dtype, dequantize
from ggmlpy.testing.ops import random_blocks, run_case

from .test_cpu_grid_quants import check_mul_mat
from .test_cpu_quant_kernels import WIDE, _flavours

G = GGMLType
K = 256          # two to four blocks a row
ROWS = 48


def _blocks(t: GGMLType) -> np.ndarray:
    """ROWS rows of K: qs bytes run through 0..255 in order; NVFP4's scale bytes too, the f16
    d's are small and a few are zero."""
    rng = np.random.default_rng(int(t))
    n = ROWS * K // block_size(t)
    blocks = random_blocks(t, (n * block_size(t),), rng).view(block_dtype(t)).reshape(n)
    qs = blocks["qs"]
    qs[...] = (np.arange(qs.size) % 256).reshape(qs.shape)
    if t == G.NVFP4:
        d = blocks["d"]
        d[...] = (np.arange(d.size) * 7 % 256).reshape(d.shape)   # 7 is odd: every byte
    else:
        blocks["d"][::5] = 0.0
    return blocks.view(np.uint8).reshape(ROWS, K // block_size(t) * type_size(t))


@pytest.mark.parametrize("t", WIDE, ids=lambda t: t.name)
def test_blocks_reach_every_byte(t):
    blocks = _blocks(t).reshape(-1).view(block_dtype(t))
    assert sorted(set(blocks["qs"].reshape(-1).tolist())) == list(range(256))
    if t == G.NVFP4:
        assert sorted(set(blocks["d"].reshape(-1).tolist())) == list(range(256))
    else:
        assert (blocks["d"] == 0).any()


@pytest.mark.parametrize("t", WIDE, ids=lambda t: t.name)
def test_get_rows_is_dequantize_bit_for_bit(t):
    data = _blocks(t)
    case = OpCase((SrcSpec(t, (K, ROWS, 1, 1)), SrcSpec(G.I32, (ROWS,), fill=f"rows:{ROWS}")))
    ids = np.random.default_rng(3).permutation(ROWS).astype(np.int32)
    ours, _ = run_case("get_rows", case, CpuBackend(n_threads=2), inputs={"src0": data, "src1": ids})
    expected = dequantize(data, t, (K, ROWS))[ids]
    assert np.array_equal(ours.reshape(ROWS, K).view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("t", WIDE, ids=lambda t: t.name)
@pytest.mark.parametrize("flavour", _flavours(), indirect=True)
@pytest.mark.parametrize("n", [1, 5, 40])
def test_mul_mat_on_every_byte(flavour, t, n):
    """Decode (one token) and the direct tiles (the operand is no model weight, so Q1_0's is
    not repacked either: test_cpu_repack.py has its repacked path)."""
    check_mul_mat(t, _blocks(t), n)


@pytest.mark.parametrize("t", WIDE, ids=lambda t: t.name)
def test_byte_range_is_what_the_dots_are_told(t):
    """WEIGHT_BYTE_MAX (the avx2 flavour's i16 grouping) is the largest unsigned weight byte:
    the largest value plus the offset (Q1_0 +1, Q2_0 2, NVFP4's doubled E2M1 12)."""
    kind = KINDS[t]
    assert WIDE_KINDS[t] is kind
    weights = dequantize(_blocks(t), t, (K, ROWS))
    blocks = _blocks(t).reshape(-1).view(block_dtype(t))
    largest = {G.Q1_0: 1, G.Q2_0: 2, G.NVFP4: 12}[t]
    if t != G.NVFP4:   # the values over their scale reach `largest` and no further
        d = np.repeat(blocks["d"].astype(np.float32), block_size(t)).reshape(weights.shape)
        ratio = weights[d != 0] / d[d != 0]
        assert ratio.max() == largest and ratio.min() == -1
    assert qvec.WEIGHT_BYTE_MAX[t] == largest + kind.offset
