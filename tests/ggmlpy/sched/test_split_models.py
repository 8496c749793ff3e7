"""End to end: a model split across the host CPU and a second CPU device ("cpu:1") gives the
logits of one CPU backend, for no, some and all layers offloaded; the layers, KV cache and
output sit where the placement put them, and the copies between the devices are run."""
from __future__ import annotations

import numpy as np
import pytest

import llama
from ggmlpy.testing.models import write_tiny_llama

MAX_DELTA = 1e-3
PROMPT = [5, 17, 42, 99, 7, 250, 3, 64, 128, 11]
NEXT = [33, 200]


def logits_of(path, **load) -> tuple[np.ndarray, llama.Context]:
    """Every prompt position's logits, then those of two one-token decodes."""
    model = llama.Model.load(path, **load)
    ctx = llama.Context(model, n_ctx=256, n_batch=16, n_ubatch=16, n_threads=1)
    assert ctx.decode(llama.Batch.from_tokens(PROMPT, logits_all=True)) == 0
    rows = [ctx.get_logits().copy()]
    for tok in NEXT:
        assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
        rows.append(ctx.get_logits().copy())
    return np.concatenate(rows), ctx


def check_split(ctx: llama.Context, expect_devices: set[str]) -> None:
    """Every compiled graph (prompt and one-token) follows the model's placement."""
    placement = ctx.model.placement
    graphs = list(ctx.graph_cache.entries.values())
    assert len(graphs) == 2
    for cg in graphs:
        assert cg.fallbacks == []
        used = {s.backend.name for s in cg.splits}
        assert used == expect_devices
        a = cg.assignment
        for node in cg.graph.nodes:
            if node.op == "set_rows":  # the KV cache is written on its layer's device
                il = int(node.src[0].name.rsplit("_l", 1)[1])
                assert a[node.id].backend == placement.layers[il], node.name
            if node.op == "get_rows" and node.name == "inp_embd":  # the input layer stays
                assert a[node.id].backend == "cpu"
        out = cg.graph.outputs[0]
        assert a[out.id].backend == placement.output
        for s, t in zip(cg.splits, cg.splits[1:]):
            assert s.backend is not t.backend  # maximal runs
        if len(used) == 1:
            assert cg.copies == []
        else:
            assert cg.copies and all(c.src_backend != c.dst_backend and {c.src_backend, c.dst_backend} <= used
                                     for c in cg.copies)
            assert cg.copy_stats.runs >= 1 and cg.copy_stats.copies >= len(cg.copies)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def tiny(request, tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("sched") / "tiny.gguf", n_layer=3, tied=request.param)
    base, _ = logits_of(path)
    return path, base


@pytest.mark.parametrize("ngl, layers, output", [
    (0, ("cpu", "cpu", "cpu"), "cpu"),
    (2, ("cpu", "cpu", "cpu:1"), "cpu:1"),
    (4, ("cpu:1", "cpu:1", "cpu:1"), "cpu:1"),
])
def test_tiny_llama_split_over_two_cpu_devices_matches_one(tiny, ngl, layers, output):
    path, base = tiny
    got, ctx = logits_of(path, devices=["cpu:1"], n_gpu_layers=ngl)
    assert ctx.model.placement.layers == layers and ctx.model.placement.output == output
    assert [b.name for b in ctx.backends] == ["cpu:1", "cpu", "ref"]
    check_split(ctx, {"cpu"} if ngl == 0 else {"cpu", "cpu:1"})
    assert (ctx.backends[0].native_seconds > 0) == (ngl > 0)  # cpu:1 computed what it was given
    assert np.abs(got - base).max() <= MAX_DELTA


