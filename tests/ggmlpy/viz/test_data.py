"""The page's data model: everything the compiler decided is in it, and the pass diffs are
the pass pipeline's own."""
from __future__ import annotations

import json

from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.passes.fusion import fusion_groups
from ggmlpy.codegen_cpu.fusion import CPU_RULES
from ggmlpy.passes.pipeline import run_pipeline
from ggmlpy.viz.data import unpack_code
from ggmlpy.viz.layers import layer_of_name, tensor_layers
from ggmlpy.viz.page import render_page

from tests.ggmlpy.viz.conftest import snapshot_of


def test_layer_names():
    assert layer_of_name("attn_norm-3") == 3
    assert layer_of_name("blk.17.ffn_down.weight") == 17
    assert layer_of_name("cache_k_l11") == 11
    assert layer_of_name("inp_pos") is None
    assert layer_of_name("result_output") is None


def test_every_tensor_and_edge_is_in_the_data(split_snapshot, split_data):
    graph, data = split_snapshot.graph, split_data
    tensors = data["tensors"]
    order = data["graph"]["order"]
    assert len(order) == len(graph.tensors) == len(data["graph"]["info"])
    uid = dict(zip((t.id for t in graph.tensors), order))
    for t, u in zip(graph.tensors, order):
        rec = tensors[u]
        assert (rec["op"], rec["type"], rec["name"]) == (t.op, t.type.name, t.name)
        assert rec["ne"][0] == (t.ne[0] if isinstance(t.ne[0], int) else str(t.ne[0]))
    edges = {(uid[s.id], uid[t.id]) for t in graph.tensors for s in t.src}
    data_edges = {(s, u) for u in order for s in tensors[u]["src"]}
    assert data_edges == edges and len(edges) > 1000
    # every tensor has the scheduler's backend and cause
    for t, info in zip(graph.tensors, data["graph"]["info"]):
        a = split_snapshot.schedule.assignment[t.id]
        assert (info["backend"], info["cause"]) == (a.backend, a.cause)


def test_layers_cover_the_model(split_snapshot, split_data):
    n_layer = 30
    layers = {rec.get("layer") for rec in split_data["tensors"]}
    assert set(range(n_layer)) <= layers
    # unnamed norms and permutes sit inside a layer: they take its index (only the output
    # norm, whose reader result_norm belongs to no layer, has none)
    layer = tensor_layers(split_snapshot.graph)
    unnamed = [t for t in split_snapshot.graph.tensors if not t.name and t.op in ("rms_norm", "permute")]
    assert len(unnamed) > 2 * n_layer and sum(layer[t.id] is None for t in unnamed) == 1


def test_splits_and_copies(split_snapshot, split_data):
    sched = split_snapshot.schedule
    uid = dict(zip((t.id for t in split_snapshot.graph.tensors), split_data["graph"]["order"]))
    assert [s["backend"] for s in split_data["splits"]] == [s.backend.name for s in sched.splits]
    assert {s.backend.name for s in sched.splits} == {"cpu", "cpu:1"}
    for rec, s in zip(split_data["splits"], sched.splits):
        assert rec["nodes"] == [uid[n.id] for n in s.nodes]
        assert rec["n_compute"] == s.n_compute
    assert len(split_data["copies"]) == len(sched.copies) > 0
    for rec, c in zip(split_data["copies"], sched.copies):
        assert (rec["tensor"], rec["from"], rec["to"], rec["split"]) == (uid[c.tensor.id], c.src_backend,
                                                                         c.dst_backend, c.split)
        assert rec["bytes"] == c.nbytes(split_snapshot.env) > 0


