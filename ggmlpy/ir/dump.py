"""Graph dumps: an aligned text table, JSON, Graphviz DOT and a networkx DiGraph.

Generic over any `Graph` (a model's ubatch graph, a K-shift graph, a pass's output), so the
same tools show a graph before and after a rewrite.

Every tensor gets a short key, unique within the graph: nodes (tensors with an op) are
`n0, n1, ...` and leafs `l0, l1, ...`, each numbered in graph order, as ggml numbers its
nodes and leafs. Sources refer to tensors by key, so a dump is unambiguous even where
names repeat or are empty.

Flags are letters: W weight (model data bound by name), I input (set per ubatch by the
runtime), C cache (persistent KV state), O output (read back after compute). Shapes show
symbolic dimensions by name, e.g. [576, n_tokens].
"""
from __future__ import annotations

import enum
import json
import math
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.symbolic import SymExpr, dim_str
from ggmlpy.ir.tensor import Flag, Tensor

if TYPE_CHECKING:
    import networkx

FLAG_LETTERS = ((Flag.WEIGHT, "W"), (Flag.INPUT, "I"), (Flag.CACHE, "C"), (Flag.OUTPUT, "O"), (Flag.FILE_LAYOUT, "F"))

# fill colours per tensor kind in DOT dumps
KIND_COLOURS = {
    "weight": "#fff2b3",  # pale yellow
    "input": "#c8f0c8",   # pale green
    "cache": "#c8dcff",   # pale blue
    "leaf": "#e8e8e8",    # constant leaf without a role
    "view": "#f4f4f4",    # layout-only node (reshape/view/permute/transpose)
    "op": "#ffffff",
    "output": "#ffc8c8",  # pale red
}
VIEW_OPS = frozenset({"view", "reshape", "permute", "transpose"})
# fill colours per backend in DOT dumps annotated with the scheduler's assignment
BACKEND_COLOURS = ("#c8dcff", "#ffe0b3", "#d4f0c8", "#f0c8f0", "#fff2b3", "#c8f0f0", "#e8e8e8")


# per-tensor facts ---------------------------------------------------------------------------
def tensor_keys(graph: Graph) -> dict[int, str]:
    """Tensor id -> key (`n<i>` for the i-th node, `l<i>` for the i-th leaf)."""
    keys: dict[int, str] = {}
    n_nodes = n_leafs = 0
    for t in graph.tensors:
        if t.is_leaf:
            keys[t.id] = f"l{n_leafs}"
            n_leafs += 1
        else:
            keys[t.id] = f"n{n_nodes}"
            n_nodes += 1
    return keys


def flag_str(t: Tensor) -> str:
    """The tensor's roles as letters, e.g. "W", "I", "O" or "" for a plain intermediate."""
    return "".join(letter for flag, letter in FLAG_LETTERS if t.flags & flag)


def tensor_kind(t: Tensor) -> str:
    """One word for what a tensor is, used to colour DOT nodes."""
    for flag, kind in ((Flag.OUTPUT, "output"), (Flag.WEIGHT, "weight"), (Flag.INPUT, "input"),
                       (Flag.CACHE, "cache")):
        if t.flags & flag:
            return kind
    if t.is_leaf:
        return "leaf"
    return "view" if t.op in VIEW_OPS else "op"


def jsonable(value: Any) -> Any:
    """Op params as JSON values: symbols by name, tuples as lists, non-finite floats as text."""
    if isinstance(value, SymExpr):
        return dim_str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, enum.Enum):  # before int: GGMLType is an IntEnum
        return value.name
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, int):
        return int(value)
    if hasattr(value, "item"):  # numpy scalar
        return jsonable(value.item())
    return repr(value)


def _dims(dims: tuple[Any, ...]) -> list[int | str]:
    return [d if isinstance(d, int) else dim_str(d) for d in dims]