def test_smollm2_split_over_two_cpu_devices_matches_one(smollm2_path):
    base, _ = logits_of(smollm2_path)
    n_layer = 30
    for ngl in (0, 12, n_layer + 1):
        got, ctx = logits_of(smollm2_path, devices=["cpu:1"], n_gpu_layers=ngl)
        p = ctx.model.placement
        n_cpu = max(n_layer + 1 - ngl, 0)
        assert p.layers == ("cpu",) * min(n_cpu, n_layer) + ("cpu:1",) * (n_layer - min(n_cpu, n_layer))
        assert p.output == ("cpu" if ngl == 0 else "cpu:1")
        assert "token_embd.weight" in p.tied  # SmolLM2 has no output matrix
        check_split(ctx, {"cpu"} if ngl == 0 else {"cpu", "cpu:1"})
        assert np.abs(got - base).max() <= MAX_DELTA, ngl
        ctx.model.close()


def test_tiny_llama_over_three_cpu_devices_by_tensor_split(tiny):
    """Layers by upper_bound over the cumulative split: act 4, x = 0, .25, .5 for the layers
    and .75 for the output against splits [0.5, 1]."""
    path, base = tiny
    got, ctx = logits_of(path, devices=["cpu:1", "cpu:2"], n_gpu_layers=99, tensor_split=[1, 1])
    p = ctx.model.placement
    assert p.layers == ("cpu:1", "cpu:1", "cpu:2") and p.output == "cpu:2"
    assert [b.name for b in ctx.backends] == ["cpu:1", "cpu:2", "cpu", "ref"]
    check_split(ctx, {"cpu", "cpu:1", "cpu:2"})
    assert np.abs(got - base).max() <= MAX_DELTA


def test_override_tensor_moves_matching_weights_and_their_products(tiny):
    """llama.cpp's -ot: everything on cpu:1 except the output matrix (its tied embedding
    copy in the tied model) and layer 1's feed-forward weights, which stay on the host. The
    products reading them run on the host, the KV cache stays with its layer, and the
    logits are one backend's."""
    path, base = tiny
    got, ctx = logits_of(path, devices=["cpu:1"], n_gpu_layers=99,
                         override_tensor=[r"^(token_embd|output)\.weight$=CPU", r"blk\.1\.ffn_=cpu"])
    p = ctx.model.placement
    assert p.layers == ("cpu:1",) * 3 and p.output == "cpu:1"
    assert p.device_of_name("output_norm.weight") == "cpu:1"
    assert p.device_of_name("blk.1.ffn_up.weight") == "cpu" and p.device_of_name("blk.1.attn_q.weight") == "cpu:1"
    assert p.device_of_name("cache_k_l1") == "cpu:1"
    assert np.abs(got - base).max() <= MAX_DELTA
    for cg in ctx.graph_cache.entries.values():
        a = cg.assignment
        assert a[cg.graph.outputs[0].id].backend == "cpu"  # the output product, on the host
        products = {n.src[0].name: a[n.id].backend for n in cg.graph.nodes
                    if n.op == "mul_mat" and n.src[0].is_leaf}
        assert products["blk.1.ffn_up.weight"] == "cpu" and products["blk.1.ffn_down.weight"] == "cpu"
        assert products["blk.1.attn_q.weight"] == "cpu:1" and products["blk.2.ffn_up.weight"] == "cpu:1"
        for node in cg.graph.nodes:
            if node.op == "set_rows":
                assert a[node.id].backend == "cpu:1", node.name


@pytest.mark.parametrize("items", [[r"blk\.0\.=cpu"], [r"attn_k\.=cpu"], [r"blk\.1\.attn_(q|k|v)=cpu"]])
def test_override_tensor_between_a_product_and_its_view_matches_one_backend(tiny, items):
    """A moved K or Q product is read by the device's rope through a reshape that the
    scheduler puts in the host's split: the host exports the memory behind the view (this
    failed with "Kcur-0 has not been computed" before)."""
    path, base = tiny
    got, ctx = logits_of(path, devices=["cpu:1"], n_gpu_layers=99, override_tensor=items)
    assert {s.backend.name for cg in ctx.graph_cache.entries.values() for s in cg.splits} == {"cpu", "cpu:1"}
    assert np.abs(got - base).max() <= MAX_DELTA
