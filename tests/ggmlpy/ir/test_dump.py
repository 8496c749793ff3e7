"""Graph dumps (`ggmlpy.ir.dump`) on a small hand-built graph whose every row is known, and
`ggmlpy graph` on SmolLM2, checked against facts of the model file (30 layers, 272 weight
tensors, tied output) rather than against the dump code's own counting."""
from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from ggmlpy.cli import main
from ggmlpy.gguf import GGUFFile
from ggmlpy.ir import N_KV, N_TOKENS, GGMLType, GraphBuilder, dump

# small graph --------------------------------------------------------------------------------


@pytest.fixture
def small():
    """x:I [8, n_tokens], w:W [8, 4], c:C [4, 16];  y-0 = w @ x;  out = reshape(0.5 * y*y);
    a second output reads a transposed view of the cache."""
    b = GraphBuilder()
    x = b.input("x", GGMLType.F32, (8, N_TOKENS))
    w = b.weight("w", GGMLType.F32, (8, 4))
    c = b.cache("c", GGMLType.F16, (4, 16))
    y = b.name(b.mul_mat(w, x), "y", 0)
    sq = b.mul(y, y)
    s = b.scale(sq, 0.5)
    out = b.name(b.reshape(s, 2, 2, N_TOKENS), "out")
    view = b.view(c, (4, N_KV), (8,))
    tr = b.transpose(view)
    cont = b.cont(tr)
    graph = b.build([out, cont])
    return graph, dict(x=x, w=w, c=c, y=y, sq=sq, s=s, out=out, view=view, tr=tr, cont=cont)


def test_keys_number_nodes_and_leafs_separately(small):
    graph, t = small
    keys = dump.tensor_keys(graph)
    assert sorted(keys[t[n].id] for n in ("x", "w", "c")) == ["l0", "l1", "l2"]
    node_keys = [keys[n.id] for n in graph.nodes]
    assert node_keys == [f"n{i}" for i in range(7)]
    # data flow order: y-0 before its square, before the scale, before the reshape
    assert [keys[t[n].id] for n in ("y", "sq", "s", "out")] == ["n0", "n1", "n2", "n3"]


def test_records_show_roles_shapes_sources_and_params(small):
    graph, t = small
    d = dump.to_dict(graph)
    nodes = {r["key"]: r for r in d["nodes"]}
    leafs = {r["name"]: r for r in d["leafs"]}
    assert {n: leafs[n]["flags"] for n in "xwc"} == {"x": "I", "w": "W", "c": "C"}
    assert leafs["x"]["ne"] == [8, "n_tokens", 1, 1] and leafs["x"]["shape"] == "[8, n_tokens]"
    assert leafs["x"]["nb"] == [4, 32, "32*n_tokens", "32*n_tokens"]
    y = nodes["n0"]
    assert (y["op"], y["type"], y["name"], y["shape"], y["flags"]) == \
        ("mul_mat", "F32", "y-0", "[4, n_tokens]", "")
    assert y["src"] == [leafs["w"]["key"], leafs["x"]["key"]]  # ggml order: weight first
    assert nodes["n1"]["src"] == ["n0", "n0"]
    assert nodes["n2"]["params"] == {"s": 0.5, "b": 0.0}
    out = nodes["n3"]
    assert (out["op"], out["name"], out["flags"], out["shape"]) == ("reshape", "out", "O", "[2, 2, n_tokens]")
    assert out["params"] == {"ne": [2, 2, "n_tokens"]} and out["view_src"] == "n2"
    view = next(r for r in d["nodes"] if r["op"] == "view")
    assert view["view_src"] == leafs["c"]["key"] and view["shape"] == "[4, n_kv]"
    assert view["params"]["nb"] == [2, 8, "8*n_kv", "8*n_kv"]
    assert d["outputs"] == ["n3", "n6"] and nodes["n6"]["flags"] == "O"
    assert d["signature"] == graph.signature() == d["summary"]["signature"]
    json.loads(dump.to_json(graph))  # plain JSON, no NaN/Infinity tokens


