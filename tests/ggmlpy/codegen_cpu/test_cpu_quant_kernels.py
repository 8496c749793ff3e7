"""The CPU backend's quantised kernels: mul_mat on quantised weights and get_rows on quantised
tables, over a sweep of shapes, every weight type and every dot flavour.

Two oracles for mul_mat:
- the reference backend (f32 activations), with ggml's test-backend-ops bar for quantised
  matrix products (NMSE 5e-4): the 8-bit activations are the only approximation allowed;
- an exact numpy model of the kernel's own scheme (activations rounded to 8 bits per block
  of 32, or per 256 for K-quants, as ggml's x86 quantize_row_q8_0/q8_1/q8_K do), which
  leaves only f32 rounding (NMSE ~1e-12): a wrong lane, scale, offset or minimum anywhere
  shows up here even when it would hide under 5e-4.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import llvmlite.ir as ir
import numpy as np
import pytest

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.irgen import KernelBuilder, declare_barrier
from ggmlpy.codegen_cpu.kernels import qvec
from ggmlpy.codegen_cpu.lowering import LOWERINGS
from ggmlpy.codegen_cpu.target import host
from ggmlpy.ir.ops import OpCase, SrcSpec
from ggmlpy.testing.ops import (
    build_case_graph, compare_backends, make_inputs, normalized_error, run_case, source_values,
)
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import block_dtype
from ggmlpy.sched.ref_backend import RefBackend

G = GGMLType
BLOCK32 = (G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q8_0, G.MXFP4, G.IQ4_NL)
MINIMUMS = (G.Q4_1, G.Q5_1)   # d * q + m: the activations' sums meet the minimums
# the grid I-quants and ternary types (kernels/qgrid.py); random valid blocks where no quantiser exists
GRID = (G.IQ3_S, G.IQ3_XXS, G.IQ2_S, G.IQ2_XS, G.IQ2_XXS, G.IQ1_S, G.IQ1_M, G.TQ2_0, G.TQ1_0)
KQUANTS = (G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K, G.IQ4_XS) + GRID   # super-blocks of 256
WIDE = (G.Q2_0, G.NVFP4, G.Q1_0)   # blocks of 64 and 128 against activations in 32s (kernels/qwide.py)
GGML_BAR = 5e-4     # test-backend-ops' bar for quantised mul_mat
EXACT_BAR = 1e-9    # f32 rounding only

# (K, M weight rows, N tokens): odd row counts, 1/7/32/300 tokens, odd block counts, K to 2048
SHAPES_32 = [(64, 5, 1), (96, 7, 5), (576, 13, 7), (1024, 33, 32), (2048, 9, 13), (640, 3, 2), (160, 17, 48)]
SHAPES_K = [(256, 5, 1), (768, 13, 7), (1024, 33, 32), (2048, 9, 13), (512, 3, 2), (256, 18, 40)]
SHAPES_WIDE = [(128, 5, 1), (384, 7, 5), (640, 13, 7), (1024, 33, 32), (2048, 9, 13), (256, 17, 48)]


def _flavours() -> list[str]:
    h = host()
    out = ["generic"]
    if h.has("avx2"):
        out.append("avx2")
    if h.has("avxvnni") or (h.has("avx512vnni") and h.has("avx512vl")):
        out.append("vnni256")
    if h.vnni512:
        out.append("vnni512")
    return out


def _sweep(shapes: list[tuple[int, int, int]]) -> list[tuple[str, tuple[int, int, int]]]:
    """Every shape with the host's own flavour; three (a lone token, direct tiles, repacked
    groups) with each other flavour the host can run."""
    best = qvec.flavour()
    out = [(best, s) for s in shapes]
    for f in _flavours():
        if f != best:
            out += [(f, shapes[i]) for i in (0, 1, 3)]
    return out


@pytest.fixture(scope="module")
def ref():
    return RefBackend()


def _case(t: GGMLType, k: int, m: int, n: int) -> OpCase:
    return OpCase((SrcSpec(t, (k, m, 1, 1)), SrcSpec(G.F32, (k, n, 1, 1))), label=f"{t.name} {k}x{m} n={n}")


def _kernel_model(t: GGMLType, wdata: np.ndarray, weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x @ weights.T with x rounded as ggml's x86 quantize_row_q8_0/q8_1/q8_K round it, in
    float64: q = round-half-even(x * f32(127 / amax)); d = f16(amax / 127) per 32 (Q8_0/Q8_1),
    or 1 / (127 / amax) per 256 (Q8_K); Q4_1's and Q5_1's minimums meet Q8_1's s = f16(d * sum(q))."""
    block = 256 if t in KQUANTS else 32
    n, k = x.shape
    xb = x.reshape(n, k // block, block).astype(np.float32)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
        q = np.rint(xb * inv)
        if block == 256:
            d = np.where(inv > 0, np.float32(1.0) / inv, np.float32(0.0)).astype(np.float64)
        else:
            d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float64)
    if t not in MINIMUMS:
        return (q.astype(np.float64) * d).reshape(n, k) @ weights.astype(np.float64).T
    blocks = wdata.reshape(-1).view(block_dtype(t)).reshape(weights.shape[0], k // 32)
    mins = blocks["m"].astype(np.float64)                                  # [rows, blocks]
    scaled = weights.astype(np.float64) - np.repeat(mins, 32, axis=1)       # d_w * u
    d32 = (amax / np.float32(127.0)).astype(np.float32)[..., 0]             # unrounded d
    s = (d32 * q.sum(axis=-1).astype(np.float32)).astype(np.float16).astype(np.float64)
    return (q.astype(np.float64) * d).reshape(n, k) @ scaled.T + s @ mins.T


def _check(t: GGMLType, k: int, m: int, n: int, cpu, ref, seed: int = 0) -> tuple[float, float]:
    case = _case(t, k, m, n)
    inputs = make_inputs(case, np.random.default_rng(seed))
    ours, _ = run_case("mul_mat", case, cpu, inputs=inputs)
    expected, _ = run_case("mul_mat", case, ref, inputs=inputs)
    w, x = source_values(case, inputs)
    model = _kernel_model(t, inputs["src0"], w[0, 0], x[0, 0])
    return normalized_error(ours, expected), normalized_error(ours[0, 0], model)


def _mul_mat_cases() -> list:
    """(type, flavour, shape): each family's types over its shapes (_sweep)."""
    return [pytest.param(t, f, shape, id=f"{t.name}-{f}-{shape}")
            for types, shapes in ((BLOCK32, SHAPES_32), (KQUANTS, SHAPES_K), (WIDE, SHAPES_WIDE))
            for t in types for f, shape in _sweep(shapes)]


@pytest.mark.parametrize("t,flavour,shape", _mul_mat_cases(), indirect=["flavour"])
def test_mul_mat(flavour, ref, t, shape):
    vs_ref, vs_model = _check(t, *shape, CpuBackend(n_threads=2), ref)
    assert vs_ref <= GGML_BAR
    assert vs_model <= EXACT_BAR


@pytest.mark.parametrize("t", BLOCK32 + KQUANTS + WIDE, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 7, 512])
def test_quantised_products_run_on_the_cpu(t, n):
    """supports() says yes for every quantised weight type with a kernel, so the scheduler
    gives its products to the CPU backend rather than the numpy reference."""
    k = 256 if t in KQUANTS + WIDE else 64
    graph, _ = build_case_graph("mul_mat", _case(t, k, 9, n))
    assert all(CpuBackend(n_threads=1).supports_op(node) for node in graph.nodes)


