"""Profiled builds (GGMLPY_PROFILE=1, CpuBackend(profile=True)): every node's kernel is
timed, and timing changes nothing in the results."""
from __future__ import annotations

import numpy as np

import llama
from ggmlpy.testing.models import write_tiny_llama


def _run(path, monkeypatch, tmp_path, profile: bool):
    monkeypatch.setenv("GGMLPY_PROFILE", "1" if profile else "0")
    monkeypatch.setenv("GGMLPY_CACHE", str(tmp_path / "cache"))
    ctx = llama.Context(llama.Model.load(path), n_ctx=64, n_batch=16, n_ubatch=16)
    assert ctx.decode(llama.Batch.from_tokens([1, 5, 9, 2])) == 0
    for t in (3, 7):
        assert ctx.decode(llama.Batch.from_tokens([t])) == 0
    compiled = [c for e in ctx.graph_cache.entries.values() for c in e.compiled]
    return np.array(ctx.get_logits_ith(-1)), compiled


def test_profiled_build_times_every_node_and_changes_nothing(tmp_path, monkeypatch):
    path = write_tiny_llama(tmp_path / "tiny.gguf", seed=3)
    plain, plain_splits = _run(path, monkeypatch, tmp_path, profile=False)
    timed, splits = _run(path, monkeypatch, tmp_path, profile=True)
    np.testing.assert_array_equal(plain, timed)
    assert all(len(cycles) == 0 for c in plain_splits for _, cycles in c.profile())
    for split in splits:
        per_node = split.profile()
        assert len(per_node) == len(split.nodes) > 0
        kernel = np.array([cycles[0, 0] for _, cycles in per_node])   # thread 0, inside kernels
        assert (kernel > 0).all()                                      # every node ran and was timed
        split.reset_profile()
        assert all((cycles == 0).all() for _, cycles in split.profile())
