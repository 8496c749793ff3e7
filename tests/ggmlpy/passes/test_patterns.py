"""One fusion vocabulary (passes/patterns.py): every group kind a backend forms and every
fused node op it lowers is an entry of FUSED_KINDS (or an op of the registry); the pass
package imports no backend; both backends hand their groups through Backend.split_groups."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.fusion import CPU_RULES
from ggmlpy.codegen_cpu.lowering import LOWERINGS
from ggmlpy.codegen_cuda.fusion import STEPS
from ggmlpy.codegen_cuda.fusion_rules import CudaFusionOptions, cuda_rules
from ggmlpy.ir.ops import OPS
from ggmlpy.passes.fusion import rules_key
from ggmlpy.passes.patterns import FUSED_KINDS, NORM_MUL, fused_op_kinds
from ggmlpy.passes.pipeline import context_rules, run_pipeline
from ggmlpy.sched.ref_backend import RefBackend

PASSES_DIR = Path(__file__).resolve().parents[3] / "ggmlpy" / "passes"


def test_every_rule_and_step_names_a_fused_kind():
    cuda = cuda_rules(CudaFusionOptions(fuse_oproj=True))
    assert {r.name for r in CPU_RULES} | {r.name for r in cuda} | set(STEPS) <= set(FUSED_KINDS)


def test_every_cpu_lowering_is_an_op_or_a_listed_fused_op():
    fused = fused_op_kinds()
    assert {op for op in LOWERINGS if op not in OPS} <= set(fused)
    assert {"mul_mat_add", "mul_mat_glu", "mul_mat_soft_max", "rope_pair", "rms_norm_mul"} <= set(fused)
    assert fused["mul_mat_add"] == "residual_product" and fused["rope_pair"] == "rope_qk"


def test_the_pass_package_imports_no_backend():
    for path in PASSES_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith(("ggmlpy.codegen_cpu", "ggmlpy.codegen_cuda")) for n in names), path


def test_a_backend_predicate_narrows_the_named_pattern():
    cpu_norm = next(r for r in CPU_RULES if r.name == "norm_mul")
    assert cpu_norm.roots == NORM_MUL.roots and NORM_MUL.check is None and cpu_norm.check is not None


def test_the_fusion_pass_takes_the_backends_rules(tiny_llama):
    graph = tiny_llama.graph(3)
    with pytest.raises(ValueError, match="fusion rules"):
        run_pipeline(graph, "cpu")
    cpu, ref = CpuBackend(n_threads=1), RefBackend()
    try:
        assert context_rules([ref]) == () and context_rules([cpu, ref, cpu]) == CPU_RULES
        assert rules_key(CPU_RULES) != rules_key(CPU_RULES[:-1])
        g = run_pipeline(graph, "cpu", rules=cpu.fusion_rules()).graph
        order, groups = cpu.split_groups(g, list(g.nodes))
        assert order == list(g.nodes) and groups
        assert {grp.pattern for grp in groups} <= {"norm_mul", "glu_product", "residual_product",
                                                   "matmul_softmax", "rope_qk"}
        assert ref.split_groups(g, list(g.nodes)) == (list(g.nodes), [])
    finally:
        cpu.close()
