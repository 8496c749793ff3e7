"""Every CUDA template rendered for every variant the op registry and the fused graphs
produce, compiled with `nvcc -ptx -arch=sm_90` (no GPU needed): the kernels CI checks.

All variants go into two translation units, so the whole check is two nvcc runs.
"""
from __future__ import annotations

import re

import pytest

from ggmlpy.codegen_cuda.kernels import module_source
from ggmlpy.codegen_cuda.nvcc import compile_cuda, find_nvcc
from ggmlpy.codegen_cuda.render import template_names

from .cases import all_specs

ARCH = "sm_90"
NON_KERNEL_TEMPLATES = {"common.cu.j2", "emu_runtime.cu.j2"}


@pytest.fixture(scope="module")
def specs():
    return all_specs()


def test_every_template_family_has_variants(specs):
    families = {s.template for s in specs.values()}
    assert families == set(template_names()) - NON_KERNEL_TEMPLATES


def test_variants_cover_every_weight_type_and_fusion(specs):
    variants = [dict(s.variant) | {"family": s.family} for s in specs.values()]
    mv_types = {v["atype"] for v in variants if v["family"] == "matvec"}
    mm_types = {v["atype"] for v in variants if v["family"] == "matmul"}
    wanted = {"f32", "f16", "q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k", "mxfp4", "iq4_nl", "iq4_xs",
              "q1_0", "q2_0", "q2_k", "q3_k", "q5_k", "tq1_0", "tq2_0", "nvfp4", "iq2_xxs", "iq2_xs", "iq2_s",
              "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"}
    assert wanted <= mv_types and wanted <= mm_types
    new = wanted - {"f32", "f16", "q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k", "mxfp4"}
    assert new <= {v["ttype"] for v in variants if v["family"] == "get_rows"}
    modes = {(v["mode"], v["n_mats"], v["epilogue"]) for v in variants if v["family"] == "matvec"}
    assert ("glu", 1, "none") in modes and ("sep", 3, "none") in modes and ("sep", 1, "add") in modes
    assert any(v["family"] == "attention" and v["kvec"] for v in variants)
    assert any(v["family"] == "norm" and v["has_w"] for v in variants)


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc (the CUDA toolkit) is not installed")
def test_all_variants_compile_to_ptx(specs):
    names = sorted(specs)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    for part in halves:
        ptx = compile_cuda(module_source(specs[n] for n in part), ARCH, "ptx").decode()
        entries = set(re.findall(r"\.entry\s+(\w+)\s*\(", ptx))
        assert entries == set(part)


def test_every_kernel_waits_for_its_predecessor_first(specs):
    """With programmatic dependent launch a kernel may start before the previous one ends:
    every kernel calls gg_pdl_wait() before touching memory, except that the matrix-vector
    kernel may first load its weights when they are constant (a_const), and the attention
    kernel with its output projection prefetches Wo (a weight) into L2."""
    for spec in specs.values():
        src = spec.source()
        body = src[src.index(f"{spec.name}(const {spec.name}_params p) {{"):]
        before = body[:body.index("gg_pdl_wait();")]
        if spec.family == "matvec":  # address arithmetic, then (a_const) weight loads only
            assert ("mvu_load_" in before) == dict(spec.variant)["a_const"], spec.name
            assert not any(w in before for w in ("st_", "ld_", "*(const", "warp_sum")), spec.name
        elif spec.family == "attention" and dict(spec.variant)["oproj"] != "none":
            assert "gg_prefetch_l2(p.wo + " in before, spec.name
            assert not any(w in before for w in ("st_", "ld_", "*(", "atomic")), spec.name
        else:
            assert before.count(";") == 0, f"{spec.family}: {before!r}"
