"""Model Explorer JSON (loaded with its own graph_builder dataclasses when the package is
installed), the Chrome/Perfetto trace of a profiled decode, and the CLI."""
from __future__ import annotations

import json
import os

import pytest

from ggmlpy.cli import main
from ggmlpy.viz import model_explorer, trace
from ggmlpy.viz.data import page_data

EVENT_KEYS = ("ph", "ts", "pid", "tid")


def test_model_explorer_graph(split_snapshot):
    data = model_explorer.graph_collection(split_snapshot)
    graph = data["graphs"][0]
    ids = [n["id"] for n in graph["nodes"]]
    sched = split_snapshot.schedule
    assert len(ids) == len(set(ids)) == len(split_snapshot.graph.tensors) + len(sched.copies)
    known = set(ids)
    assert all(e["sourceNodeId"] in known for n in graph["nodes"] for e in n["incomingEdges"])
    assert sum(len(n["incomingEdges"]) for n in graph["nodes"]) == \
        sum(len(t.src) for t in split_snapshot.graph.tensors) + len(sched.copies)
    namespaces = {n["namespace"].split("/")[0] for n in graph["nodes"]}
    assert {f"layer_{i}" for i in range(30)} <= namespaces
    assert any("/norm_mul_" in n["namespace"] for n in graph["nodes"])
    try:
        import dacite
        from model_explorer import graph_builder as gb
    except ImportError:   # the schema, as graph_builder's dataclasses define it
        for n in graph["nodes"]:
            assert isinstance(n["id"], str) and isinstance(n["label"], str)
            assert all(set(kv) == {"key", "value"} and isinstance(kv["value"], str) for kv in n["attrs"])
        return
    coll = dacite.from_dict(gb.GraphCollection, data, config=dacite.Config(strict=True))
    assert len(coll.graphs[0].nodes) == len(ids)
    assert coll.graphs[0].nodes[0].outputsMetadata[0].attrs[0].key == "tensor_shape"


@pytest.fixture(scope="module")
def profiled(smollm2_path, monkeypatch_module, tmp_path_factory):
    """A profiled decode (4 steps) of SmolLM2 with 4 layers on cpu:1, through the CLI's own
    path, as a trace and as the page's data."""
    from ggmlpy.cli import build_parser
    from ggmlpy.cli.viz_cmd import _profiled

    # the CLI hands profiling to the context's backends (backend_options), not the environment
    monkeypatch_module.delenv("GGMLPY_PROFILE", raising=False)
    args = build_parser().parse_args(["viz", "-m", str(smollm2_path), "--decode", "--steps", "4", "--devices", "cpu:1",
                                   "-ngl", "4", "-c", "256", "-o", str(tmp_path_factory.mktemp("t") / "x")])
    snap = _profiled(args, 1)
    assert "GGMLPY_PROFILE" not in os.environ
    return snap


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_trace_is_well_formed(profiled):
    events = trace.trace_events(profiled)["traceEvents"]
    assert all(all(k in e for k in EVENT_KEYS) for e in events)
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")
    kernels = [e for e in events if e["ph"] == "X" and e["cat"] == "kernel"]
    assert len(kernels) >= len(profiled.profile.times)            # one slice per node and thread
    assert {e["pid"] for e in kernels} == {1, 2}                    # cpu:1 and cpu
    starts = [e["id"] for e in events if e["ph"] == "s"]
    ends = [e["id"] for e in events if e["ph"] == "f"]
    assert sorted(starts) == sorted(ends) == list(range(len(profiled.schedule.copies))) and starts
    counters = [e for e in events if e["ph"] == "C"]
    assert max(e["args"]["live"] for e in counters) == profiled.lifetimes.peak_bytes
    json.dumps(events, allow_nan=False)


def test_profile_times_reach_the_page_and_model_explorer(profiled):
    data = page_data(profiled)
    timed = [i for i in data["graph"]["info"] if "time" in i]
    assert len(timed) == len(profiled.profile.times) > 100
    total = sum(i["time"] for i in timed)
    assert total == pytest.approx(profiled.profile.native_us(), rel=1e-3)
    assert 0 < total <= profiled.profile.step_us * 1.02   # native time is part of a step's wall time
    nd = model_explorer.node_data(profiled)
    (results,) = [g["results"] for g in nd.values()]
    assert len(results) == len(timed)
    try:
        import dacite
        from model_explorer import node_data_builder as ndb
    except ImportError:
        return
    gnd = dacite.from_dict(ndb.GraphNodeData, next(iter(nd.values())))
    assert len(gnd.results) == len(timed)


def test_trace_needs_a_profile(split_snapshot):
    with pytest.raises(ValueError, match="profile"):
        trace.trace_events(split_snapshot)


def test_cli_writes_each_format(smollm2_path, tmp_path):
    out = tmp_path / "g.json"
    assert main(["viz", "-m", str(smollm2_path), "--decode", "--no-code", "-c", "256",
                 "--format", "model-explorer", "-o", str(out)]) == 0
    graph = json.loads(out.read_text())["graphs"][0]
    assert graph["id"].endswith(":ubatch1") and len(graph["nodes"]) > 500
    txt = tmp_path / "g.txt"
    assert main(["viz", "-m", str(smollm2_path), "--decode", "--no-code", "-c", "256", "--format", "txt",
                 "-o", str(txt)]) == 0
    assert "# schedule" in txt.read_text() and "nodes:" in txt.read_text()
