"""The shared elementwise formulas (ggmlpy/ir/ops/formulas.py) and each backend's table of
primitives: every formula op is registered, numpy and CUDA render every primitive, and the
CPU's missing primitives (so its missing elementwise lowerings) are the listed ones."""
from __future__ import annotations

import math

import numpy as np

from ggmlpy.codegen_cpu.kernels.elementwise import CODE_FOR_OP as CPU
from ggmlpy.codegen_cpu.lowering import LOWERINGS as CPU_LOWERINGS
from ggmlpy.codegen_cuda.lower_elementwise import CODE_FOR_OP as CUDA
from ggmlpy.codegen_cuda.lower_elementwise import c_expr
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.ops.formulas import FORMULAS, NUMPY, PRIMITIVES, evaluate, primitives

CPU_MISSING: set[str] = set()  # a primitive listed here leaves its ops to the reference backend


def test_every_formula_is_an_elementwise_op():
    assert all(OPS[op].kind == Kind.ELEMENTWISE for op in FORMULAS)


def test_backend_tables_cover_the_primitives():
    assert set(NUMPY) == set(PRIMITIVES)
    assert set(CUDA) == set(PRIMITIVES)
    assert set(PRIMITIVES) - set(CPU) == CPU_MISSING


def test_cpu_lowers_exactly_the_formulas_it_can_render():
    lowered = {op for op in FORMULAS if op in CPU_LOWERINGS}
    assert lowered == {op for op in FORMULAS if not primitives(FORMULAS[op]) & CPU_MISSING}


def test_gelu_is_ggml_cpu_table_gelu():
    """f16 in, f16 out between -10 and 10 (GGML_GELU_FP16); x above, 0 below."""
    x = np.array([-12.0, -10.0, -1.3, 0.0, 0.7, 3.1, 10.0, 11.5], np.float32)
    y = evaluate(FORMULAS["gelu"], [x], {})
    assert y[0] == 0 and y[1] == 0 and y[-2] == 10.0 and y[-1] == 11.5
    mid = y[2:-2]
    assert np.array_equal(mid, mid.astype(np.float16).astype(np.float32))


def test_gelu_erf_is_ggml_f32_formula():
    x = np.linspace(-4, 4, 33, dtype=np.float32)
    want = [0.5 * v * (1 + math.erf(v * 0.7071067690849304)) for v in x.astype(np.float64)]
    np.testing.assert_allclose(evaluate(FORMULAS["gelu_erf"], [x], {}), want, rtol=1e-6, atol=1e-7)


def test_cuda_expressions_name_their_parameters():
    assert c_expr("scale", ["v"], lambda n: "p.k0_" + n) == "((v * (float)p.k0_s) + (float)p.k0_b)"
    assert c_expr("abs", ["v"]) == "fabsf(v)"
