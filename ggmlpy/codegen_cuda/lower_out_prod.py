"""The steps of a quantised KV cache besides the attention kernel: out_prod on its own (the
attention over a quantised V cache when no rule fused it: a softcapped chain, or fuse=False;
fused, it is the attention kernel's V product, lower_attention.py), and the K-shift's two
copies of whole rows, cont decoding a quantised view and cpy quantising f32 rows back into it
(registered by lower_elementwise.py, whose cont and cpy take float data)."""
from __future__ import annotations

from ggmlpy.codegen_cuda.kernels import KernelSpec, tensor_fields
from ggmlpy.codegen_cuda.lowering import lowering
from ggmlpy.codegen_cuda.steps import (
    FLOAT_TYPES, KV_QUANT_TYPES, Addr, Env, Launch, Step, grid_stride_blocks, nb_of, ne_of, sfx, tensor_values,
)
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, type_size


class OutProdStep(Step):
    def __init__(self, node: Tensor):
        a, b = node.src
        super().__init__([node], reads=[a, b], writes=[node])
        self.node = node
        fields = tensor_fields("a") + tensor_fields("b", ne=False) + tensor_fields("d")
        self.spec = KernelSpec.make("out_prod", fields, cooperative=False, atype=sfx(a.type),
                                    quant=a.type in KV_QUANT_TYPES)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        a, b = self.node.src
        vals = {**tensor_values("a", a, env, addr), **tensor_values("b", b, env, addr, ne=False),
                **tensor_values("d", self.node, env, addr)}
        ne = ne_of(self.node, env)
        n = ne[0] * ne[1] * ne[2] * ne[3]
        return [Launch(self.spec, (grid_stride_blocks(n), 1, 1), (256, 1, 1), 0, self.spec.pack(vals))]


def _out_prod_ok(node: Tensor) -> bool:
    """f32 b and result; a float, or a quantised KV cache type read along whole blocks."""
    a, b = node.src
    if b.type != GGMLType.F32 or node.type != GGMLType.F32:
        return False
    return a.type in FLOAT_TYPES or (a.type in KV_QUANT_TYPES and a.nb[0] == type_size(a.type))


@lowering("out_prod", supports=_out_prod_ok)
def _out_prod(node: Tensor, opts) -> Step:
    return OutProdStep(node)


class KvRowsStep(Step):
    """cont (decode) of a quantised view into f32 rows, or cpy of f32 rows into one."""

    def __init__(self, node: Tensor):
        self.node = node
        self.decode = node.op == "cont"
        self.src = node.src[0] if self.decode else node.src[1]
        super().__init__([node], reads=[self.src], writes=[node])
        qtype = self.src.type if self.decode else node.type
        fields = [("s", "ptr"), ("d", "ptr")] + [(f"ne{i}", "i64") for i in range(4)]
        fields += [(f"snb{i}", "i64") for i in range(4)] + [(f"dnb{i}", "i64") for i in range(4)]
        self.spec = KernelSpec.make("kv_rows", fields, cooperative=False, qtype=sfx(qtype), decode=self.decode)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        ne = ne_of(self.node, env)
        vals = {"s": addr(self.src), "d": addr(self.node), **{f"ne{i}": v for i, v in enumerate(ne)}}
        vals.update({f"snb{i}": v for i, v in enumerate(nb_of(self.src, env))})
        vals.update({f"dnb{i}": v for i, v in enumerate(nb_of(self.node, env))})
        n = ne[0] // 32 * ne[1] * ne[2] * ne[3]
        return [Launch(self.spec, (grid_stride_blocks(n), 1, 1), (256, 1, 1), 0, self.spec.pack(vals))]


def kv_rows_ok(node: Tensor) -> bool:
    """cont of a quantised KV cache view (rows of whole blocks) into f32 of its shape, or cpy
    of f32 rows into one."""
    if node.op == "cont":
        q, f = node.src[0], node
    elif node.op == "cpy":
        q, f = node, node.src[1]
    else:
        return False
    return (q.type in KV_QUANT_TYPES and f.type == GGMLType.F32 and tuple(q.ne) == tuple(f.ne)
            and q.nb[0] == type_size(q.type) and isinstance(q.ne[0], int) and q.ne[0] % 32 == 0)
