"""The scheduler on hand-made graphs: ggml's assignment passes and their causes, fallbacks,
maximal splits, and copies exactly where a tensor crosses devices (checked at run time by
fake devices that refuse to read data not in their memory)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.sched.scheduler import CompiledGraph, SchedulerError, assign, schedule
from ggmlpy.sched.store import TensorStore

from .fakes import FakeDevice, Ledger

F32 = GGMLType.F32


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def codes(graph: Graph, assignment) -> dict[str, tuple[str, str]]:
    """name -> (backend, pass code) for every named tensor."""
    return {t.name: (assignment[t.id].backend, assignment[t.id].code) for t in graph.tensors if t.name}


def chain() -> tuple[Graph, dict[str, np.ndarray]]:
    """x -> mul_mat(w0) -> silu -> mul_mat(w1) -> gelu_erf -> add(x): w0 on the host, w1 on
    the gpu, which cannot run gelu_erf."""
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    w0, w1 = b.weight("w0", F32, (8, 8)), b.weight("w1", F32, (8, 8))
    h0 = b.name(b.mul_mat(w0, x), "h0")
    a0 = b.name(b.silu(h0), "a0")
    h1 = b.name(b.mul_mat(w1, a0), "h1")
    g1 = b.name(b.gelu_erf(h1), "g1")
    out = b.name(b.add(g1, x), "out")
    return b.build([out]), {"x": rand(4, 8), "w0": rand(8, 8, seed=1), "w1": rand(8, 8, seed=2)}


def devices(ledger: Ledger | None = None) -> tuple[FakeDevice, FakeDevice, RefBackend]:
    gpu = FakeDevice("gpu", {"mul_mat", "silu", "add"}, memory="gpu", ledger=ledger)
    cpu = FakeDevice("cpu", ledger=ledger)
    return gpu, cpu, RefBackend()


PLACEMENT = {"w0": "cpu", "w1": "gpu"}


# assignment passes -----------------------------------------------------------------------------
def test_causes_follow_ggml_passes():
    graph, _ = chain()
    got = codes(graph, assign(graph, devices(), PLACEMENT))
    assert got == {
        "x": ("cpu", "1.inp"), "w0": ("cpu", "1.dst"), "w1": ("gpu", "1.dst"),
        "h0": ("cpu", "1.wgt0"),      # reads w0, on the host
        "a0": ("gpu", "2.gpu-up"),    # claimed by the gpu from h1 below it
        "h1": ("gpu", "1.wgt0"),      # reads w1, on the gpu
        "g1": ("cpu", "3.best"),      # the gpu refused it: most inputs readable on the cpu
        "out": ("gpu", "2.gpu-down"),  # claimed by the gpu from h1 above it
    }


def test_fallback_names_the_backend_that_refused():
    graph, _ = chain()
    sched = schedule(graph, devices(), PLACEMENT)
    g1 = graph.find("g1")
    assert sched.fallbacks == [g1]
    assert sched.assignment[g1.id].cause.endswith("(fallback: gpu cannot run gelu_erf)")
    assert not any(sched.assignment[t.id].fallback for t in graph.tensors if t is not g1)


def test_every_cause_is_printable_text_naming_its_reason():
    graph, _ = chain()
    a = assign(graph, devices(), PLACEMENT)
    assert a[graph.find("h0").id].cause == "1.wgt0: reads weight w0 on cpu"
    assert a[graph.find("a0").id].cause == "2.gpu-up: next to h1 on gpu"
    assert a[graph.find("out").id].cause == "2.gpu-down: next to h1 on gpu"
    assert a[graph.find("x").id].cause.startswith("1.inp: graph input")


def test_splits_are_maximal_runs_and_copies_sit_where_tensors_cross():
    graph, _ = chain()
    sched = schedule(graph, devices(), PLACEMENT)
    runs = [(s.backend.name, [n.name for n in s.nodes]) for s in sched.splits]
    assert runs == [("cpu", ["h0"]), ("gpu", ["a0", "h1"]), ("cpu", ["g1"]), ("gpu", ["out"])]
    assert all(a.backend is not b.backend for a, b in zip(sched.splits, sched.splits[1:]))
    copies = [(c.split, c.tensor.name, c.src_backend, c.dst_backend) for c in sched.copies]
    assert copies == [(1, "h0", "cpu", "gpu"), (2, "h1", "gpu", "cpu"),
                      (3, "g1", "cpu", "gpu"), (3, "x", "cpu", "gpu")]
    assert [c.name for c in sched.splits[3].copies] == ["gpu#g1", "gpu#x"]


def test_run_with_copies_matches_one_backend_and_reads_only_local_data():
    graph, data = chain()
    ledger = Ledger()
    ledger.home.update({graph.find("x").id: "cpu", graph.find("w0").id: "cpu", graph.find("w1").id: "gpu"})
    cg = CompiledGraph(graph, devices(ledger), PLACEMENT)
    store = TensorStore(data)
    cg.run(store, {})
    expected_store = TensorStore(data)
    CompiledGraph(graph, [RefBackend()]).run(expected_store, {})
    out = graph.outputs[0]
    np.testing.assert_array_equal(store.array(out, {}), expected_store.array(out, {}))
    assert len(ledger.reads) == 8  # every source of every computing node was checked
    assert cg.copy_stats.copies == 4 and cg.copy_stats.runs == 1
    assert cg.copy_stats.bytes == 4 * 8 * 4 * 4  # four [8, 4] f32 tensors
    assert cg.copy_stats.by_pair == {("cpu", "gpu"): 3 * 128, ("gpu", "cpu"): 128}


def test_a_missing_copy_is_caught_by_the_ledger():
    """The run-time check can fail: drop one copy and the reading device refuses."""
    graph, data = chain()
    ledger = Ledger({graph.find("x").id: "cpu", graph.find("w0").id: "cpu", graph.find("w1").id: "gpu"})
    cg = CompiledGraph(graph, devices(ledger), PLACEMENT)
    cg.splits[1].copies.clear()
    with pytest.raises(AssertionError, match="gpu reads .*h0"):
        cg.run(TensorStore(data), {})


def test_one_copy_per_tensor_and_backend():
    """x is read by two gpu splits: copied once, before the first (as ggml reuses copies)."""
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    wg, wc = b.weight("wg", F32, (8, 8)), b.weight("wc", F32, (8, 4))
    h = b.name(b.add(b.mul_mat(wg, x), x), "h")          # gpu, reads x
    m = b.name(b.mul(h, wc), "m")                          # cpu: wc lives there, gpu cannot mul
    out = b.name(b.add(b.mul_mat(wg, m), x), "out")       # gpu, reads x again
    graph = b.build([out])
    gpu = FakeDevice("gpu", {"mul_mat", "add"}, memory="gpu")
    sched = schedule(graph, [gpu, FakeDevice("cpu")], {"wg": "gpu", "wc": "cpu"})
    assert [s.backend.name for s in sched.splits] == ["gpu", "cpu", "gpu"]
    assert [(c.split, c.tensor.name) for c in sched.copies] == [(0, "x"), (1, "h"), (2, "m")]


def test_upgrade_to_a_higher_priority_backend_sharing_memory():
    """A BLAS-like backend in host memory takes a node the cpu was given by expansion."""
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    m = b.name(b.mul(x, b.weight("wn", F32, (8, 1))), "m")  # blas cannot mul: 1.wgt1 on the cpu
    s = b.name(b.scale(m, 0.5), "s")                         # 2.down from m, then 3.upg to blas
    graph = b.build([s])
    blas = FakeDevice("blas", {"mul_mat", "scale"}, memory="cpu")
    a = assign(graph, [blas, FakeDevice("cpu")], {"wn": "cpu"})
    assert codes(graph, a)["m"] == ("cpu", "1.wgt1")
    assert codes(graph, a)["s"] == ("blas", "3.upg")
    assert a[graph.find("s").id].cause == "3.upg: blas shares cpu memory with cpu and runs scale"
    assert not a[graph.find("s").id].fallback


def test_no_upgrade_into_other_memory():
    b = GraphBuilder()
    m = b.name(b.mul(b.input("x", F32, (8, 4)), b.weight("wn", F32, (8, 1))), "m")
    s = b.name(b.scale(m, 0.5), "s")
    graph = b.build([s])
    gpu = FakeDevice("gpu", {"scale"}, memory="gpu")
    a = assign(graph, [gpu, FakeDevice("cpu")], {"wn": "cpu"})
    assert codes(graph, a)["s"] == ("cpu", "2.down")


def test_weight_on_a_device_that_cannot_run_its_op_is_copied_out():
    """llama.cpp moves such weights to the CPU at load; if one stays, the op falls back and
    the weight is copied to where it runs."""
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    m = b.name(b.mul(x, b.weight("wn", F32, (8, 1))), "m")
    graph = b.build([m])
    sched = schedule(graph, [FakeDevice("gpu", {"mul_mat"}, memory="gpu"), FakeDevice("cpu")], {"wn": "gpu"})
    a = sched.assignment[graph.find("m").id]
    assert (a.backend, a.code, a.fallback) == ("cpu", "3.best", True)
    assert [(c.tensor.name, c.src_backend, c.dst_backend) for c in sched.copies] == [("wn", "gpu", "cpu")]


def kv_graph() -> Graph:
    """A KV cache write and a read through a view, as build_attn does."""
    b = GraphBuilder()
    cache = b.cache("cache_k_l0", F32, (8, 16))
    k = b.input("k", F32, (8, 2))
    idx = b.input("idx", GGMLType.I64, (2,))
    stored = b.name(b.set_rows(cache, k, idx), "k_stored")
    view = b.view(stored, (8, 4), (32,))
    q = b.name(b.silu(b.input("q", F32, (8, 3))), "q")
    kq = b.name(b.mul_mat(view, q), "kq")
    return b.build([b.name(b.scale(kq, 2.0), "out")])


def test_kv_cache_writes_and_reads_run_where_the_cache_lives():
    graph = kv_graph()
    a = assign(graph, [FakeDevice("gpu", memory="gpu"), FakeDevice("cpu")], {"cache_k_l0": "gpu"})
    got = codes(graph, a)
    assert got["cache_k_l0"] == ("gpu", "1.dst")
    assert got["k_stored"] == ("gpu", "1.vsrc")
    assert got["kq"] == ("gpu", "1.kv0")
    assert got["q"] == ("gpu", "2.gpu-down")  # after k_stored in graph order
    assert a[graph.find("k_stored").id].cause == "1.vsrc: writes into cache_k_l0 on gpu"
    view = next(t for t in graph.nodes if t.op == "view")
    assert a[view.id].code == "4.vsrc" and a[view.id].backend == "gpu"


def test_writing_into_a_cache_no_backend_of_its_device_can_update_is_an_error():
    graph = kv_graph()
    with pytest.raises(SchedulerError, match=r"k_stored \(set_rows\) writes into .cache_k_l0. on gpu"):
        assign(graph, [FakeDevice("gpu", {"mul_mat"}, memory="gpu"), FakeDevice("cpu")], {"cache_k_l0": "gpu"})


def test_views_join_the_split_of_their_reader():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    h = b.name(b.mul(x, b.weight("wc", F32, (8, 1))), "h")    # cpu
    r = b.name(b.reshape(h, 4, 8), "r")                        # a view of h
    out = b.name(b.mul_mat(b.weight("wg", F32, (4, 4)), r), "out")  # gpu
    graph = b.build([out])
    sched = schedule(graph, [FakeDevice("gpu", {"mul_mat"}, memory="gpu"), FakeDevice("cpu")],
                     {"wc": "cpu", "wg": "gpu"})
    assert [[n.name for n in s.nodes] for s in sched.splits] == [["h"], ["r", "out"]]
    assert sched.assignment[r.id].backend == "cpu"  # a view lives with the memory it views
    assert [(c.tensor.name, c.split) for c in sched.copies] == [("r", 1)]


def test_leaves_without_placement_go_where_they_are_first_read():
    graph, _ = chain()
    a = assign(graph, devices(), {"w1": "gpu"})
    assert codes(graph, a)["w0"] == (a[graph.find("h0").id].backend, "4.cur")
    assert a[graph.find("w0").id].cause == "4.cur: read first by h0"


def test_tied_weight_held_twice_is_read_without_copies():
    """A placement may hold one leaf on two devices (llama.cpp's duplicated tied output):
    each reader uses its own device's copy."""

    class Tied:
        def device_for(self, leaf: Tensor, user: Tensor | None) -> str | None:
            if leaf.name == "emb":
                return "gpu" if user is not None and user.op == "mul_mat" else "cpu"
            return None

        def devices_of(self, leaf: Tensor) -> tuple[str, ...]:
            return ("cpu", "gpu") if leaf.name == "emb" else ()

    b = GraphBuilder()
    emb = b.weight("emb", F32, (8, 10))
    rows = b.name(b.get_rows(emb, b.input("ids", GGMLType.I32, (3,))), "rows")
    logits = b.name(b.mul_mat(emb, b.silu(rows)), "logits")
    graph = b.build([logits])
    sched = schedule(graph, [FakeDevice("gpu", memory="gpu"), FakeDevice("cpu")], Tied())
    got = codes(graph, sched.assignment)
    assert got["rows"] == ("cpu", "1.wgt0") and got["logits"] == ("gpu", "1.wgt0")
    assert [c.tensor.name for c in sched.copies] == ["rows"]  # never emb


# without a placement: the behaviour of one backend plus its fallback --------------------------
def test_without_placement_every_node_goes_to_the_first_backend_that_runs_it():
    graph, data = chain()
    cpu = FakeDevice("cpu", {"mul_mat", "silu", "add"})
    cg = CompiledGraph(graph, [cpu, RefBackend()])
    assert cg.fallbacks == [graph.find("g1")]
    assert {cg.assignment[n.id].backend for n in graph.nodes if n.name != "g1"} == {"cpu"}
    assert cg.copies == []  # both compute in host memory
    assert [s.backend.name for s in cg.splits] == ["cpu", "ref", "cpu"]
    store = TensorStore(data)
    cg.run(store, {})
    ref_store = TensorStore(data)
    CompiledGraph(graph, [RefBackend()]).run(ref_store, {})
    np.testing.assert_array_equal(store.array(graph.outputs[0], {}), ref_store.array(graph.outputs[0], {}))


# errors ----------------------------------------------------------------------------------------
def test_no_backend_for_an_op_is_a_clear_error():
    graph, _ = chain()
    with pytest.raises(SchedulerError, match=r"no backend can run g1 \(gelu_erf F32 \[8, 4\]\); tried gpu, cpu"):
        assign(graph, [FakeDevice("gpu", {"mul_mat", "silu", "add"}, memory="gpu"),
                       FakeDevice("cpu", {"mul_mat", "silu", "add"})], PLACEMENT)


def test_placement_on_a_device_without_backend_is_a_clear_error():
    graph, _ = chain()
    with pytest.raises(SchedulerError, match="weight 'w1' is placed on device 'cuda:3'"):
        assign(graph, devices(), {"w1": "cuda:3"})


def test_backend_names_must_be_distinct():
    graph, _ = chain()
    with pytest.raises(SchedulerError, match="distinct"):
        assign(graph, [FakeDevice("cpu"), FakeDevice("cpu")])


def test_describe_lists_splits_copies_and_causes():
    graph, _ = chain()
    text = schedule(graph, devices(), PLACEMENT).describe()
    lines = text.splitlines()
    assert lines[0] == "4 splits, 4 copies, 1 fallbacks; backends: gpu, cpu, ref"
    assert "## split #3: gpu, 1 nodes, 2 copies: [g1 from cpu] [x from cpu]" in lines
    assert any("g1" in ln and "fallback: gpu cannot run gelu_erf" in ln for ln in lines)


def test_without_placement_a_device_backend_runs_everything_it_supports():
    """A context on one device backend plus the reference fallback, no devices placed: the
    inputs follow their first reader, so host memory does not pull nodes to "ref"."""
    graph, _ = chain()
    gpu = FakeDevice("cuda", {"mul_mat", "silu", "add"}, memory="cuda:0")
    a = assign(graph, [gpu, RefBackend()])
    assert {n.name: a[n.id].backend for n in graph.nodes} == {
        "h0": "cuda", "a0": "cuda", "h1": "cuda", "g1": "ref", "out": "ref"}
    assert a[graph.find("x").id].cause == "4.cur: read first by h0"
    # after the fallback, `out` stays where its computed input is (x has no home yet)
    assert a[graph.find("out").id].cause == "3.best: 1 of 2 inputs in cpu memory"