def tensor_record(t: Tensor, keys: dict[int, str]) -> dict[str, Any]:
    """Everything a dump shows about one tensor, as plain JSON-ready values."""
    return {
        "key": keys[t.id],
        "op": t.op,
        "type": t.type.name,
        "ne": _dims(t.ne),
        "nb": _dims(t.nb),
        "shape": t.shape_str(),
        "name": t.name,
        "flags": flag_str(t),
        "src": [keys[s.id] for s in t.src],
        "params": jsonable(t.params),
        "view_src": keys[t.view_src.id] if t.view_src is not None else None,
        "view_offs": t.view_offs if isinstance(t.view_offs, int) else dim_str(t.view_offs),
    }


# summary ------------------------------------------------------------------------------------
def summary(graph: Graph) -> dict[str, Any]:
    """Counts of nodes, leafs, roles and ops (most frequent first), and the signature."""
    leafs = graph.leafs
    nodes = graph.nodes
    roles = {letter: sum(1 for t in graph.tensors if t.flags & flag) for flag, letter in FLAG_LETTERS}
    ops = Counter(t.op for t in nodes)
    return {
        "n_nodes": len(nodes),
        "n_leafs": len(leafs),
        "n_weights": roles["W"],
        "n_inputs": roles["I"],
        "n_cache": roles["C"],
        "n_outputs": roles["O"],
        "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "signature": graph.signature(),
    }


def summary_line(graph: Graph) -> str:
    s = summary(graph)
    ops = ", ".join(f"{op} {n}" for op, n in s["ops"].items())
    return (f"graph: {s['n_nodes']} nodes, {s['n_leafs']} leafs; {s['n_weights']} W, "
            f"{s['n_inputs']} I, {s['n_cache']} C, {s['n_outputs']} O; ops: {ops}; "
            f"signature {s['signature']}")


# JSON ---------------------------------------------------------------------------------------
def to_dict(graph: Graph, backends: Mapping[int, str] | None = None) -> dict[str, Any]:
    """{"signature", "summary", "outputs": [keys], "nodes": [records], "leafs": [records]};
    with `backends` (tensor id -> backend name) every record also has a "backend"."""
    keys = tensor_keys(graph)

    def record(t: Tensor) -> dict[str, Any]:
        rec = tensor_record(t, keys)
        if backends is not None:
            rec["backend"] = backends.get(t.id)
        return rec

    return {
        "signature": graph.signature(),
        "summary": summary(graph),
        "outputs": [keys[o.id] for o in graph.outputs],
        "nodes": [record(t) for t in graph.nodes],
        "leafs": [record(t) for t in graph.leafs],
    }


def to_json(graph: Graph, indent: int | None = 1, backends: Mapping[int, str] | None = None) -> str:
    return json.dumps(to_dict(graph, backends), indent=indent)


# text ---------------------------------------------------------------------------------------
def _param_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_param_text(v) for v in value) + ")"
    if isinstance(value, SymExpr):
        return dim_str(value)
    return str(value)


def _source_labels(graph: Graph, keys: dict[int, str]) -> dict[int, str]:
    """How the text table names a source: its name when unique in the graph, else its key."""
    counts = Counter(t.name for t in graph.tensors if t.name)
    return {t.id: t.name if t.name and counts[t.name] == 1 else keys[t.id] for t in graph.tensors}


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header] + rows]


def to_text(graph: Graph, backends: Mapping[int, str] | None = None) -> str:
    """Nodes then leafs as aligned tables (key, op, type, shape, flags, name, sources, params),
    ending with the summary line. `backends` (tensor id -> backend name, as the scheduler
    assigns them) adds a backend column after the flags."""
    keys = tensor_keys(graph)
    labels = _source_labels(graph, keys)
    header = ["key", "op", "type", "shape", "flags", "name", "src", "params"]
    if backends is not None:
        header.insert(5, "backend")

    def row(t: Tensor) -> list[str]:
        params = " ".join(f"{k}={_param_text(v)}" for k, v in t.params.items())
        if t.view_src is not None:
            params = (params + " " if params else "") + f"view_of={labels[t.view_src.id]}"
        cells = [keys[t.id], t.op, t.type.name, t.shape_str(), flag_str(t) or "-", t.name or "-",
                 ", ".join(labels[s.id] for s in t.src) or "-", params]
        if backends is not None:
            cells.insert(5, backends.get(t.id, "-"))
        return cells

    nodes, leafs = graph.nodes, graph.leafs
    n_leaf_cols = len(header) - 1  # leafs have no params
    lines = [f"nodes: {len(nodes)}"]
    lines += _table([row(t) for t in nodes], header) if nodes else []
    lines += ["", f"leafs: {len(leafs)}"]
    lines += _table([row(t)[:n_leaf_cols] for t in leafs], header[:n_leaf_cols]) if leafs else []
    lines += ["", summary_line(graph)]
    return "\n".join(lines) + "\n"


