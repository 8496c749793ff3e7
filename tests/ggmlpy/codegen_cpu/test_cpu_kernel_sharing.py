"""Kernels shared across symbols and across graphs: the last layer (n_outputs rows) runs the
other layers' kernels (n_tokens rows), Gemma 3's sliding-window layers (n_kv_swa) the full
ones' (n_kv), each node reading its own symbols' values; and a context's two graphs compile
each kernel they share once, the costliest waiting first."""
from __future__ import annotations

import collections
import threading

import numpy as np
import pytest

import llama
from ggmlpy.codegen_cpu import backend as backend_module
from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.program import CompileUnit, ProgramBuilder
from ggmlpy.testing.models import write_tiny_llama


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("sharing") / "tiny.gguf", n_layer=3, seed=5)


def _builders(ctx: llama.Context) -> list[ProgramBuilder]:
    be = ctx.backends[0]
    return [ProgramBuilder(e.graph, s.nodes, be.worst_env, set(), False, be.qdot)
            for e in ctx.graph_cache.entries.values() for s in e.splits]


def _symbols_by_kernel(builder: ProgramBuilder) -> dict[str, set[tuple[str, ...]]]:
    out: dict[str, set[tuple[str, ...]]] = collections.defaultdict(set)
    for key, symbols in zip(builder.kernel_keys, builder.kernel_symbols):
        out[key].add(symbols)
    return out


def _prompt_builder(ctx: llama.Context) -> ProgramBuilder:
    return max(_builders(ctx), key=lambda b: sum("n_outputs" in s for s in b.kernel_symbols))


def test_the_last_layer_runs_the_kernels_of_the_others(tiny_path):
    ctx = llama.Context(llama.Model.load(tiny_path), n_ctx=256, n_batch=64, n_ubatch=64, backend="cpu")
    builder = _prompt_builder(ctx)
    shared = _symbols_by_kernel(builder)
    # the last layer's FFN (on the output rows) and the other layers' (on every token)
    for op in ("rms_norm_mul", "mul_mat", "swiglu"):
        assert any(k.startswith(f"('{op}'") and s == {("n_tokens",), ("n_outputs",)} for k, s in shared.items())
    # keys name symbols by slot only, so no kernel exists for one symbol's sake
    assert not any("n_tokens" in k or "n_outputs" in k for k in builder.kernel_keys)
    names, starts = builder.symbol_plan()
    for symbols, start in zip(builder.kernel_symbols, starts):
        assert tuple(names[start:start + len(symbols)]) == symbols


@pytest.mark.parametrize("output_all", [False, True], ids=["last-row", "every-row"])
def test_shared_kernels_read_each_nodes_own_symbols(tiny_path, output_all):
    """n_outputs (1 or 7) against n_tokens (7): the shared kernels give the reference's logits."""
    model = llama.Model.load(tiny_path)
    tokens = [3, 41, 17, 99, 8, 250, 61]
    logits = {}
    for backend in ("cpu", "ref"):
        ctx = llama.Context(model, n_ctx=256, n_batch=64, n_ubatch=64, backend=backend)
        batch = llama.Batch(tokens=tokens, seq_ids=[[0]] * 7, logits=[output_all] * 6 + [True])
        assert ctx.decode(batch) == 0
        rows = range(7) if output_all else [6]
        logits[backend] = np.stack([ctx.get_logits_ith(i) for i in rows])
    assert logits["cpu"].std() > 0.01
    np.testing.assert_allclose(logits["cpu"], logits["ref"], atol=1e-3, rtol=0)


def test_gemma3_sliding_window_layers_share_the_full_layers_kernels(gemma3_path):
    ctx = llama.Context(llama.Model.load(gemma3_path), n_ctx=256, n_batch=64, n_ubatch=64, backend="cpu")
    shared = _symbols_by_kernel(_prompt_builder(ctx))
    attention = [s for s in shared.values() if any("n_kv_swa" in x for x in s)]
    assert any(any("n_kv" in x for x in s) for s in attention)   # one kernel, both caches


def test_a_contexts_graphs_compile_each_shared_kernel_once(tiny_path, tmp_path, monkeypatch):
    monkeypatch.setenv("GGMLPY_CACHE", str(tmp_path))
    ctx = llama.Context(llama.Model.load(tiny_path), n_ctx=256, backend="cpu")
    assert ctx.decode(llama.Batch.from_tokens([1, 2, 3])) == 0 and ctx.decode(llama.Batch.from_tokens([4])) == 0
    builders = _builders(ctx)
    assert len(builders) == 2
    per_graph = [{u.name for u in b.units()} for b in builders]
    common = per_graph[0] & per_graph[1]
    assert len(common) >= 4   # the entry, norms, products ...
    be = ctx.backends[0]
    assert be.ir_builds == len(per_graph[0] | per_graph[1]) == be.object_cache.misses


def test_the_costliest_waiting_unit_compiles_first(monkeypatch):
    """Compile threads take the most expensive waiting unit (COMPILE_COST), not the oldest:
    a costly kernel of a context's second graph starts before the first graph's small ones."""
    monkeypatch.delenv("GGMLPY_COMPILE_INPROCESS", raising=False)
    monkeypatch.setattr(backend_module, "compile_threads", lambda: 1)
    be = CpuBackend(n_threads=1)
    started, release, order = threading.Event(), threading.Event(), []

    def compile_unit(unit):
        order.append(unit.name)
        if unit.name == "first":   # holds the only thread while the others queue
            started.set()
            release.wait(10)
        return "sha", None

    monkeypatch.setattr(be, "_compile_unit", compile_unit)
    units = [CompileUnit("first", str, 1), CompileUnit("copy", str, 1), CompileUnit("norm", str, 2),
             CompileUnit("attention", str, 11), CompileUnit("product", str, 6), CompileUnit("add", str, 1)]
    futures = [be._compiled_unit(units[0])]
    assert started.wait(10)
    futures += [be._compiled_unit(u) for u in units[1:]]
    release.set()
    assert [f.result(10) for f in futures] == [("sha", None)] * len(units)
    assert order == ["first", "attention", "product", "norm", "copy", "add"]
    be.close()
