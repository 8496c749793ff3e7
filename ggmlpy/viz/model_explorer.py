"""Export for Google AI Edge Model Explorer: its graph JSON (a GraphCollection as its
`graph_builder` dataclasses define it) and, with a profile, its node-data JSON.

Layers become namespaces (`layer_3`), fusion groups a namespace inside their layer
(`layer_3/rms_norm_mul_12`), so Model Explorer folds them as the page does. Node ids are the
dump keys (n0, l0, ...; copies `copy0`, ...), attrs carry what the page's node panel shows,
and each node's output metadata has its `tensor_shape`, which Model Explorer puts on edges.
A consumer that reads a copied tensor reads it from the copy node.
"""
from __future__ import annotations

import json
from typing import Any

from ggmlpy.ir import dump
from ggmlpy.ir.tensor import Tensor
from ggmlpy.passes.fusion import fusion_groups
from ggmlpy.viz.snapshot import Snapshot

GRADIENT = [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 0.5, "bgColor": "#ffd27a"}, {"stop": 1, "bgColor": "#e8412c"}]


def graph_id(snap: Snapshot) -> str:
    return f"{snap.model}:ubatch{snap.n_tokens}"


def _kv(key: str, value: Any) -> dict[str, str]:
    return {"key": key, "value": value if isinstance(value, str) else json.dumps(value)}


def graph_collection(snap: Snapshot) -> dict[str, Any]:
    """The graph JSON Model Explorer's JSON adapter reads: {"label", "graphs": [graph]}."""
    graph, sched, plan = snap.graph, snap.schedule, snap.plan
    keys = dump.tensor_keys(graph)
    namespaces: dict[int, str] = {}
    for t in graph.tensors:
        layer = snap.layers.get(t.id)
        namespaces[t.id] = f"layer_{layer}" if layer is not None else ""
    for i, g in enumerate(fusion_groups(graph)):
        for t in g.nodes:
            base = namespaces[t.id]
            namespaces[t.id] = f"{base}/{g.pattern}_{i}" if base else f"{g.pattern}_{i}"
    copy_for = {(c.tensor.id, c.dst_backend): f"copy{i}" for i, c in enumerate(sched.copies)}
    nodes = []
    for t in graph.tensors:
        a = sched.assignment[t.id]
        attrs = [_kv("op", t.op), _kv("type", t.type.name), _kv("ne", dump.tensor_record(t, keys)["ne"]),
                 _kv("nb", dump.tensor_record(t, keys)["nb"]), _kv("name", t.name),
                 _kv("flags", dump.flag_str(t)), _kv("backend", a.backend), _kv("cause", a.cause)]
        if t.params:
            attrs.append(_kv("params", dump.jsonable(t.params)))
        if t.id in plan.offsets:
            attrs += [_kv("arena_offset", str(plan.offsets[t.id])), _kv("bytes", str(plan.sizes[t.id]))]
        ki = snap.kernels.kernel_of.get(t.id)
        if ki is not None:
            attrs.append(_kv("kernel", snap.kernels.kernels[ki].name))
        edges = []
        for j, s in enumerate(t.src):
            src = copy_for.get((s.id, a.backend), keys[s.id])
            edges.append({"sourceNodeId": src, "sourceNodeOutputId": "0", "targetNodeInputId": str(j)})
        nodes.append({"id": keys[t.id], "label": t.op if not t.is_leaf else (t.name or keys[t.id]),
                      "namespace": namespaces[t.id], "attrs": attrs, "incomingEdges": edges,
                      "outputsMetadata": [_output_meta(t)]})
    for i, c in enumerate(sched.copies):
        nodes.append({"id": f"copy{i}", "label": "copy", "namespace": namespaces[c.consumer.id],
                      "attrs": [_kv("from", c.src_backend), _kv("to", c.dst_backend),
                                _kv("bytes", str(c.nbytes(snap.env))), _kv("split", str(c.split))],
                      "incomingEdges": [{"sourceNodeId": keys[c.tensor.id], "sourceNodeOutputId": "0",
                                         "targetNodeInputId": "0"}],
                      "outputsMetadata": [_output_meta(c.tensor)]})
    return {"label": snap.title, "graphs": [{"id": graph_id(snap), "nodes": nodes}]}


def _output_meta(t: Tensor) -> dict[str, Any]:
    return {"id": "0", "attrs": [_kv("tensor_shape", f"{t.type.name}{t.shape_str()}")]}


def node_data(snap: Snapshot) -> dict[str, Any] | None:
    """Model Explorer's node data (ModelNodeData: graph id -> GraphNodeData) with the profiled
    microseconds per step of every timed node; None without a profile."""
    if snap.profile is None:
        return None
    keys = dump.tensor_keys(snap.graph)
    results = {keys[snap.graph.tensors[pos].id]: {"value": round(nt.total_us, 3)}
               for pos, nt in sorted(snap.profile.times.items())}
    return {graph_id(snap): {"name": f"µs per {snap.profile.mode} step", "results": results,
                             "gradient": GRADIENT}}
