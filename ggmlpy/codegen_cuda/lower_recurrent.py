"""Lowerings of the recurrent layers' ops: ssm_conv, one thread per (channel, token)
(templates/cuda/ssm_conv.cu.j2); gated_delta_net, one block per (head, sequence) whose
thread j keeps the state's row j in registers over the tokens
(templates/cuda/gated_delta_net.cu.j2)."""
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


# The state row lives in registers (float m[S_v], unrolled): past this many it would spill.
MAX_DELTA_NET_S = 256


class GatedDeltaNetStep(Step):
    """One launch, grid (H_v, n_seqs): block (h, s) carries its state over every token of the
    ubatch, as ggml's kernels do. The rows of a state are independent (row j needs only k, q,
    v[j], the gate and beta), so thread j owns row j and the block shares only the token's q,
    k (and a KDA gate) through shared memory: no reduction across threads."""

    def __init__(self, node: Tensor):
        super().__init__([node], reads=list(node.src), writes=[node])
        self.node = node
        q, k, v, g = node.src[:4]
        self.sv = int(v.ne[0])
        self.block = max(32, ceil_div(self.sv, 32) * 32)
        fields = [(n, "ptr") for n in ("q", "k", "v", "g", "b", "s", "d")]
        fields += [(n, "i64") for n in ("H", "T", "NS", "hq", "hk", "rq", "rk", "K")]
        fields += [(f"{t}nb{i}", "i64") for t in "qkvgbs" for i in (1, 2, 3)]
        self.spec = KernelSpec.make("gated_delta_net", fields, cooperative=True, sv=self.sv,
                                    kda=g.ne[0] != 1, block=self.block)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        node = self.node
        q, k, v = node.src[:3]
        vne = ne_of(v, env)
        vals: dict[str, int] = {n: addr(t) for n, t in zip(("q", "k", "v", "g", "b", "s", "d"), (*node.src, node))}
        vals.update(H=vne[1], T=vne[2], NS=vne[3], hq=ne_of(q, env)[1], hk=ne_of(k, env)[1],
                    rq=vne[3] // max(1, ne_of(q, env)[3]), rk=vne[3] // max(1, ne_of(k, env)[3]),
                    K=int(node.params.get("K", 1)))
        for name, t in zip("qkvgbs", node.src):
            nb = nb_of(t, env)
            vals.update({f"{name}nb{i}": nb[i] for i in (1, 2, 3)})
        grid = check_grid((vne[1], vne[3], 1), "gated_delta_net")
        return [Launch(self.spec, grid, (self.block, 1, 1), 0, self.spec.pack(vals))]


def _delta_net_supported(node: Tensor) -> bool:
    q, k, v = node.src[:3]
    static = all(isinstance(d, int) for d in (v.ne[0], v.ne[1], q.ne[1], k.ne[1]))
    return (static and v.ne[0] <= MAX_DELTA_NET_S
            and all(t.type == GGMLType.F32 for t in (node, *node.src)))


@lowering("gated_delta_net", supports=_delta_net_supported)
def _gated_delta_net(node: Tensor, opts) -> Step:
    return GatedDeltaNetStep(node)