def test_summary_counts(small):
    graph, _ = small
    s = dump.summary(graph)
    assert (s["n_nodes"], s["n_leafs"], s["n_weights"], s["n_inputs"], s["n_cache"], s["n_outputs"]) == \
        (7, 3, 1, 1, 1, 2)
    assert s["ops"] == {"cont": 1, "mul": 1, "mul_mat": 1, "permute": 1, "reshape": 1, "scale": 1,
                        "view": 1}
    line = dump.summary_line(graph)
    assert line.startswith("graph: 7 nodes, 3 leafs; 1 W, 1 I, 1 C, 2 O; ops: ")
    assert line.endswith(f"signature {graph.signature()}")


def test_jsonable_values():
    assert dump.jsonable((N_TOKENS * 2 + 1, float("-inf"), float("nan"), 1.5, (N_KV, 3))) == \
        ["1 + 2*n_tokens", "-inf", "nan", 1.5, ["n_kv", 3]]
    assert dump.jsonable({"mode": GGMLType.Q4_1}) == {"mode": "Q4_1"}
    json.dumps(dump.jsonable({"v": float("inf")}), allow_nan=False)


def test_text_table(small):
    graph, _ = small
    lines = dump.to_text(graph).splitlines()
    assert lines[0] == "nodes: 7"
    assert lines[1].split() == ["key", "op", "type", "shape", "flags", "name", "src", "params"]
    rows = {line.split()[0]: line for line in lines if re.match(r"[nl]\d+ ", line)}
    assert len(rows) == 10
    assert rows["n0"].split()[:7] == ["n0", "mul_mat", "F32", "[4,", "n_tokens]", "-", "y-0"]
    assert "w, x" in rows["n0"]            # sources by unique name
    assert "y-0, y-0" in rows["n1"]
    assert rows["n2"].split()[-3:] == ["n1", "s=0.5", "b=0"]  # unnamed source by key
    assert "view_of=c" in rows["n5"]
    assert rows["l1"].split() == ["l1", "none", "F32", "[8,", "n_tokens]", "I", "x", "-"]
    assert lines[-1] == dump.summary_line(graph)


def test_text_sources_fall_back_to_keys_for_repeated_names():
    b = GraphBuilder()
    x = b.input("x", GGMLType.F32, (4,))
    a1 = b.name(b.scale(x, 2.0), "same")
    a2 = b.name(b.scale(x, 3.0), "same")
    graph = b.build([b.add(a1, a2)])
    last = [line for line in dump.to_text(graph).splitlines() if line.startswith("n2 ")][0]
    assert "n0, n1" in last


def dot_parts(text: str) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    nodes = dict(re.findall(r"^  ([nl]\d+) \[(.*)\];$", text, re.M))
    edges = re.findall(r"^  ([nl]\d+) -> ([nl]\d+)(.*);$", text, re.M)
    return nodes, edges


def test_dot(small):
    graph, t = small
    text = dump.to_dot(graph, title='my "graph"')
    assert text.startswith('digraph "my \\"graph\\"" {\n') and text.rstrip().endswith("}")
    nodes, edges = dot_parts(text)
    assert len(nodes) == len(graph.tensors) == 10
    keys = dump.tensor_keys(graph)
    assert dump.KIND_COLOURS["input"] in nodes[keys[t["x"].id]]
    assert dump.KIND_COLOURS["weight"] in nodes[keys[t["w"].id]]
    assert dump.KIND_COLOURS["cache"] in nodes[keys[t["c"].id]]
    assert dump.KIND_COLOURS["output"] in nodes[keys[t["out"].id]]
    assert dump.KIND_COLOURS["op"] in nodes[keys[t["y"].id]]
    assert dump.KIND_COLOURS["view"] in nodes[keys[t["view"].id]]
    assert 'label="n0 mul_mat\\ny-0\\nF32 [4, n_tokens]"' in nodes["n0"]
    solid = sorted((a, b) for a, b, extra in edges if not extra)
    expect = sorted((keys[s.id], keys[n.id]) for n in graph.tensors for s in n.src)
    assert solid == expect and len(solid) == 9  # y*y drawn as two edges
    # the transpose reads the cache through the view: one extra dashed edge from its owner
    dashed = [(a, b) for a, b, extra in edges if "dashed" in extra]
    assert dashed == [(keys[t["c"].id], keys[t["tr"].id])]


