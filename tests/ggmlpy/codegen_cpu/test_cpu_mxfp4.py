"""MXFP4 weights on the CPU backend: the code book lookup and the E8M0 scale (kernels/qcodes.py)
in every path a 32-block type takes, with scales from the smallest exponents (subnormal
2^-128) to the largest.

The generic sweeps (test_cpu_quant_kernels.py, test_cpu_repack.py, test_cpu_mul_mat_id.py)
draw weights by quantising normal values, which gives exponents near 127 only; here the
weight blocks are built with chosen exponents, and the activations are scaled against them
(within what their f16 block scales hold, as ggml's Q8_0 stores them) so that every product
stays a normal f32: f32 subnormal rounding is not what is tested.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cpu import repack
from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.kernels import qvec
from ggmlpy.codegen_cpu.kernels.qcodes import CODE_BOOKS
from ggmlpy.ir.ops import OpCase, SrcSpec
from ggmlpy.ir.types import GGMLType, type_size
from ggmlpy.quants import block_dtype, dequantize
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.testing.ops import build_case_graph, make_inputs, normalized_error, run_case, source_values

from .test_cpu_quant_kernels import EXACT_BAR, GGML_BAR, _flavours, _kernel_model

G = GGMLType
MX = G.MXFP4
# exponent bands (e, the block's scale 2^(e - 128)): subnormal, small, around 1, large
BANDS = {"subnormal": (0, 6), "small": (20, 40), "unit": (118, 136), "large": (200, 230)}


def mxfp4_weights(k: int, m: int, band: tuple[int, int], rng: np.random.Generator,
                  experts: int = 1) -> tuple[np.ndarray, float]:
    """Random MXFP4 rows (every code) with exponents drawn from `band`, as the uint8 storage
    the TensorStore binds ([experts, m, row bytes]), and a factor for the activations: 2^(128 -
    mid), which brings the band's products near 1, kept within 2^-6 .. 2^14 so that the
    activations' f16 scales (amax / 127) stay normal f16 numbers."""
    n_blocks = experts * m * k // 32
    blocks = np.zeros(n_blocks, block_dtype(MX))
    blocks["e"] = rng.integers(band[0], band[1] + 1, n_blocks)
    blocks["qs"] = rng.integers(0, 256, (n_blocks, 16))
    raw = blocks.view(np.uint8).reshape(experts, m, k // 32 * type_size(MX))
    return raw, float(2.0 ** min(max(128 - (band[0] + band[1]) // 2, -6), 14))


def _case(k: int, m: int, n: int, weight: bool) -> OpCase:
    return OpCase((SrcSpec(MX, (k, m, 1, 1), weight=weight), SrcSpec(G.F32, (k, n, 1, 1))),
                  label=f"MXFP4 {k}x{m} n={n}{' repacked' if weight else ''}")


def _inputs(case: OpCase, band: tuple[int, int], seed: int) -> dict[str, np.ndarray]:
    k, m = case.srcs[0].ne[:2]
    rng = np.random.default_rng(seed)
    inputs = make_inputs(case, rng)
    w, scale = mxfp4_weights(k, m, band, rng)
    inputs["src0"] = w.reshape(inputs["src0"].shape)
    inputs["src1"] = (inputs["src1"] * np.float32(scale)).astype(np.float32)
    return inputs


def _check(case: OpCase, inputs: dict, cpu: CpuBackend) -> tuple[float, float]:
    ours, _ = run_case("mul_mat", case, cpu, inputs=inputs)
    expected, _ = run_case("mul_mat", case, RefBackend(), inputs=inputs)
    w, x = source_values(case, inputs)
    model = _kernel_model(MX, inputs["src0"], w[0, 0], x[0, 0])
    return normalized_error(ours, expected), normalized_error(ours[0, 0], model)


# (K, M, N): K a multiple of 64 or not (a last step of one block), M with tail rows (not whole
# groups of 16, and fewer than a register tile), N for the one-token tiles, the register
# tiles (4..31) and the repacked prefill groups (32+)
DIRECT = [(64, 5, 1), (96, 7, 5), (160, 17, 48), (576, 13, 7), (1056, 3, 2), (2048, 9, 33)]
REPACKED = [(64, 16, 1), (96, 32, 3), (160, 16, 48), (576, 48, 7), (1056, 32, 5), (2048, 16, 300)]


@pytest.mark.parametrize("band", list(BANDS))
@pytest.mark.parametrize("k,m,n", DIRECT, ids=str)
def test_mul_mat_gguf_layout(k, m, n, band):
    vs_ref, vs_model = _check(_case(k, m, n, False), _inputs(_case(k, m, n, False), BANDS[band], k + n),
                              CpuBackend(n_threads=2))
    assert vs_ref <= GGML_BAR and vs_model <= EXACT_BAR


@pytest.mark.parametrize("band", list(BANDS))
@pytest.mark.parametrize("k,m,n", REPACKED, ids=str)
def test_mul_mat_repacked(k, m, n, band):
    case = _case(k, m, n, True)
    _, node = build_case_graph("mul_mat", case)
    assert repack.operand_repacked(node, 0)
    vs_ref, vs_model = _check(case, _inputs(case, BANDS[band], k + n), CpuBackend(n_threads=2))
    assert vs_ref <= GGML_BAR and vs_model <= EXACT_BAR


@pytest.mark.parametrize("weight", [False, True], ids=["gguf", "repacked"])
def test_every_flavour_gives_the_same_bits(weight):
    """vpshufb (vnni512, vnni256, avx2) and the select tree (generic) decode the codes alike,
    and the dots are exact integer sums: the same bits, including with every weight at the
    largest code (24, the one the AVX2 flavour's i16 partial sums are sized for) and the
    activations at 127."""
    from ggmlpy.options import Options

    k, m = 1056, 32
    for n, extreme in ((1, False), (5, False), (40, False), (1, True), (5, True)):
        case = _case(k, m, n, weight)
        inputs = _inputs(case, BANDS["unit"], n)
        if extreme:
            blocks = np.zeros(m * k // 32, block_dtype(MX))
            blocks["e"], blocks["qs"] = 127, 0x77   # code 7 (12) in both nibbles
            inputs = {"src0": blocks.view(np.uint8).reshape(inputs["src0"].shape), "src1": np.ones_like(inputs["src1"])}
        results = {f: run_case("mul_mat", case, CpuBackend(n_threads=2, options=Options(cpu_qdot=f)),
                               inputs=inputs)[0] for f in _flavours()}
        first = next(iter(results.values()))
        for f, r in results.items():
            np.testing.assert_array_equal(r, first, err_msg=f"flavour {f}, {n} tokens")
        if extreme:   # 6 * k, less the activations' f16 scale rounding
            np.testing.assert_allclose(first, np.full_like(first, 6.0 * k), rtol=1e-3)


@pytest.mark.parametrize("weight", [False, True], ids=["gguf", "repacked"])
@pytest.mark.parametrize("flavour", ["generic", None], ids=["generic", "host"])
def test_get_rows_bit_exact_over_every_exponent(weight, flavour):
    """get_rows decodes every code at every exponent 0..255 (the subnormal scales, and e >=
    254, where 12 * 2^126 overflows to inf as in ggml) bit for bit as ggmlpy.quants does."""
    k, m = 96, 48
    blocks = np.zeros(m * k // 32, block_dtype(MX))
    blocks["e"] = np.arange(blocks.size) % 256
    blocks["qs"] = np.random.default_rng(1).integers(0, 256, (blocks.size, 16))
    case = OpCase((SrcSpec(MX, (k, m, 1, 1), weight=weight), SrcSpec(G.I32, (7,), fill="rows:48")))
    inputs = {"src0": blocks.view(np.uint8).reshape(1, 1, m, -1),
              "src1": np.array([0, 15, 16, 47, 31, 20, 1], np.int32).reshape(1, 1, 1, 7)}
    qvec.set_flavour(flavour)
    try:
        ours, _ = run_case("get_rows", case, CpuBackend(n_threads=2), inputs=inputs)
    finally:
        qvec.set_flavour(None)
    expected = dequantize(np.ascontiguousarray(inputs["src0"]), MX, (k, m)).reshape(m, k)[inputs["src1"].reshape(-1)]
    np.testing.assert_array_equal(ours.reshape(expected.shape).view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("band", ["subnormal", "large"])
@pytest.mark.parametrize("weight", [False, True], ids=["gguf", "repacked"])
def test_mul_mat_id_experts(weight, band):
    """gpt-oss keeps its experts as MXFP4: mul_mat_id on them, prompt-sized, both layouts."""
    k, m, n_expert, n_used, n_tok = 160, 32, 6, 3, 9
    case = OpCase((SrcSpec(MX, (k, m, n_expert, 1), weight=weight), SrcSpec(G.F32, (k, 1, n_tok, 1)),
                   SrcSpec(G.I32, (n_used, n_tok), fill=f"unique_rows:{n_expert}")))
    rng = np.random.default_rng(3)
    inputs = make_inputs(case, rng)
    w, scale = mxfp4_weights(k, m, BANDS[band], rng, n_expert)
    inputs["src0"] = w.reshape(inputs["src0"].shape)
    inputs["src1"] = (inputs["src1"] * np.float32(scale)).astype(np.float32)
    _, node = build_case_graph("mul_mat_id", case)
    assert repack.operand_repacked(node, 0) == weight
    ours, _ = run_case("mul_mat_id", case, CpuBackend(n_threads=2), inputs=inputs)
    expected, _ = run_case("mul_mat_id", case, RefBackend(), inputs=inputs)
    assert normalized_error(ours, expected) <= GGML_BAR


def test_code_book_is_ggml_table_plus_offset():
    """The unsigned bytes the decoders produce are ggml's kvalues_mxfp4 + 12 (0..24), and
    WEIGHT_BYTE_MAX (what the AVX2 flavour sizes its i16 sums by) is their largest."""
    ggml = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    assert list(CODE_BOOKS[MX]) == [v + 12 for v in ggml]
    assert qvec.WEIGHT_BYTE_MAX[MX] == max(CODE_BOOKS[MX])
