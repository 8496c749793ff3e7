"""What each barrier of a decode step's CPU program guards. The program runs its nodes in
order with a barrier after each; a barrier can go only where the node after it has no hazard
with the node before it: it reads that node's output (RAW), writes bytes that node reads or
writes (the buffer plan reuses arena bytes), or both quantise their activations into the
one shared scratch.

    python bench/barrier_hazards.py [-m MODEL]

Prints JSON: the node count, the barriers by what they guard, and the op pairs of those that
guard nothing.
"""
from __future__ import annotations

import argparse
import collections
import json

import llama
from ggmlpy.codegen_cpu.backend import CpuSplit
from ggmlpy.hub import resolve_model
from ggmlpy.ir.symbolic import SymExpr
from ggmlpy.ir.tensor import Tensor, memory_root
from ggmlpy.ir.types import is_quantized

ENV = {"n_tokens": 1, "n_outputs": 1}   # one token; other symbols (n_kv) at their most


def _bytes(t: Tensor, worst: int) -> int:
    def value(d) -> int:
        return d.eval({k: ENV.get(k, worst) for k in d.symbols}) if isinstance(d, SymExpr) else int(d)
    return value(t.nb[3]) * value(t.ne[3])


def _region(split: CpuSplit, t: Tensor, worst: int) -> tuple[str, int, int]:
    """The bytes t's storage covers: an arena range, or an external tensor as a whole."""
    r = memory_root(t)
    at = split.layout.arena_offsets.get(r.id)
    if at is None:
        return ("external", r.id, r.id + 1)
    return ("arena", at, at + _bytes(r, worst))


def _overlap(a: tuple[str, int, int], b: tuple[str, int, int]) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _uses_scratch(node: Tensor) -> bool:
    return node.op.startswith("mul_mat") and is_quantized(node.src[0].type)


def hazards(split: CpuSplit, worst: int) -> tuple[collections.Counter, collections.Counter]:
    why: collections.Counter = collections.Counter()
    free: collections.Counter = collections.Counter()
    for prev, cur in zip(split.nodes, split.nodes[1:]):
        p_out = _region(split, prev, worst)
        p_in = [_region(split, s, worst) for s in prev.src if s is not None]
        c_out = _region(split, cur, worst)
        c_in = [_region(split, s, worst) for s in cur.src if s is not None]
        if any(_overlap(p_out, x) for x in c_in):
            why["reads the previous output"] += 1
        elif any(_overlap(c_out, x) for x in [p_out, *p_in]):
            why["overwrites bytes the previous node reads or writes"] += 1
        elif _uses_scratch(prev) and _uses_scratch(cur):
            why["both quantise activations into the shared scratch"] += 1
        else:
            why["nothing"] += 1
            free[f"{prev.op} -> {cur.op}"] += 1
    return why, free


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    a = ap.parse_args()
    model = llama.Model.load(str(resolve_model(a.model)))
    n_ctx = 512
    ctx = llama.Context(model, n_ctx=n_ctx, n_batch=8, n_ubatch=8, n_threads=2)
    ctx.decode(llama.Batch.from_tokens([100, 101]))
    ctx.decode(llama.Batch.from_tokens([102]))
    splits = [c for e in ctx.graph_cache.entries.values() for c in e.compiled if isinstance(c, CpuSplit)]
    split = max(splits, key=lambda s: len(s.nodes))
    why, free = hazards(split, n_ctx)
    print(json.dumps({"model": a.model, "nodes": len(split.nodes), "barriers_guarding": dict(why),
                      "guarding_nothing": dict(free)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