def test_networkx(small):
    graph, t = small
    g = dump.to_networkx(graph)
    keys = dump.tensor_keys(graph)
    assert set(g.nodes) == set(keys.values())
    assert g.nodes["n0"]["op"] == "mul_mat" and g.nodes["n0"]["name"] == "y-0"
    assert g.nodes[keys[t["x"].id]]["kind"] == "input" and g.nodes[keys[t["x"].id]]["flags"] == "I"
    assert g.edges[keys[t["x"].id], "n0"]["arg"] == 1 and g.edges[keys[t["w"].id], "n0"]["arg"] == 0
    assert g.edges["n0", "n1"]["arg"] == 0                 # y*y: one edge
    assert g.edges[keys[t["c"].id], keys[t["tr"].id]]["kind"] == "view"
    assert g.number_of_edges() == 9                        # 9 sources, y*y counted once, + 1 view
    import networkx as nx
    order = list(nx.topological_sort(g))
    assert order.index(keys[t["w"].id]) < order.index("n0") < order.index("n3")


# ggmlpy graph on SmolLM2 --------------------------------------------------------------------
N_LAYER = 30
INPUTS = {"inp_tokens": "[n_tokens]", "inp_pos": "[n_tokens]", "inp_k_idxs": "[n_tokens]",
          "inp_kq_mask": "[n_kv, n_tokens]", "inp_out_ids": "[n_outputs]"}


