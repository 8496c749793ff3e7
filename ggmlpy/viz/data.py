"""The page's data: a Snapshot as plain JSON values, the one thing the HTML page reads.

Shape (every tensor once, by a uid that is its index in `tensors`):
  meta       title, model, ubatch, context size, planning env, pipeline, notes, signature
  backends   [{name, colour}] in the scheduler's priority order
  tensors    every tensor of every stage: op, type, ne, nb, name, flags, src (uids), view
             source and offset, params, layer
  graph      the optimised graph: `order` (uids in graph order) and, parallel to it, `info`:
             dump key, backend, cause, fallback, split, fusion group, arena offset/size,
             in-place parent, kernel, launch, profile time
  groups     fusion groups: pattern, member/input/output uids, layer, whether one launch runs it
  splits     backend, member uids, copy indices; copies: tensor, from, to, split, consumer, bytes
  buffers    arena and peak bytes, live bytes per step, blocks [uid, offset, size, start, end, parent]
  kernels    name, backend, language and the source, gzip + base64 (LLVM IR is large and
             repetitive: a tenth of the size; the page inflates it on demand)
  stages     per pass: the graph's order and the uids it added, removed and rewrote, with the
             pass's StepRecord (nodes before/after, seconds)
  profile    how the times were taken (mode, steps, threads, TSC rate, wall time per step)
"""
from __future__ import annotations

import base64
import gzip
from typing import Any

from ggmlpy.ir import dump
from ggmlpy.ir.symbolic import dim_str
from ggmlpy.ir.tensor import Tensor
from ggmlpy.passes.common import FUSION_HINT
from ggmlpy.passes.fusion import fusion_groups
from ggmlpy.viz.snapshot import Snapshot

FORMAT_VERSION = 1
COPY_COLOUR = "#f4b6b6"


def _dims(dims: tuple[Any, ...]) -> list[int | str]:
    return [d if isinstance(d, int) else dim_str(d) for d in dims]


def pack_code(text: str) -> str:
    """gzip + base64: what the page's DecompressionStream("gzip") inflates."""
    return base64.b64encode(gzip.compress(text.encode(), 6, mtime=0)).decode("ascii")


def unpack_code(packed: str) -> str:
    return gzip.decompress(base64.b64decode(packed)).decode()


class _Uids:
    """uid per tensor id, in order of first appearance over the stages."""

    def __init__(self) -> None:
        self.of: dict[int, int] = {}
        self.tensors: list[Tensor] = []

    def add(self, t: Tensor) -> int:
        if t.id not in self.of:
            self.of[t.id] = len(self.tensors)
            self.tensors.append(t)
        return self.of[t.id]


