"""Lowerings of the mixture-of-experts ops: the router's argsort and sum_rows, the expert
products (mul_mat_id) and the experts' biases (add_id), one kernel each
(templates/cuda/{argsort,sum_rows,mul_mat_id,add_id}.cu.j2).

mul_mat_id runs one warp per (output row, slot, token): each selected expert's rows are
decoded where they are used, so a decode step reads the n_used experts a token chose and
nothing else. Prompts read an expert once per token that chose it (no grouping by expert,
no tensor cores here yet).
"""
from __future__ import annotations

from ggmlpy.codegen_cuda.kernels import KernelSpec
from ggmlpy.codegen_cuda.lowering import lowering
from ggmlpy.codegen_cuda.steps import (
    DQ8_TYPES, Addr, Env, Launch, Step, ceil_div, check_grid, nb_of, ne_of, row_threads, sfx,
)
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType

F32, I32 = GGMLType.F32, GGMLType.I32
ROWS_PER_BLOCK = 8   # mul_mat_id: warps (output rows) per block


def _strides(prefix: str, values: list[int], n: int = 4) -> dict[str, int]:
    return {f"{prefix}nb{i}": v for i, v in enumerate(values[:n])}


class _RowStep(Step):
    """argsort and sum_rows: one block per row of the source, ne0 values each."""

    def __init__(self, node: Tensor, family: str, threads_cap: int, **variant):
        super().__init__([node], reads=list(node.src), writes=[node])
        self.node, self.cap = node, threads_cap
        fields = [("s", "ptr"), ("d", "ptr"), ("ne0", "i64")]
        fields += [(f"snb{i}", "i64") for i in range(4)] + [(f"dnb{i}", "i64") for i in range(4)]
        self.spec = KernelSpec.make(family, fields, cooperative=family == "sum_rows", **variant)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        node, src = self.node, self.node.src[0]
        ne = ne_of(src, env)
        vals = {"s": addr(src), "d": addr(node), "ne0": ne[0], **_strides("s", nb_of(src, env)),
                **_strides("d", nb_of(node, env))}
        threads = self.cap if self.spec.cooperative else row_threads(ne[0], self.cap)
        grid = check_grid((ne[1], ne[2], ne[3]), self.spec.family)
        return [Launch(self.spec, grid, (threads, 1, 1), 0, self.spec.pack(vals))]


def _f32_rows(node: Tensor) -> bool:
    return node.src[0].type == F32


@lowering("argsort", supports=lambda node: _f32_rows(node) and node.type == I32)
def _argsort(node: Tensor, opts) -> Step:
    return _RowStep(node, "argsort", 256, descending=node.params.get("order", 0) == 1)


@lowering("sum_rows", supports=lambda node: _f32_rows(node) and node.type == F32)
def _sum_rows(node: Tensor, opts) -> Step:
    return _RowStep(node, "sum_rows", 256)   # the kernel's reduction wants a power of two


class MulMatIdStep(Step):
    def __init__(self, node: Tensor):
        super().__init__([node], reads=list(node.src), writes=[node])
        self.node = node
        fields = [("a", "ptr"), ("b", "ptr"), ("ids", "ptr"), ("d", "ptr"), ("K", "i64"), ("M", "i64"),
                  ("n_expert", "i64"), ("ne_b1", "i64"), ("anb1", "i64"), ("anb2", "i64"), ("bnb1", "i64"),
                  ("bnb2", "i64"), ("inb0", "i64"), ("inb1", "i64"), ("dnb1", "i64"), ("dnb2", "i64")]
        self.spec = KernelSpec.make("mul_mat_id", fields, atype=sfx(node.src[0].type))

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        node = self.node
        w, x, ids = node.src
        wne, xne, ine = ne_of(w, env), ne_of(x, env), ne_of(ids, env)
        wnb, xnb, inb, dnb = nb_of(w, env), nb_of(x, env), nb_of(ids, env), nb_of(node, env)
        vals = {"a": addr(w), "b": addr(x), "ids": addr(ids), "d": addr(node), "K": wne[0], "M": wne[1],
                "n_expert": wne[2], "ne_b1": xne[1], "anb1": wnb[1], "anb2": wnb[2], "bnb1": xnb[1],
                "bnb2": xnb[2], "inb0": inb[0], "inb1": inb[1], "dnb1": dnb[1], "dnb2": dnb[2]}
        grid = check_grid((ceil_div(wne[1], ROWS_PER_BLOCK), ine[0], ine[1]), "mul_mat_id")
        return [Launch(self.spec, grid, (32 * ROWS_PER_BLOCK, 1, 1), 0, self.spec.pack(vals))]


def _mul_mat_id_ok(node: Tensor) -> bool:
    w, x, ids = node.src
    return (w.type in DQ8_TYPES and isinstance(w.ne[0], int) and w.ne[0] % 8 == 0 and w.is_contiguous
            and x.type == F32 and x.nb[0] == 4 and ids.type == I32 and node.type == F32 and node.nb[0] == 4)


@lowering("mul_mat_id", supports=_mul_mat_id_ok)
def _mul_mat_id(node: Tensor, opts) -> Step:
    return MulMatIdStep(node)


class AddIdStep(Step):
    def __init__(self, node: Tensor):
        super().__init__([node], reads=list(node.src), writes=[node])
        self.node = node
        fields = [("a", "ptr"), ("b", "ptr"), ("ids", "ptr"), ("d", "ptr"), ("ne0", "i64")]
        fields += [(f"{t}nb{i}", "i64") for t in "abd" for i in range(3)] + [("inb0", "i64"), ("inb1", "i64")]
        self.spec = KernelSpec.make("add_id", fields, cooperative=False)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        node = self.node
        a, bias, ids = node.src
        ne = ne_of(node, env)
        vals = {"a": addr(a), "b": addr(bias), "ids": addr(ids), "d": addr(node), "ne0": ne[0],
                **_strides("a", nb_of(a, env), 3), **_strides("b", nb_of(bias, env), 3),
                **_strides("d", nb_of(node, env), 3), "inb0": nb_of(ids, env)[0], "inb1": nb_of(ids, env)[1]}
        grid = check_grid((ne[1], ne[2], 1), "add_id")
        return [Launch(self.spec, grid, (row_threads(ne[0]), 1, 1), 0, self.spec.pack(vals))]


@lowering("add_id", supports=lambda node: all(t.type == F32 for t in (node, *node.src[:2])) and node.src[2].type == I32)
def _add_id(node: Tensor, opts) -> Step:
    return AddIdStep(node)