@pytest.mark.parametrize("t,k,m,n", [(G.Q4_1, 1536, 11, 512), (G.Q8_0, 576, 65, 300), (G.Q6_K, 1024, 7, 130)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_prefill_sizes(ref, t, k, m, n):
    """Hundreds of tokens: several L2-sized token blocks, full tiles and leftover tokens."""
    vs_ref, vs_model = _check(t, k, m, n, CpuBackend(n_threads=2), ref, seed=1)
    assert vs_ref <= GGML_BAR
    assert vs_model <= EXACT_BAR


@pytest.mark.parametrize("t", [G.Q4_1, G.Q5_0, G.Q5_1, G.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 9, 40])
def test_result_independent_of_threads(ref, t, n):
    """Rows are split between threads; a row's result must not depend on the split (decode,
    direct tiles, and from 32 tokens on the repacked groups of 16 rows)."""
    k = 512 if t in KQUANTS else 576
    case = _case(t, k, 37, n)
    inputs = make_inputs(case, np.random.default_rng(5))
    results = [run_case("mul_mat", case, CpuBackend(n_threads=n), inputs=inputs)[0] for n in (1, 2, 3)]
    assert np.array_equal(results[0], results[1]) and np.array_equal(results[0], results[2])


def test_zero_activations_give_zero(ref):
    """An all-zero activation block has scale 0: no division by zero, exact zeros out."""
    case = OpCase((SrcSpec(G.Q4_1, (64, 4, 1, 1)), SrcSpec(G.F32, (64, 3, 1, 1), fill="zeros")))
    out, _ = run_case("mul_mat", case, CpuBackend(n_threads=1), rng=np.random.default_rng(0))
    assert np.array_equal(out, np.zeros_like(out))


def test_single_activation_hand_computed():
    """One Q8_0 block of weights 0..31 (scale 1) against x = 15.875 * e_5 (15.875 / 127 =
    1/8, exact in f16): the result is 5 * 15.875."""
    case = OpCase((SrcSpec(G.Q8_0, (32, 1, 1, 1)), SrcSpec(G.F32, (32, 1, 1, 1))))
    block = np.zeros(34, dtype=np.uint8)
    block[:2] = np.frombuffer(np.float16(1.0).tobytes(), dtype=np.uint8)
    block[2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    x = np.zeros((1, 1, 1, 32), dtype=np.float32)
    x[..., 5] = 15.875
    out, _ = run_case("mul_mat", case, CpuBackend(n_threads=1),
                      inputs={"src0": block.reshape(1, 1, 1, 34), "src1": x})
    assert out.reshape(-1).tolist() == [5 * 15.875]


# dot flavours --------------------------------------------------------------------------------
def _kernel_ir(t: GGMLType) -> str:
    graph, node = build_case_graph("mul_mat", _case(t, 256, 4, 3))
    module = ir.Module(name="t")
    declare_barrier(module)
    kb = KernelBuilder(module, "k")
    LOWERINGS["mul_mat"].emit(kb, node)
    kb.finish()
    return str(module)


@pytest.mark.parametrize("name,intrinsic", [("vnni512", "llvm.x86.avx512.vpdpbusd.512"),
                                            ("vnni256", "llvm.x86.avx512.vpdpbusd.256"),
                                            ("avx2", "llvm.x86.avx2.pmadd.ub.sw"),
                                            ("generic", None)])
def test_flavour_selects_the_dot_instruction(name, intrinsic):
    qvec.set_flavour(name)
    try:
        text = _kernel_ir(G.Q4_1)
    finally:
        qvec.set_flavour(None)
    if intrinsic is None:
        assert "vpdpbusd" not in text and "pmadd.ub" not in text
    else:
        assert intrinsic in text


def test_unknown_flavour_is_refused():
    with pytest.raises(ValueError, match="flavour"):
        qvec.set_flavour("avx9000")


def test_host_flavour_uses_vnni_where_present():
    expected = "vnni512" if host().vnni512 else None
    if expected is None:
        pytest.skip("host has no AVX-512 VNNI")
    assert qvec.flavour() == "vnni512"


# get_rows ------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", BLOCK32 + KQUANTS + WIDE, ids=lambda t: t.name)
def test_get_rows_quantised_tables(ref, t):
    k = 512 if t in KQUANTS + WIDE else 96
    case = OpCase((SrcSpec(t, (k, 13, 1, 1)), SrcSpec(G.I32, (9,), fill="rows:13")), label=t.name)
    cpu = CpuBackend(n_threads=2)
    graph, _ = build_case_graph("get_rows", case)
    assert all(cpu.supports_op(n) for n in graph.nodes)
    assert compare_backends("get_rows", case, cpu, ref, np.random.default_rng(2)) <= 1e-12


# memory safety -------------------------------------------------------------------------------
GUARD_SCRIPT = textwrap.dedent("""
    import ctypes, mmap, sys
    import numpy as np
    from ggmlpy.codegen_cpu.backend import CpuBackend
    from ggmlpy.ir.ops import OpCase, SrcSpec
    from ggmlpy.testing.ops import build_case_graph, make_inputs
    from ggmlpy.ir.types import GGMLType, row_size
    from ggmlpy.sched.store import TensorStore

    PAGE = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for name, k, rows, op in [("Q4_1", 576, 3, "mul_mat"), ("Q8_0", 64, 2, "mul_mat"),
                              ("Q5_0", 96, 3, "mul_mat"), ("Q6_K", 256, 2, "mul_mat"),
                              ("Q5_1", 96, 3, "mul_mat"), ("Q5_1", 96, 3, "get_rows"),
                              ("Q4_K", 256, 1, "get_rows"), ("Q5_0", 96, 3, "get_rows"),
                              ("MXFP4", 96, 3, "mul_mat"), ("MXFP4", 96, 3, "get_rows"),
                              ("IQ1_S", 256, 2, "mul_mat"), ("IQ3_XXS", 256, 1, "get_rows"),
                              ("IQ2_XXS", 256, 3, "mul_mat"), ("TQ1_0", 256, 2, "mul_mat"),
                              ("NVFP4", 128, 3, "mul_mat"), ("Q1_0", 128, 2, "mul_mat"),
                              ("Q2_0", 192, 3, "get_rows"), ("Q1_0", 256, 1, "get_rows")]:
        t = GGMLType[name]
        if op == "mul_mat":
            case = OpCase((SrcSpec(t, (k, rows, 1, 1)), SrcSpec(GGMLType.F32, (k, 5, 1, 1))))
        else:
            case = OpCase((SrcSpec(t, (k, rows, 1, 1)), SrcSpec(GGMLType.I32, (4,), fill="rows:%d" % rows)))
        inputs = make_inputs(case, np.random.default_rng(0))
        nbytes = row_size(t, k) * rows
        mm = mmap.mmap(-1, 2 * PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        assert libc.mprotect(base + PAGE, PAGE, 0) == 0  # PROT_NONE after the weights
        w = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=PAGE - nbytes)
        w[:] = inputs["src0"].reshape(-1)
        inputs["src0"] = w.reshape(inputs["src0"].shape)
        graph, node = build_case_graph(op, case)
        CpuBackend(n_threads=2).compile(graph, graph.nodes).run(TensorStore(inputs), {})
        print(name, op, "ok", flush=True)
""")


def test_weights_ending_at_a_guard_page():
    """Weights flush against an unreadable page (as the last tensor of a GGUF mapping): a
    load past the last block would kill the process."""
    proc = subprocess.run([sys.executable, "-c", GUARD_SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(" ok") == 18


# float products of attention ---------------------------------------------------------------
def _attention_cases() -> list[OpCase]:
    """q . k and softmax(...) . v as the llama graph builds them: the KV cache holds
    [head_dim, n_head_kv, n_kv] and is viewed permuted; a is shared by grouped query heads."""
    cases = []
    for d, hkv, h, n_kv, n_tok, t in [(64, 3, 9, 37, 7, G.F16), (64, 3, 9, 5, 1, G.F16),
                                      (256, 1, 4, 19, 3, G.F16), (32, 2, 2, 8, 6, G.F32)]:
        cases.append(OpCase((SrcSpec(t, (d, hkv, n_kv, 1), permute=(0, 2, 1, 3)),
                             SrcSpec(G.F32, (d, h, n_tok, 1), permute=(0, 2, 1, 3))),
                            label=f"kq d={d} kv={n_kv} tok={n_tok} {t.name}"))
        cases.append(OpCase((SrcSpec(t, (d, hkv, n_kv, 1), permute=(1, 2, 0, 3)),
                             SrcSpec(G.F32, (n_kv, n_tok, h, 1))),
                            label=f"kqv d={d} kv={n_kv} tok={n_tok} {t.name}"))
    return cases


@pytest.mark.parametrize("case", _attention_cases(), ids=lambda c: c.label)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_attention_products(ref, case, threads):
    """Against f16 (the KV cache) the f32 operand is rounded to f16 first, as ggml does
    (test below); here it is given f16-exact values, so only f32 rounding may differ."""
    inputs = make_inputs(case, np.random.default_rng(4))
    if case.srcs[0].type == G.F16:
        inputs["src1"] = inputs["src1"].astype(np.float16).astype(np.float32)
    ours, _ = run_case("mul_mat", case, CpuBackend(n_threads=threads), inputs=inputs)
    expected, _ = run_case("mul_mat", case, ref, inputs=inputs)
    assert normalized_error(ours, expected) <= 1e-10


@pytest.mark.parametrize("case", [c for c in _attention_cases() if c.srcs[0].type == G.F16][:2],
                         ids=lambda c: c.label)
def test_f16_products_round_the_f32_operand_as_ggml(ref, case):
    """ggml's CPU mul_mat converts src1 to src0's vec_dot_type (F16 for F16) before the
    products: q . k and softmax(kq) . v see f16 values. The CPU backend does the same."""
    inputs = make_inputs(case, np.random.default_rng(6))
    ours, _ = run_case("mul_mat", case, CpuBackend(n_threads=2), inputs=inputs)
    exact, _ = run_case("mul_mat", case, ref, inputs=inputs)
    rounded = dict(inputs, src1=inputs["src1"].astype(np.float16).astype(np.float32))
    as_ggml, _ = run_case("mul_mat", case, ref, inputs=rounded)
    assert normalized_error(ours, as_ggml) <= 1e-10
    assert normalized_error(ours, exact) > 1e-9