# DOT ----------------------------------------------------------------------------------------
def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def backend_colours(names: Iterable[str]) -> dict[str, str]:
    """A fill colour per backend name, in order of first appearance."""
    out: dict[str, str] = {}
    for name in names:
        if name not in out:
            out[name] = BACKEND_COLOURS[len(out) % len(BACKEND_COLOURS)]
    return out


def to_dot(graph: Graph, title: str = "ggmlpy", backends: Mapping[int, str] | None = None) -> str:
    """Graphviz source: one line per tensor (coloured by kind), one per edge src -> dst.

    A view whose memory owner is not among its sources gets an extra dashed edge from the
    owner, so reads of the KV cache stay visible. With `backends` (tensor id -> backend
    name) tensors are coloured by backend instead, each label names its backend, and a
    legend lists the colours."""
    keys = tensor_keys(graph)
    colours = backend_colours(backends[t.id] for t in graph.tensors if t.id in backends) if backends else {}
    lines = [f"digraph {_dot_quote(title)} {{",
             "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="monospace", fontsize=10];']
    for t in graph.tensors:
        kind = tensor_kind(t)
        head = keys[t.id] if t.is_leaf else f"{keys[t.id]} {t.op}"
        flags = flag_str(t)
        backend = backends.get(t.id) if backends else None
        label = "\n".join(part for part in (
            head + (f" [{flags}]" if flags else ""), t.name, f"{t.type.name} {t.shape_str()}",
            f"@{backend}" if backend else "") if part)
        fill = colours[backend] if backend else KIND_COLOURS[kind]
        lines.append(f"  {keys[t.id]} [label={_dot_quote(label)}, fillcolor=\"{fill}\"];")
    if colours:
        lines.append('  subgraph cluster_legend { label="backends"; fontname="monospace";')
        for i, (name, fill) in enumerate(colours.items()):
            lines.append(f"    legend_{i} [label={_dot_quote(name)}, fillcolor=\"{fill}\"];")
        lines.append("  }")
    for t in graph.tensors:
        for s in t.src:
            lines.append(f"  {keys[s.id]} -> {keys[t.id]};")
        if t.view_src is not None and all(s.id != t.view_src.id for s in t.src):
            lines.append(f"  {keys[t.view_src.id]} -> {keys[t.id]} [style=dashed, color=gray];")
    lines.append("}")
    return "\n".join(lines) + "\n"


# networkx -----------------------------------------------------------------------------------
def to_networkx(graph: Graph) -> "networkx.DiGraph":
    """A DiGraph keyed by tensor key; node attributes are the JSON record plus `kind`; edges
    src -> dst carry `arg` (the source position) or `kind="view"` for a memory-owner edge."""
    import networkx as nx

    keys = tensor_keys(graph)
    g = nx.DiGraph(signature=graph.signature())
    for t in graph.tensors:
        record = tensor_record(t, keys)
        g.add_node(record.pop("key"), kind=tensor_kind(t), **record)
    for t in graph.tensors:
        for i, s in enumerate(t.src):
            if not g.has_edge(keys[s.id], keys[t.id]):  # x*x: one edge, first position
                g.add_edge(keys[s.id], keys[t.id], arg=i, kind="src")
        if t.view_src is not None and not g.has_edge(keys[t.view_src.id], keys[t.id]):
            g.add_edge(keys[t.view_src.id], keys[t.id], kind="view")
    return g
