"""The numpy reference backend: every op through its OpDef reference. The oracle in tests and
the scheduler's last fallback, never the production path (docs/architecture.md, decision 9)."""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
from threadpoolctl import ThreadpoolController

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.ops.registry import DST_TYPE
from ggmlpy.ir.symbolic import evaluate, evaluate_params
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.ir.types import GGMLType, is_quantized
from ggmlpy.quants import dequantizable_types, dequantize, dequantize_rows
from ggmlpy.sched.backend import Backend
from ggmlpy.sched.store import TensorStore


_READABLE = frozenset(dequantizable_types())  # the types as_float turns into numbers


class RefBackend(Backend):
    """Runs graphs with numpy. Weights converted to float32 are cached per backend instance
    (one per context), so a quantised model is dequantised once, not per token. Every other
    hook keeps Backend's default (the reference pipeline, host memory, nothing to tune)."""

    name = "ref"
    is_host = True

    def __init__(self) -> None:
        self._weights_f32: dict[str, np.ndarray] = {}
        self._blas: ThreadpoolController | None = None
        self.overrides: dict[str, Callable[["RefSplit", Tensor, TensorStore, Mapping[str, int]], np.ndarray]] = {
            "get_rows": _get_rows,
            "mul_mat_id": _mul_mat_id,
        }

    def supports_op(self, node: Tensor) -> bool:
        """Ops with a reference (or a write, or views) whose inputs `as_float` can read: a
        type the quants package cannot decode is refused here, so the scheduler names the
        node when the graph is compiled instead of failing at its first run."""
        op = OPS.get(node.op)
        if op is None or not (op.kind == Kind.VIEW or op.reference is not None or op.write is not None):
            return False
        return op.kind == Kind.VIEW or all(s.type in _READABLE for s in node.src)

    @property
    def blas(self) -> ThreadpoolController:
        """numpy's BLAS libraries (threadpoolctl), looked up when a split first needs them."""
        if self._blas is None:
            self._blas = ThreadpoolController().select(user_api="blas")
        return self._blas

    def compile(self, graph: Graph, nodes: list[Tensor]) -> "RefSplit":
        return RefSplit(self, nodes, between_others=len(nodes) < len(graph.nodes))

    def as_float(self, t: Tensor, store: TensorStore, env: Mapping[str, int]) -> np.ndarray:
        """t's values as a float32 (or integer) array in numpy order."""
        if t.type in (GGMLType.I32, GGMLType.I64, GGMLType.F32):
            return store.array(t, env)
        cacheable = bool(t.flags & Flag.WEIGHT) and t.view_src is None
        if cacheable and t.name in self._weights_f32:
            return self._weights_f32[t.name]
        raw = store.array(t, env)
        if t.type == GGMLType.F16:
            values = raw.astype(np.float32)
        elif t.type == GGMLType.BF16:
            values = (raw.astype(np.uint32) << 16).view(np.float32)
        elif is_quantized(t.type):
            ne = [evaluate(d, env) for d in t.ne]
            values = dequantize(np.ascontiguousarray(raw), t.type, ne)
        else:
            values = raw.astype(np.float32)
        if cacheable:
            self._weights_f32[t.name] = values
        return values


class RefSplit:
    """A split's nodes, run in order. A split that shares its graph with other backends'
    splits runs numpy's BLAS on the calling thread only: OpenBLAS's workers busy-wait for
    about 0.1 s after each product, so with a reference product every few hundred
    microseconds they never sleep and take the cores of the native splits that run next
    (SmolLM2 with 30 products on numpy, 2 threads: 11 tok/s with 2 BLAS threads, 78 with one).
    A split that is the whole graph keeps BLAS's thread count: there the spinning workers
    serve the next product."""

    def __init__(self, backend: RefBackend, nodes: list[Tensor], between_others: bool = False):
        self.backend = backend
        self.nodes = nodes
        self.between_others = between_others

    def run(self, store: TensorStore, env: Mapping[str, int]) -> None:
        if not self.between_others:
            self._run(store, env)
            return
        with self.backend.blas.limit(limits=1):
            self._run(store, env)

    def _run(self, store: TensorStore, env: Mapping[str, int]) -> None:
        for node in self.nodes:
            op = OPS[node.op]
            if op.kind == Kind.VIEW:
                continue  # views are strided windows: TensorStore.array realises them
            params = evaluate_params(node.params, env)
            if op.kind == Kind.WRITE:
                dst = store.array(node, env)
                inputs = [self.backend.as_float(s, store, env) for s in node.src[1:]]
                if is_quantized(node.type):  # raw block rows: the write quantises what it stores
                    op.write(dst, [dst, *inputs], {**params, DST_TYPE: node.type})
                elif node.type == GGMLType.BF16:  # numpy holds bfloat16 as raw uint16 bits
                    values = self.backend.as_float(node, store, env)
                    op.write(values, [values, *inputs], params)
                    dst[...] = _to_bf16_bits(values)
                else:
                    op.write(dst, [dst, *inputs], params)
                continue
            override = self.backend.overrides.get(node.op)
            if override is not None:
                result = override(self, node, store, env)
            else:
                inputs = [self.backend.as_float(s, store, env) for s in node.src]
                result = op.reference(inputs, params)
            store.set_result(node, result, env)


def _to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounding to nearest even as ggml_fp32_to_bf16 does."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _get_rows(split: RefSplit, node: Tensor, store: TensorStore, env: Mapping[str, int]) -> np.ndarray:
    """Embedding lookups decode only the rows asked for instead of the whole table."""
    table, idx = node.src
    if not is_quantized(table.type) or table.ne[2] != 1 or table.ne[3] != 1 or idx.ne[1] != 1:
        inputs = [split.backend.as_float(s, store, env) for s in node.src]
        return OPS["get_rows"].reference(inputs, node.params)
    rows = store.array(idx, env).reshape(-1)
    ne = [evaluate(d, env) for d in table.ne]
    raw = store.array(table, env)
    return dequantize_rows(np.ascontiguousarray(raw).reshape(-1), table.type, ne[:2], rows)


def _mul_mat_id(split: RefSplit, node: Tensor, store: TensorStore, env: Mapping[str, int]) -> np.ndarray:
    """Expert products decode only the experts the ubatch selected, one at a time and not
    cached: a mixture-of-experts layer's weights as float32 would be several times the
    file (Qwen3-30B-A3B: 2.4 GB per layer and projection)."""
    weights, x, ids = node.src
    if not is_quantized(weights.type) and weights.type != GGMLType.F16:
        inputs = [split.backend.as_float(s, store, env) for s in node.src]
        return OPS["mul_mat_id"].reference(inputs, node.params)
    raw = store.array(weights, env)[0]                 # [n_expert, M, K in the weight type]
    k, m = (evaluate(d, env) for d in weights.ne[:2])
    b = split.backend.as_float(x, store, env)[0]       # [n_tokens, n_b, K]
    chosen = store.array(ids, env)[0, 0]               # [n_tokens, n_used]
    out = np.empty((1, chosen.shape[0], chosen.shape[1], m), np.float32)
    for e in np.unique(chosen):
        if weights.type == GGMLType.F16:
            w = raw[e].astype(np.float32)
        else:
            w = dequantize(np.ascontiguousarray(raw[e]), weights.type, [k, m])
        t, u = np.nonzero(chosen == e)
        out[0, t, u] = b[t, u % b.shape[1]] @ w.T
    return out
