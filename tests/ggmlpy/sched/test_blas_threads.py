"""Numpy's BLAS runs on one thread in a reference split between other backends' splits (its
workers would spin beside the native ones), and keeps its count elsewhere."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.ir.ops import OPS
from ggmlpy.sched import blas_threads
from ggmlpy.sched.blas_threads import BlasLibrary, BlasThreadLimit, one_blas_thread, openblas_libraries
from ggmlpy.sched.ref_backend import RefBackend, RefSplit
from ggmlpy.sched.scheduler import CompiledGraph
from ggmlpy.sched.store import TensorStore

from .fakes import FakeDevice
from .test_scheduler import chain


class FakeBlas:
    """A BLAS library's thread count, as its two accessors see it."""

    def __init__(self, threads: int):
        self.threads = threads
        self.sets: list[int] = []

    def library(self) -> BlasLibrary:
        return BlasLibrary("fake", lambda: self.threads, self.set)

    def set(self, n: int) -> None:
        self.sets.append(n)
        self.threads = n


def test_the_first_user_sets_one_thread_and_the_last_restores_the_count():
    a, b = FakeBlas(4), FakeBlas(2)
    limit = BlasThreadLimit(lambda: (a.library(), b.library()))
    with limit.one():
        assert (a.threads, b.threads) == (1, 1)
        with limit.one():  # another user (a nested or concurrent split): nothing to do
            assert (a.threads, b.threads) == (1, 1)
        assert (a.threads, b.threads) == (1, 1)
    assert (a.threads, b.threads) == (4, 2)
    assert a.sets == [1, 4] and b.sets == [1, 2]


def test_the_count_is_restored_when_the_body_raises():
    a = FakeBlas(3)
    limit = BlasThreadLimit(lambda: (a.library(),))
    with pytest.raises(RuntimeError):
        with limit.one():
            raise RuntimeError("boom")
    assert a.threads == 3


def test_numpys_openblas_runs_on_one_thread_inside():
    libs = openblas_libraries()
    if not libs:
        pytest.skip("numpy's BLAS here is not OpenBLAS")
    before = [lib.get_threads() for lib in libs]
    with one_blas_thread():
        assert [lib.get_threads() for lib in libs] == [1] * len(libs)
    assert [lib.get_threads() for lib in libs] == before


def recording(ref: RefBackend, seen: list[int], blas: FakeBlas) -> None:
    """ref's gelu_erf notes the BLAS thread count it runs under, then computes as before."""
    def gelu_erf(split: RefSplit, node, store, env) -> np.ndarray:
        seen.append(blas.threads)
        return OPS["gelu_erf"].reference([ref.as_float(s, store, env) for s in node.src], node.params)
    ref.overrides["gelu_erf"] = gelu_erf


def test_a_ref_split_between_other_splits_runs_blas_on_one_thread(monkeypatch):
    blas = FakeBlas(2)
    monkeypatch.setattr(blas_threads, "_LIMIT", BlasThreadLimit(lambda: (blas.library(),)))
    graph, data = chain()
    ref, seen = RefBackend(), []
    recording(ref, seen, blas)
    cg = CompiledGraph(graph, [FakeDevice("gpu", {"mul_mat", "silu", "add"}), ref])
    ref_splits = [c for s, c in zip(cg.splits, cg.compiled) if s.backend is ref]
    assert len(ref_splits) == 1 and ref_splits[0].between_others
    cg.run(TensorStore(data), {})
    assert seen == [1] and blas.threads == 2


def test_a_graph_run_entirely_by_ref_keeps_the_blas_thread_count(monkeypatch):
    blas = FakeBlas(2)
    monkeypatch.setattr(blas_threads, "_LIMIT", BlasThreadLimit(lambda: (blas.library(),)))
    graph, data = chain()
    ref, seen = RefBackend(), []
    recording(ref, seen, blas)
    cg = CompiledGraph(graph, [ref])
    assert len(cg.compiled) == 1 and not cg.compiled[0].between_others
    cg.run(TensorStore(data), {})
    assert seen == [2] and blas.sets == []
