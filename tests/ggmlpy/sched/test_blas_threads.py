"""Numpy's BLAS runs on one thread in a reference split between other backends' splits (its
workers would spin beside the native ones), and keeps its count elsewhere. The counts are
read through threadpoolctl, independently of the backend's own controller."""
from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

from ggmlpy.ir.ops import OPS
from ggmlpy.sched.ref_backend import RefBackend, RefSplit
from ggmlpy.sched.scheduler import CompiledGraph
from ggmlpy.sched.store import TensorStore

from .fakes import FakeDevice
from .test_scheduler import chain


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in ThreadpoolController().select(user_api="blas").info()]


@pytest.fixture
def two_blas_threads():
    """numpy's BLAS on two threads for the test (skipped where numpy has no BLAS library)."""
    controller = ThreadpoolController().select(user_api="blas")
    if not controller.lib_controllers:
        pytest.skip("numpy has no BLAS library here")
    with controller.limit(limits=2):
        yield blas_threads()


def recording(ref: RefBackend, seen: list[list[int]]) -> None:
    """ref's gelu_erf notes the BLAS thread counts it runs under, then computes as before."""
    def gelu_erf(split: RefSplit, node, store, env) -> np.ndarray:
        seen.append(blas_threads())
        return OPS["gelu_erf"].reference([ref.as_float(s, store, env) for s in node.src], node.params)
    ref.overrides["gelu_erf"] = gelu_erf


def test_a_ref_split_between_other_splits_runs_blas_on_one_thread(two_blas_threads):
    graph, data = chain()
    ref, seen = RefBackend(), []
    recording(ref, seen)
    cg = CompiledGraph(graph, [FakeDevice("gpu", {"mul_mat", "silu", "add"}), ref])
    ref_splits = [c for s, c in zip(cg.splits, cg.compiled) if s.backend is ref]
    assert len(ref_splits) == 1 and ref_splits[0].between_others
    cg.run(TensorStore(data), {})
    assert seen == [[1] * len(two_blas_threads)]
    assert blas_threads() == two_blas_threads  # restored after the split


def test_the_count_is_restored_when_a_split_raises(two_blas_threads):
    graph, data = chain()
    ref = RefBackend()

    def fail(split, node, store, env):
        raise RuntimeError("boom")
    ref.overrides["gelu_erf"] = fail
    cg = CompiledGraph(graph, [FakeDevice("gpu", {"mul_mat", "silu", "add"}), ref])
    with pytest.raises(RuntimeError, match="boom"):
        cg.run(TensorStore(data), {})
    assert blas_threads() == two_blas_threads


def test_a_graph_run_entirely_by_ref_keeps_the_blas_thread_count(two_blas_threads):
    graph, data = chain()
    ref, seen = RefBackend(), []
    recording(ref, seen)
    cg = CompiledGraph(graph, [ref])
    assert len(cg.compiled) == 1 and not cg.compiled[0].between_others
    cg.run(TensorStore(data), {})
    assert seen == [two_blas_threads]
