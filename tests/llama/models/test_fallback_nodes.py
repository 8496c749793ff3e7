"""A model whose weights are mostly of a type the CPU backend runs (Q4_0) with a few it does
not (Q8_1, a type no CPU kernel reads as a weight): only the products of those few run
on the reference backend, every other node on the CPU, with or without offload devices; the
logits are the reference backend's, and the fallback is told once per context."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import llama
from ggmlpy.gguf import GGUFFile, GGUFWriter
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import quantize
from ggmlpy.testing.models import write_tiny_llama
from llama.batch import Batch

SLOW = {"blk.0.ffn_down.weight": "ffn_out-0", "blk.1.attn_v.weight": "Vcur-1"}  # weight -> its product
PROMPT = [1, 2, 3, 4, 5]


def write_mixed(src: Path, dst: Path, slow_type: GGMLType) -> Path:
    """A copy of a float32 tiny llama with every matrix but the embedding quantised: the
    SLOW ones to slow_type, the others to Q4_0."""
    with GGUFFile(src) as f:
        w = GGUFWriter()
        for key, field in f.fields.items():
            w.add_key_value(key, field.value, field.type, field.element_type)
        for name, info in f.tensors.items():
            data = np.array(info.data).view(np.float32).reshape(tuple(reversed(info.ne)))
            if data.ndim == 2 and name != "token_embd.weight":
                t = slow_type if name in SLOW else GGMLType.Q4_0
                w.add_tensor(name, quantize(data, t), type=t, ne=tuple(info.ne))
            else:
                w.add_tensor(name, data)
    return w.write(dst)


@pytest.fixture(scope="module")
def mixed_path(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("mixed")
    f32 = write_tiny_llama(d / "f32.gguf", n_embd=256, n_ff=512)
    return write_mixed(f32, d / "mixed.gguf", GGMLType.Q8_1)


def run(ctx: llama.Context) -> np.ndarray:
    assert ctx.decode(Batch.from_tokens(PROMPT)) == 0
    assert ctx.decode(Batch.from_tokens([6])) == 0
    return ctx.get_logits().copy()


def computing_nodes_on(ctx: llama.Context, backend: str) -> list[set[str]]:
    """Per compiled graph (the prompt's, the one-token step's): the computing nodes (views
    follow the tensor they view) that `backend` runs."""
    out = []
    for cg in ctx.graph_cache.entries.values():
        out.append({n.name for n in cg.graph.nodes
                    if OPS[n.op].kind != Kind.VIEW and cg.assignment[n.id].backend == backend})
    return out


@pytest.fixture(scope="module")
def cpu_logits(mixed_path) -> np.ndarray:
    return run(llama.Context(llama.Model.load(mixed_path), n_ctx=256, backend="cpu"))


@pytest.mark.parametrize("offload", [False, True], ids=["cpu", "cpu+cpu:1"])
def test_only_the_products_the_cpu_cannot_run_go_to_ref(mixed_path, cpu_logits, caplog, offload):
    kw = {"devices": ["cpu:1"], "n_gpu_layers": 2} if offload else {}
    model = llama.Model.load(mixed_path, **kw)
    with caplog.at_level(logging.WARNING, logger="ggmlpy.sched"):
        ctx = llama.Context(model, n_ctx=256, backend="cpu")
        logits = run(ctx)
    assert computing_nodes_on(ctx, "ref") == [set(SLOW.values())] * 2
    for cg in ctx.graph_cache.entries.values():
        assert {n.name for n in cg.fallbacks} == set(SLOW.values())
    # told once, also when the weights are placed (the placed path marked no fallback before)
    refused = "cpu:1, cpu" if offload else "cpu"
    assert [r.getMessage() for r in caplog.records if "fall back" in r.getMessage()] == [
        f"4 nodes in 2 graphs fall back to a slower backend; ref runs what {refused} cannot: "
        f"mul_mat(Q8_1, F32) x4"]
    # a second CPU backend runs the same kernels as the first: the same numbers
    np.testing.assert_array_equal(logits, cpu_logits)


def test_the_logits_are_the_reference_backends(mixed_path, cpu_logits):
    """Within what the CPU's Q4_0 products differ by anyway: they round activations to Q8_0,
    as ggml's do, where the reference multiplies in float32 (an all-Q4_0 model of this size
    differs from the reference by about 0.04 too)."""
    ref = run(llama.Context(llama.Model.load(mixed_path), n_ctx=256, backend="ref"))
    np.testing.assert_allclose(cpu_logits, ref, atol=6e-2, rtol=0)
    assert np.abs(cpu_logits - ref).mean() < 2e-2
