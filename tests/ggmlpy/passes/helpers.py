"""Shared by the pass tests: running graphs on the reference backend, llama graph inputs,
snapshots that prove a pass left its input alone, random graphs, and an independent
liveness check of buffer plans (with an executor that really runs a graph in one arena)."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ggmlpy.ir import GGMLType, Graph, GraphBuilder
from ggmlpy.ir.ops import OPS
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.sched.scheduler import CompiledGraph
from ggmlpy.sched.store import NUMPY_DTYPES, TensorStore

F32 = GGMLType.F32


# running --------------------------------------------------------------------------------------
def run_graph(graph: Graph, bindings: Mapping[str, np.ndarray], env: Mapping[str, int],
              backend: RefBackend | None = None, store: TensorStore | None = None) -> list[np.ndarray]:
    """The outputs' values (copies) after running graph on the reference backend."""
    store = store if store is not None else TensorStore(dict(bindings))
    CompiledGraph(graph, [backend or RefBackend()]).run(store, env)
    return [np.array(store.array(o, env), copy=True) for o in graph.outputs]


def llama_bindings(model, ctx, n_tokens: int, n_kv: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of a llama ubatch graph for n_tokens new tokens at positions 0.., written to
    cells 0.., attending causally over n_kv cells; fresh zeroed KV caches; the weights."""
    rng = np.random.default_rng(seed)
    mask = np.full((n_tokens, n_kv), -np.inf, np.float32)
    for i in range(n_tokens):
        mask[i, : i + 1] = 0.0
    data = {
        "inp_tokens": rng.integers(1, model.n_vocab, n_tokens).astype(np.int32),
        "inp_pos": np.arange(n_tokens, dtype=np.int32),
        "inp_k_idxs": np.arange(n_tokens, dtype=np.int64),
        "inp_out_ids": np.arange(n_tokens, dtype=np.int32),
        "inp_kq_mask": mask,
    }
    data.update({name: np.zeros_like(a) for name, a in ctx.memory.bindings().items()})
    data.update(model.weight_arrays())
    return data


def llama_env(n_tokens: int, n_kv: int = 32) -> dict[str, int]:
    return {"n_tokens": n_tokens, "n_kv": n_kv, "n_outputs": n_tokens}


# snapshots ------------------------------------------------------------------------------------
def snapshot(graph: Graph) -> tuple:
    """Every field of every tensor of graph, by identity: equal before and after a pass
    exactly when the pass mutated nothing it was given."""
    rows = []
    for t in graph.tensors:
        rows.append((id(t), t.id, t.op, t.type, t.ne, t.nb, repr(t.params), tuple(id(s) for s in t.src),
                     t.name, t.flags, id(t.view_src) if t.view_src is not None else None, t.view_offs))
    return tuple(rows), tuple(id(o) for o in graph.outputs), repr(sorted(graph.hints.items()))


def leaf_roles(graph: Graph) -> dict[str, Flag]:
    return {t.name: t.flags for t in graph.leafs}


# random graphs --------------------------------------------------------------------------------
def random_graph(rng: np.random.Generator, n_ops: int = 14) -> tuple[Graph, dict[str, np.ndarray]]:
    """A random graph over [8, 4] activations with duplicates, dead ends, view chains,
    contiguous and permuted conts, matmuls, norms, softmaxes; its input data."""
    b = GraphBuilder()
    data: dict[str, np.ndarray] = {}

    def leaf(name: str, ne, flags=Flag.INPUT):
        data[name] = rng.standard_normal(tuple(reversed(ne))).astype(np.float32)
        return b.new_tensor(F32, ne, name, flags)

    pool = [leaf(f"x{i}", (8, 4)) for i in range(3)]
    w = leaf("w", (8, 8), Flag.WEIGHT)
    row = leaf("row", (8,), Flag.WEIGHT)
    for _ in range(n_ops):
        a, c = (pool[i] for i in rng.integers(0, len(pool), 2))
        choice = rng.integers(0, 12)
        if choice == 0:
            t = b.add(a, c)
        elif choice == 1:
            t = b.mul(a, c)
        elif choice == 2:
            t = getattr(b, ["silu", "tanh", "sqr", "gelu"][rng.integers(0, 4)])(a)
        elif choice == 3:
            t = b.scale(a, float(rng.choice([0.5, -2.0])))
        elif choice == 4:
            t = b.mul(b.rms_norm(a, 1e-5), row)
        elif choice == 5:
            t = b.soft_max_ext(b.scale(a, 0.5), None, 1.0, 0.0)
        elif choice == 6:
            t = b.add(b.mul_mat(w, a), c)
        elif choice == 7:
            t = b.cont(b.transpose(b.transpose(a)))      # a round trip: a needless copy
        elif choice == 8:
            t = b.reshape(b.cont(b.transpose(a)), 8, 4)  # a real transpose
        elif choice == 9:
            t = b.reshape(b.reshape(a, 32), 8, 4)
        elif choice == 10:
            t = b.swiglu(b.mul_mat(w, a), b.mul_mat(w, c))
        else:
            t = b.add(a, c) if rng.random() < 0.5 else b.silu(a)  # likely a duplicate
        pool.append(t)
    picks = rng.choice(4, size=int(rng.integers(1, 3)), replace=False)
    return b.build([pool[-1 - int(i)] for i in sorted(picks)]), data


# buffer plans ---------------------------------------------------------------------------------
def check_plan(graph: Graph, plan, fused: bool = True) -> None:
    """An independent check of a BufferPlan: every computed, memory-owning, materialised
    tensor has a block; blocks are aligned and inside the arena; and no two tensors whose
    lifetimes overlap share a byte, except a declared in-place child and its parent at the
    one step where the child consumes the parent."""
    step_of = _step_numbers(graph, fused)
    interior = _interior(graph) if fused else set()
    expected = {t.id for t in graph.nodes if t.view_src is None and t.id not in interior}
    assert set(plan.offsets) == expected
    by_id = {t.id: t for t in graph.tensors}
    end = len(graph.nodes) + 1
    outputs = {(o.view_src or o).id for o in graph.outputs}
    born = {i: step_of[i] for i in expected}
    dies = dict(born)
    for t in graph.nodes:
        for s in t.src:
            owner = (s.view_src or s).id
            if owner in dies:
                dies[owner] = max(dies[owner], step_of[t.id])
    for o in outputs & expected:
        dies[o] = end
    for i in expected:
        assert plan.offsets[i] % plan.alignment == 0
        assert plan.offsets[i] + plan.sizes[i] <= plan.arena_size
    ids = sorted(expected, key=lambda i: plan.offsets[i])
    for n, a in enumerate(ids):
        a_end = plan.offsets[a] + plan.sizes[a]
        for c in ids[n + 1:]:
            if plan.offsets[c] >= a_end:
                break
            if plan.sizes[a] == 0 or plan.sizes[c] == 0:
                continue
            if dies[a] < born[c] or dies[c] < born[a]:
                continue
            child, parent = (a, c) if plan.inplace.get(a) == c else (c, a)
            assert plan.inplace.get(child) == parent, \
                f"{by_id[a]!r} and {by_id[c]!r} are live together and overlap"
            assert dies[parent] == born[child], "an in-place parent outlives its child's start"
            assert OPS[by_id[child].op].inplace and by_id[child].src[0].id == parent


def _interior(graph: Graph) -> set[int]:
    """Members of a fusion group that nothing outside the group reads (not outputs)."""
    readers: dict[int, set[int]] = {}
    for t in graph.tensors:
        for s in t.src:
            readers.setdefault(s.id, set()).add(t.id)
    out = set()
    for g in graph.hints.get("fusion_groups", ()):
        members = {graph.tensors[p].id for p in g.nodes}
        for p in g.nodes:
            t = graph.tensors[p]
            if not t.flags & Flag.OUTPUT and readers.get(t.id, set()) <= members:
                out.add(t.id)
    return out


def _step_numbers(graph: Graph, fused: bool) -> dict[int, int]:
    """Node id -> execution step, read straight from the fusion annotation: a group's nodes
    share the step of its last member."""
    groups = graph.hints.get("fusion_groups", ()) if fused else ()
    step_of_position: dict[int, int] = {}
    for g in groups:
        for p in g.nodes:
            step_of_position[p] = max(g.nodes)
    pos = {t.id: i for i, t in enumerate(graph.tensors)}
    return {t.id: step_of_position.get(pos[t.id], pos[t.id]) for t in graph.nodes}


class ArenaStore(TensorStore):
    """A TensorStore that keeps every planned tensor in one shared arena at its planned
    offset, so a plan that lets two live tensors overlap corrupts the results."""

    def __init__(self, bindings: Mapping[str, np.ndarray], plan, by_id: Mapping[int, Tensor],
                 env: Mapping[str, int]):
        super().__init__(bindings)
        self.arena = np.full(plan.arena_size, 0xCD, dtype=np.uint8)
        self.plan = plan
        for tid, offset in plan.offsets.items():
            t = by_id[tid]
            n = int(np.prod([evaluate(d, env) for d in t.ne])) * np.dtype(NUMPY_DTYPES[t.type]).itemsize
            assert n <= plan.sizes[tid]
            self.buffers[tid] = self.arena[offset: offset + n]

    def set_result(self, t: Tensor, values: np.ndarray, env: Mapping[str, int]) -> None:
        if t.id not in self.plan.offsets:
            return super().set_result(t, values, env)
        raw = np.ascontiguousarray(values, dtype=NUMPY_DTYPES[t.type]).reshape(-1).view(np.uint8)
        self.buffers[t.id][...] = raw
