"""`ggmlpy graph --backends`: splits, copies and causes in text and JSON, DOT coloured by
backend; and the dump annotations on their own."""
from __future__ import annotations

import json
import re

import pytest

from ggmlpy.cli import main
from ggmlpy.ir import dump
from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.types import GGMLType
from ggmlpy.testing.models import write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("cli") / "tiny.gguf", n_layer=3)


def graph_cmd(capsys, *args: str) -> str:
    assert main(["graph", *args]) == 0
    return capsys.readouterr().out


def test_text_shows_splits_copies_and_causes(capsys, tiny):
    out = graph_cmd(capsys, "-m", str(tiny), "--ubatch", "4", "--devices", "cpu:1", "-ngl", "2")
    assert "devices cpu:1, ngl 2" in out.splitlines()[0]
    sched = out[out.index("# schedule"):]
    splits = re.findall(r"^## split #(\d+): (\S+), (\d+) nodes, (\d+) copies", sched, re.M)
    assert [(i, be) for i, be, _, _ in splits] == [("0", "cpu"), ("1", "cpu:1")]
    # layer 2 and the output on cpu:1; what crosses: the residual stream and the graph inputs
    assert "[ffn_inp-1 from cpu]" in sched and "[inp_pos from cpu]" in sched
    assert re.search(r"Qcur-2 +\[cpu:1\] 1\.wgt0: reads weight blk\.2\.attn_q\.weight on cpu:1", sched)
    assert re.search(r"Qcur-1 +\[cpu\] 1\.wgt0: reads weight blk\.1\.attn_q\.weight on cpu\b", sched)
    assert re.search(r"k_stored-2 +\[cpu:1\] 1\.vsrc: writes into cache_k_l2 on cpu:1", sched)
    table = out[:out.index("# schedule")]
    header = table.splitlines()[2].split()
    assert header[:6] == ["key", "op", "type", "shape", "flags", "backend"]
    assert re.search(r"^n0 +get_rows +F32 +\[64, n_tokens\] +- +cpu +inp_embd", table, re.M)


def test_json_carries_the_schedule(capsys, tiny):
    out = graph_cmd(capsys, "-m", str(tiny), "--ubatch", "1", "--devices", "cpu:1", "-ngl", "99",
                    "--format", "json")
    record = json.loads(out)
    sched = record["schedule"]
    assert sched["backends"] == ["cpu:1", "cpu", "ref"]
    assert [s["backend"] for s in sched["splits"]] == ["cpu", "cpu:1"]
    assert sched["splits"][0]["nodes"] == ["n0"]  # only the embedding lookup stays on the host
    assert {c["tensor"] for c in sched["splits"][1]["copies"]} >= {"n0"}
    assert record["nodes"][0]["backend"] == "cpu" and sched["causes"]["n0"].startswith("1.wgt0")
    assert sched["fallbacks"] == []


def test_dot_colours_nodes_by_backend(capsys, tiny):
    out = graph_cmd(capsys, "-m", str(tiny), "--ubatch", "4", "--devices", "cpu:1", "-ngl", "2",
                    "--format", "dot")
    legend = dict(re.findall(r'legend_\d+ \[label="([^"]+)", fillcolor="(#[0-9a-f]+)"\]', out))
    assert set(legend) == {"cpu", "cpu:1"} and legend["cpu"] != legend["cpu:1"]
    tensors = re.findall(r'\n  ([nl]\d+) \[label="[^"]*@([^"]+)", fillcolor="(#[0-9a-f]+)"\]', out)
    assert len(tensors) == len(re.findall(r"^  [nl]\d+ \[label=", out, re.M))  # every tensor
    assert all(legend[be] == colour for _, be, colour in tensors)
    by_key = {key: be for key, be, _ in tensors}
    assert by_key["n0"] == "cpu" and {"cpu", "cpu:1"} == set(by_key.values())


def test_without_backends_the_dump_is_unchanged(capsys, tiny):
    out = graph_cmd(capsys, "-m", str(tiny), "--ubatch", "4")
    assert "# schedule" not in out and "backend" not in out.splitlines()[2]


def test_dump_annotations_cover_every_format():
    b = GraphBuilder()
    x = b.input("x", GGMLType.F32, (4,))
    y = b.name(b.silu(x), "y")
    graph = b.build([y])
    backends = {x.id: "cpu", y.id: "gpu"}
    assert "gpu" in dump.to_text(graph, backends).splitlines()[2]
    assert dump.to_dict(graph, backends)["nodes"][0]["backend"] == "gpu"
    assert dump.to_dict(graph)["nodes"][0].get("backend") is None and "backend" not in dump.to_dict(graph)["nodes"][0]
    dot = dump.to_dot(graph, "t", backends)
    assert '@gpu", fillcolor="#ffe0b3"' in dot and '@cpu", fillcolor="#c8dcff"' in dot
