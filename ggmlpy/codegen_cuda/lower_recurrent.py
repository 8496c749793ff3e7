"""Lowerings of the recurrent layers' ops: ssm_conv, one thread per (channel, token)
(templates/cuda/ssm_conv.cu.j2)."""
from __future__ import annotations

from ggmlpy.codegen_cuda.kernels import KernelSpec
from ggmlpy.codegen_cuda.lowering import lowering
from ggmlpy.codegen_cuda.steps import Addr, Env, Launch, Step, ceil_div, check_grid, nb_of, ne_of
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType

THREADS = 256


class SsmConvStep(Step):
    def __init__(self, node: Tensor):
        super().__init__([node], reads=list(node.src), writes=[node])
        self.node = node
        fields = [("sx", "ptr"), ("c", "ptr"), ("d", "ptr"), ("d_inner", "i64"), ("d_conv", "i64")]
        fields += [(f"snb{i}", "i64") for i in range(3)] + [(f"cnb{i}", "i64") for i in range(2)]
        fields += [(f"dnb{i}", "i64") for i in range(3)]
        self.spec = KernelSpec.make("ssm_conv", fields, cooperative=False)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        node = self.node
        sx, c = node.src
        ne, cne = ne_of(node, env), ne_of(c, env)
        snb, cnb, dnb = nb_of(sx, env), nb_of(c, env), nb_of(node, env)
        vals = {"sx": addr(sx), "c": addr(c), "d": addr(node), "d_inner": ne[0], "d_conv": cne[0],
                **{f"snb{i}": snb[i] for i in range(3)}, **{f"cnb{i}": cnb[i] for i in range(2)},
                **{f"dnb{i}": dnb[i] for i in range(3)}}
        grid = check_grid((ceil_div(ne[0], THREADS), ne[1], ne[2]), "ssm_conv")
        return [Launch(self.spec, grid, (THREADS, 1, 1), 0, self.spec.pack(vals))]


@lowering("ssm_conv", supports=lambda node: all(t.type == GGMLType.F32 for t in (node, *node.src)))
def _ssm_conv(node: Tensor, opts) -> Step:
    return SsmConvStep(node)