def call(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def graph_json(path, ubatch: int, n_ctx: int = 256) -> dict:
    rc, out, err = call("graph", "-m", str(path), "--ubatch", str(ubatch), "-c", str(n_ctx),
                        "--format", "json")
    assert rc == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def smol_json(smollm2_path) -> dict:
    return graph_json(smollm2_path, 5)


def test_graph_json_op_counts(smol_json):
    ops = {}
    for r in smol_json["nodes"]:
        ops[r["op"]] = ops.get(r["op"], 0) + 1
    # per layer: q, k, v, o, gate, up, down, kq, kqv; plus the output projection
    assert ops["mul_mat"] == N_LAYER * 9 + 1
    assert ops["rms_norm"] == 2 * N_LAYER + 1 and ops["mul"] == 2 * N_LAYER + 1
    assert ops["rope"] == 2 * N_LAYER and ops["set_rows"] == 2 * N_LAYER
    assert ops["soft_max"] == N_LAYER and ops["swiglu"] == N_LAYER
    assert ops["add"] == 2 * N_LAYER                   # two residuals per layer
    assert ops["get_rows"] == 3                        # embeddings + the last layer's out_ids
    assert ops == smol_json["summary"]["ops"]
    assert len(smol_json["nodes"]) == smol_json["summary"]["n_nodes"] == sum(ops.values())


def test_graph_json_leafs_and_roles(smol_json, smollm2_path):
    leafs = {r["name"]: r for r in smol_json["leafs"]}
    with GGUFFile(smollm2_path) as f:
        file_tensors = {name: (t.type.name, list(t.ne)) for name, t in f.tensors.items()}
    weights = {n: r for n, r in leafs.items() if r["flags"] == "W"}
    assert len(file_tensors) == 272
    # every tensor of the file is a weight leaf (output.weight is tied to token_embd)
    assert {n: (r["type"], [d for d in r["ne"] if d != 1] or [1]) for n, r in weights.items()} == \
        {n: (ty, [d for d in ne if d != 1] or [1]) for n, (ty, ne) in file_tensors.items()}
    for name, shape in INPUTS.items():
        assert leafs[name]["flags"] == "I" and leafs[name]["shape"] == shape, name
    caches = {n for n, r in leafs.items() if r["flags"] == "C"}
    assert caches == {f"cache_{kv}_l{il}" for kv in "kv" for il in range(N_LAYER)}
    assert leafs["cache_k_l0"]["shape"] == "[192, 256]" and leafs["cache_k_l0"]["type"] == "F16"
    assert len(leafs) == 272 + len(INPUTS) + 2 * N_LAYER == smol_json["summary"]["n_leafs"]


def test_graph_json_names_sources_and_output(smol_json):
    nodes = {r["key"]: r for r in smol_json["nodes"]}
    everything = {r["key"]: r for r in smol_json["nodes"] + smol_json["leafs"]}
    by_name = {r["name"]: r for r in everything.values() if r["name"]}
    for il in range(N_LAYER):
        for name in ("attn_norm", "Qcur", "Kcur_rope", "kq_soft_max", "ffn_out", "l_out"):
            assert f"{name}-{il}" in by_name, f"{name}-{il}"
    q = by_name["Qcur-0"]
    assert q["op"] == "mul_mat" and q["shape"] == "[576, n_tokens]"
    assert [everything[k]["name"] for k in q["src"]] == ["blk.0.attn_q.weight", "attn_norm-0"]
    assert all(k in everything for r in nodes.values() for k in r["src"])
    out = by_name["result_output"]
    assert smol_json["outputs"] == [out["key"]]
    assert out["flags"] == "O" and out["shape"] == "[49152, n_outputs]" and out["op"] == "mul_mat"


def test_graph_signature_by_tokens_class(smol_json, smollm2_path):
    """Sizes are symbols: 5 and 300 tokens share a graph; one token is its own class, without
    the selection of output rows (two get_rows nodes and the inp_out_ids leaf); the KV size
    is static (it is in the cache leaves' shapes)."""
    big = graph_json(smollm2_path, 300, n_ctx=512)
    assert graph_json(smollm2_path, 5, n_ctx=512)["signature"] == big["signature"]
    assert big["signature"] != smol_json["signature"]
    single = graph_json(smollm2_path, 1)
    assert single["signature"] != smol_json["signature"]
    assert len(single["nodes"]) == len(smol_json["nodes"]) - 2
    assert sum(r["op"] == "get_rows" for r in smol_json["nodes"]) == 3  # the embedding and the two
    assert sum(r["op"] == "get_rows" for r in single["nodes"]) == 1
    assert {r["name"] for r in smol_json["leafs"]} - {r["name"] for r in single["leafs"]} == {"inp_out_ids"}


def test_graph_dot(smollm2_path, smol_json):
    rc, out, err = call("graph", "-m", str(smollm2_path), "--ubatch", "5", "-c", "256", "--format", "dot")
    assert rc == 0, err
    assert out.startswith("digraph ") and out.rstrip().endswith("}")
    nodes, edges = dot_parts(out)
    n_tensors = len(smol_json["nodes"]) + len(smol_json["leafs"])
    assert len(nodes) == n_tensors
    assert sum(1 for line in out.splitlines() if re.match(r"  [nl]\d+ \[label=", line)) == n_tensors
    assert all(a in nodes and b in nodes for a, b, _ in edges)
    assert sum(1 for _, _, extra in edges if not extra) == sum(len(r["src"]) for r in smol_json["nodes"])
    names = {r["name"]: r["key"] for r in smol_json["leafs"]}
    assert dump.KIND_COLOURS["input"] in nodes[names["inp_kq_mask"]]
    assert dump.KIND_COLOURS["weight"] in nodes[names["token_embd.weight"]]
    assert dump.KIND_COLOURS["cache"] in nodes[names["cache_v_l7"]]


def test_graph_text_and_output_file(smollm2_path, smol_json, tmp_path):
    target = tmp_path / "g.txt"
    rc, out, err = call("graph", "-m", str(smollm2_path), "--ubatch", "5", "-c", "256", "-o", str(target))
    assert rc == 0 and out == "" and err.startswith(f"wrote {target}: graph: ")
    lines = target.read_text().splitlines()
    assert lines[0] == "# SmolLM2-135M-Instruct.Q4_1.gguf: ubatch 5 (multi), n_ctx 256"
    n_nodes = smol_json["summary"]["n_nodes"]
    assert lines[1] == f"nodes: {n_nodes}"
    assert sum(1 for line in lines if re.match(r"n\d+ ", line)) == n_nodes
    mask = [line.split() for line in lines if line.endswith(" inp_kq_mask     -") or
            (line.startswith("l") and " inp_kq_mask " in line)]
    assert len(mask) == 1 and mask[0][1:6] == ["none", "F32", "[n_kv,", "n_tokens]", "I"]
    assert lines[-1].endswith(f"signature {smol_json['signature']}")
    assert f"{smol_json['summary']['n_weights']} W, 5 I, 60 C, 1 O" in lines[-1]


@pytest.mark.parametrize("args, message", [
    (["--ubatch", "0"], "--ubatch must be at least 1"),
    (["--ubatch", "1000", "-c", "256"], "exceeds the context size 256"),
])
def test_graph_bad_arguments(smollm2_path, args, message):
    rc, out, err = call("graph", "-m", str(smollm2_path), *args)
    assert rc == 1 and out == "" and message in err and err.count("\n") == 1
