"""The reference backend as a context's fallback is a last resort: it runs the nodes no other
backend can (a product with a weight type only it reads), and none of their neighbours,
with or without a placement; such a node is told as a fallback either way."""
from __future__ import annotations

import numpy as np

from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.sched.registry import create_backend
from ggmlpy.sched.scheduler import CompiledGraph, assign, schedule
from ggmlpy.sched.store import TensorStore

from .fakes import FakeDevice, Ledger
from .test_scheduler import chain, rand

F32 = GGMLType.F32


def last_resort() -> RefBackend:
    be = create_backend("ref")
    assert isinstance(be, RefBackend) and be.last_resort  # as every context's fallback is made
    return be


def checked_last_resort(ledger: Ledger) -> FakeDevice:
    """A reference backend in host memory that checks its reads, as a last resort."""
    be = FakeDevice("ref", ledger=ledger)
    be.last_resort = True
    return be


def run_checked(graph: Graph, cg: CompiledGraph, ledger: Ledger, data: dict[str, np.ndarray]) -> None:
    """Run cg with leaves at home where the schedule put them; compare with the reference."""
    by_name = {b.name: b for b in cg.schedule.backends}
    ledger.home.update({t.id: by_name[cg.assignment[t.id].backend].buffer_type for t in graph.leafs})
    store, expected = TensorStore(data), TensorStore(data)
    cg.run(store, {})
    CompiledGraph(graph, [RefBackend()]).run(expected, {})
    np.testing.assert_array_equal(store.array(graph.outputs[0], {}), expected.array(graph.outputs[0], {}))


def test_the_registry_makes_ref_a_last_resort_and_ref_devices_not():
    from ggmlpy.sched.registry import create_device

    assert last_resort().last_resort
    assert not create_device("ref:1").last_resort  # a device layers are placed on
    assert not RefBackend().last_resort and not create_backend("cpu").last_resort


def test_without_placement_the_fallback_does_not_draw_the_next_node():
    """On a device context, a node after the fallback goes back to the device: before, it
    went where its computed input was (ggml's 3.best), and the rest of the graph with it."""
    graph, data = chain()
    ledger = Ledger()
    cuda = FakeDevice("cuda", {"mul_mat", "silu", "add"}, memory="cuda:0", ledger=ledger)
    a = assign(graph, [cuda, last_resort()])
    assert {n.name: a[n.id].backend for n in graph.nodes} == {
        "h0": "cuda", "a0": "cuda", "h1": "cuda", "g1": "ref", "out": "cuda"}
    assert a[graph.find("g1").id].fallback
    assert a[graph.find("out").id].cause == ("3.best: 0 of 2 inputs in cuda:0 memory (not ref: a last "
                                             "resort, it runs only what no other backend can)")
    assert not a[graph.find("out").id].fallback
    # the same graph with a plain reference backend keeps ggml's rule
    plain = assign(graph, [FakeDevice("cuda", {"mul_mat", "silu", "add"}, memory="cuda:0"), RefBackend()])
    assert plain[graph.find("out").id].backend == "ref"
    run_checked(graph, CompiledGraph(graph, [cuda, checked_last_resort(ledger)]), ledger, data)


def placed_graph() -> tuple[Graph, dict[str, np.ndarray]]:
    """h = mul_mat(w1, x) on the gpu; m = mul(x, wn) with wn in host memory, which the host
    CPU cannot run; s = add(m, h), which the gpu cannot run; out = silu(s)."""
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    h = b.name(b.mul_mat(b.weight("w1", F32, (8, 8)), x), "h")
    m = b.name(b.mul(x, b.weight("wn", F32, (8, 1))), "m")
    s = b.name(b.add(m, h), "s")
    out = b.name(b.silu(s), "out")
    return b.build([out]), {"x": rand(4, 8), "w1": rand(8, 8, seed=1), "wn": rand(1, 8, seed=2)}


def test_with_placement_a_pinned_fallback_is_told_and_spreads_nowhere():
    graph, data = placed_graph()
    ledger = Ledger()
    gpu = FakeDevice("gpu", {"mul_mat", "silu"}, memory="gpu", ledger=ledger)
    cpu = FakeDevice("cpu", {"mul_mat", "add", "silu"}, ledger=ledger)
    backends = [gpu, cpu, last_resort()]
    sched = schedule(graph, backends, {"w1": "gpu", "wn": "cpu"})
    a = sched.assignment
    got = {n.name: (a[n.id].backend, a[n.id].code) for n in graph.nodes}
    assert got == {"h": ("gpu", "1.wgt0"), "m": ("ref", "1.wgt1"), "s": ("cpu", "3.best"),
                   "out": ("gpu", "2.gpu-down")}
    # the weight pins m to the host's memory, where only the last resort runs it: a fallback
    assert a[graph.find("m").id].cause == "1.wgt1: reads weight wn on cpu (fallback: cpu cannot run mul)"
    assert [n.name for n in sched.fallbacks] == ["m", "s"]  # s: the gpu cannot add
    # before, expansion carried ref from m to s, and s (reading h from the gpu) stayed there
    assert not any(a[n.id].backend == "ref" for n in graph.nodes if n.name != "m")
    backends[2] = checked_last_resort(ledger)
    run_checked(graph, CompiledGraph(graph, backends, {"w1": "gpu", "wn": "cpu"}), ledger, data)