def test_buffer_plan_blocks_and_peak(split_snapshot, split_data):
    plan, buf = split_snapshot.plan, split_data["buffers"]
    uid = dict(zip((t.id for t in split_snapshot.graph.tensors), split_data["graph"]["order"]))
    blocks = {b[0]: b for b in buf["blocks"]}
    assert set(blocks) == {uid[tid] for tid in plan.offsets}
    for tid, off in plan.offsets.items():
        assert blocks[uid[tid]][1:3] == [off, plan.sizes[tid]]
    assert buf["peak_bytes"] == plan.peak_bytes == max(buf["live"]) == buf["live"][buf["peak_step"]]
    # blocks live at the same step never share bytes (the lifetimes are the planner's)
    by_step: dict[int, list] = {}
    for b in buf["blocks"]:
        for s in range(b[3], b[4] + 1):
            by_step.setdefault(s, []).append(b)
    for live in by_step.values():
        spans = sorted((b[1], b[1] + b[2]) for b in live if b[2] > 0)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_pass_diffs_match_the_pipeline(split_snapshot, split_data):
    built = split_snapshot.stages[0].graph
    result = run_pipeline(built, backend=split_snapshot.pipeline, env=split_snapshot.env, rules=CPU_RULES)
    stages = split_data["stages"]
    assert [s["name"] for s in stages[1:]] == [r.name for r in result.steps]
    for st, rec in zip(stages[1:], result.steps):
        assert (st["nodes_before"], st["nodes_after"]) == (rec.nodes_before, rec.nodes_after)
    assert split_snapshot.graph.signature() == result.graph.signature()
    tensors = split_data["tensors"]
    is_node = lambda u: tensors[u]["op"] != "none"  # noqa: E731
    changed = 0
    for prev, st in zip(stages, stages[1:]):
        assert set(st["order"]) == (set(prev["order"]) - set(st["removed"])) | set(st["added"])
        assert st["nodes_after"] - st["nodes_before"] == (sum(map(is_node, st["added"]))
                                                          - sum(map(is_node, st["removed"])))
        changed += len(st["added"]) + len(st["removed"])
        for old, new in st["rewritten"]:
            assert old in st["removed"] and new in st["added"]
    views = next(s for s in stages if s["name"] == "views")
    assert views["removed"] and views["rewritten"] and changed > 0


def test_kernels_cover_every_computing_node(split_snapshot, split_data):
    km = split_snapshot.kernels
    graph = split_snapshot.graph
    computing = [n for n in graph.nodes if OPS[n.op].kind != Kind.VIEW]
    assert all(n.id in km.kernel_of for n in computing)
    assert len(km.kernels) < len(computing) / 5          # 30 layers share their kernels
    langs = {k["language"] for k in split_data["kernels"]}
    assert langs == {"llvm"}
    text = unpack_code(split_data["kernels"][split_data["graph"]["info"][graph.tensors.index(computing[0])]["kernel"]]["code"])
    assert "define" in text and "ggmlpy_barrier" in text
    # a group the CPU backend fuses is one launch; the data says so
    fused = [g for g in split_data["groups"] if g["one_kernel"]]
    assert {g["pattern"] for g in fused} >= {"norm_mul", "glu_product"}
    for g, rec in zip(fusion_groups(graph), split_data["groups"]):
        launches = {km.launch_of[t.id] for t in g.nodes}
        assert rec["one_kernel"] == (len(launches) == 1)


def test_cuda_placement_without_a_gpu_gives_cuda_c(smollm2):
    snap = snapshot_of(smollm2, ["cuda:0"], 99)
    cuda = [k for k in snap.kernels.kernels if k.language == "cuda"]
    assert cuda and all("__global__" in k.code for k in cuda)
    on_cuda = [n for s in snap.schedule.splits if s.backend.name == "cuda"
               for n in s.nodes if OPS[n.op].kind != Kind.VIEW]
    assert len(on_cuda) > 500 and all(n.id in snap.kernels.kernel_of for n in on_cuda)
    # as a Context with a CUDA device and the host CPU: every backend's passes (the CPU's
    # fusion marks for the host's splits), so the plan is the pipeline's own
    assert snap.pipeline == "cpu" and not snap.notes


def test_page_embeds_the_data(split_data):
    page = render_page(split_data)
    head, _, rest = page.partition('<script type="application/json" id="viz-data">')
    payload, _, _ = rest.partition("</script>")
    assert json.loads(payload) == split_data
    assert "<script src" not in page and "<link" not in page   # nothing fetched
    assert len(page.encode()) < 5 << 20