def page_data(snap: Snapshot) -> dict[str, Any]:
    uids = _Uids()
    for st in snap.stages:
        for t in st.graph.tensors:
            uids.add(t)
    u = uids.of
    graph = snap.graph
    sched = snap.schedule
    keys = dump.tensor_keys(graph)
    groups = fusion_groups(graph)
    group_of = {t.id: i for i, g in enumerate(groups) for t in g.nodes}
    split_of = {n.id: s.index for s in sched.splits for n in s.nodes}
    plan = snap.plan
    km = snap.kernels
    times = {}
    if snap.profile is not None:
        times = {graph.tensors[pos].id: nt for pos, nt in snap.profile.times.items()}

    def info(t: Tensor) -> dict[str, Any]:
        a = sched.assignment[t.id]
        rec: dict[str, Any] = {"key": keys[t.id], "backend": a.backend, "cause": a.cause}
        if a.fallback:
            rec["fallback"] = True
        optional = {"split": split_of.get(t.id), "group": group_of.get(t.id),
                    "offset": plan.offsets.get(t.id), "size": plan.sizes.get(t.id),
                    "step": snap.lifetimes.step_of.get(t.id), "kernel": km.kernel_of.get(t.id),
                    "launch": list(km.launch_of[t.id]) if t.id in km.launch_of else None}
        if t.id in plan.inplace:
            optional["inplace_of"] = u[plan.inplace[t.id]]
        nt = times.get(t.id)
        if nt is not None:
            optional.update(time=round(nt.total_us, 3), k=[round(x, 3) for x in nt.kernel_us],
                            b=[round(x, 3) for x in nt.barrier_us])
        rec.update({k: v for k, v in optional.items() if v is not None})
        return rec

    def one_launch(g) -> bool:
        launches = {km.launch_of.get(t.id) for t in g.nodes}
        return len(launches) == 1 and None not in launches

    colours = dump.backend_colours(b.name for b in sched.backends)
    return {
        "version": FORMAT_VERSION,
        "meta": {"title": snap.title, "model": snap.model, "ubatch": snap.n_tokens, "n_ctx": snap.n_ctx,
                 "env": snap.env, "pipeline": snap.pipeline, "notes": snap.notes,
                 "signature": graph.signature(), "summary": dump.summary_line(graph)},
        "backends": [{"name": n, "colour": c} for n, c in colours.items()] + [{"name": "copy", "colour": COPY_COLOUR}],
        "tensors": [_tensor(t, u, snap.layers.get(t.id)) for t in uids.tensors],
        "graph": {"order": [u[t.id] for t in graph.tensors], "info": [info(t) for t in graph.tensors],
                  "outputs": [u[o.id] for o in graph.outputs]},
        "groups": [{"pattern": g.pattern, "nodes": [u[t.id] for t in g.nodes],
                    "inputs": [u[t.id] for t in g.inputs], "outputs": [u[t.id] for t in g.outputs],
                    "layer": snap.layers.get(g.outputs[-1].id if g.outputs else g.nodes[-1].id),
                    "one_kernel": one_launch(g)} for g in groups],
        "splits": [{"index": s.index, "backend": s.backend.name, "nodes": [u[n.id] for n in s.nodes],
                    "n_compute": s.n_compute,
                    "copies": [i for i, c in enumerate(sched.copies) if c.split == s.index]}
                   for s in sched.splits],
        "copies": [{"name": c.name, "tensor": u[c.tensor.id], "from": c.src_backend, "to": c.dst_backend,
                    "split": c.split, "consumer": u[c.consumer.id], "bytes": c.nbytes(snap.env)}
                   for c in sched.copies],
        "buffers": _buffers(snap, u),
        "kernels": [{"name": k.name, "backend": k.backend, "language": k.language, "n_nodes": len(k.nodes),
                     "code": pack_code(k.code)} for k in km.kernels],
        "stages": [_stage(st, u) for st in snap.stages],
        "profile": _profile(snap),
    }


def _tensor(t: Tensor, u: dict[int, int], layer: int | None) -> dict[str, Any]:
    rec: dict[str, Any] = {"op": t.op, "type": t.type.name, "ne": _dims(t.ne), "nb": _dims(t.nb),
                           "name": t.name, "flags": dump.flag_str(t), "src": [u[s.id] for s in t.src]}
    if t.view_src is not None:
        rec["view_src"] = u[t.view_src.id]
        rec["view_offs"] = t.view_offs if isinstance(t.view_offs, int) else dim_str(t.view_offs)
    if t.params:
        rec["params"] = dump.jsonable(t.params)
    if layer is not None:
        rec["layer"] = layer
    return rec


def _buffers(snap: Snapshot, u: dict[int, int]) -> dict[str, Any]:
    plan, lt = snap.plan, snap.lifetimes
    return {"arena_size": plan.arena_size, "peak_bytes": plan.peak_bytes, "no_reuse_bytes": plan.no_reuse_bytes,
            "alignment": plan.alignment, "env": plan.env, "n_steps": lt.n_steps, "peak_step": lt.peak_step,
            "live": lt.live,
            "blocks": [[u[b.tensor], b.offset, b.size, b.start, b.end,
                        u[b.inplace_of] if b.inplace_of is not None else -1] for b in lt.blocks]}


def _stage(st, u: dict[int, int]) -> dict[str, Any]:
    rec: dict[str, Any] = {"name": st.name, "doc": st.doc, "order": [u[t.id] for t in st.graph.tensors],
                           "added": [u[t.id] for t in st.added], "removed": [u[t.id] for t in st.removed],
                           "rewritten": [[u[a.id], u[b.id]] for a, b in st.rewritten],
                           "grouped": bool(st.graph.hints.get(FUSION_HINT))}
    if st.record is not None:
        rec.update(nodes_before=st.record.nodes_before, nodes_after=st.record.nodes_after,
                   seconds=round(st.record.seconds, 6))
    return rec


def _profile(snap: Snapshot) -> dict[str, Any] | None:
    p = snap.profile
    if p is None:
        return None
    return {"mode": p.mode, "steps": p.steps, "threads": p.threads, "tsc_ghz": round(p.tsc_ghz, 4),
            "step_us": round(p.step_us, 2), "native_us": round(p.native_us(), 2)}
