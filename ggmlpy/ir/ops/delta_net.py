"""The gated delta-net recurrence of linear-attention layers (ggml_gated_delta_net: Qwen3.5's
and Qwen3-Next's linear attention, and Kimi's KDA with a per-channel gate).

gated_delta_net(q, k, v, g, beta, state, K): per value head h and sequence s, a state matrix
M (S_v x S_v; ggml stores it as [S_v, S_v, H_v, n_seqs], M[j][i] at element i of row j, i.e.
the transposed S[i][j] of the papers) is carried over the tokens t of the ubatch:

    M *= exp(g[t])                       scalar gate (g [1, H_v, T, n_seqs]); KDA gate
                                         (g [S_v, H_v, T, n_seqs]): M[j][i] *= exp(g[t][i])
    delta[j] = (v[t][j] - M[j] . k[t]) * beta[t]
    M[j] += delta[j] * k[t]              for every row j
    out[t][j] = (M[j] . q[t]) / sqrt(S_v)

q, k [S_k, H_k, T, n_seqs_q] (S_k == S_v) are shared by the value heads tiled, as ggml: value
head h reads q/k head h % H_k, and sequence s reads q/k sequence s / (n_seqs / n_seqs_q).

The result (F32, ne = [S_v*H_v, T*n_seqs + K*S_v*n_seqs, 1, 1]) packs the outputs
[S_v, H_v, T, n_seqs] followed by K state snapshots [S_v, S_v, H_v, n_seqs], most recent
first: slot 0 the state after the last token, slot n the state n tokens before it. ggml
writes only the slots below T and leaves the others as they were; here (reference and
kernels alike) those slots are zero, so the result is a function of the inputs.

q, k, v need contiguous rows (views into the convolution's output, as the model makes them);
g, beta and state must be contiguous: ggml asserts the same.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import require
from ggmlpy.ir.ops.registry import Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.symbolic import simplify
from ggmlpy.ir.types import GGMLType

F32 = GGMLType.F32
OP = "gated_delta_net"


def _divides(small, big) -> bool:
    """small divides big (a symbolic pair only when equal: the broadcast must be static)."""
    if small == big:
        return True
    return isinstance(small, int) and isinstance(big, int) and small > 0 and big % small == 0


def _infer(srcs: Sequence[Any], params: dict) -> Inferred:
    require(len(srcs) == 6, OP, lambda: f"takes q, k, v, g, beta and state, got {len(srcs)} sources")
    q, k, v, g, beta, state = srcs
    require(all(t.type == F32 for t in srcs), OP, "every source must be F32")
    K = params.get("K", 1)
    require(isinstance(K, int) and K >= 1, OP, lambda: f"K (the snapshot count) must be an int >= 1, got {K!r}")
    S, H, T, n_s = v.ne[0], v.ne[1], v.ne[2], v.ne[3]
    for name, t in (("q", q), ("k", k)):
        require(t.ne[0] == S and t.ne[2] == T, OP,
                lambda: f"{name} {t.shape_str()} must be [S_v, H_k, n_tokens, n_seqs] for v {v.shape_str()}")
        require(_divides(t.ne[1], H) and _divides(t.ne[3], n_s), OP,
                lambda: f"{name} {t.shape_str()}: heads and sequences must divide v's {v.shape_str()}")
    require(g.ne[0] in (1, S) and tuple(g.ne[1:]) == (H, T, n_s), OP,
            lambda: f"gate {g.shape_str()} must be [1 or S_v, H_v, n_tokens, n_seqs] for v {v.shape_str()}")
    require(beta.ne[0] == 1 and tuple(beta.ne[1:]) == (H, T, n_s), OP,
            lambda: f"beta {beta.shape_str()} must be [1, H_v, n_tokens, n_seqs] for v {v.shape_str()}")
    require(tuple(state.ne) == (S, S, H, n_s), OP,
            lambda: f"state {state.shape_str()} must be [S_v, S_v, H_v, n_seqs] for v {v.shape_str()}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        require(t.ne[0] == 1 or t.nb[0] == 4, OP, lambda: f"{name} {t.shape_str()} needs contiguous rows")
    for name, t in (("g", g), ("beta", beta), ("state", state)):
        require(t.is_contiguous, OP, lambda: f"{name} {t.shape_str()} must be contiguous")
    return Inferred(F32, (simplify(S * H), simplify(T * n_s + K * S * n_s), 1, 1))


def _reference(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    """A loop over the tokens, every (sequence, head) at once; float32 throughout."""
    q, k, v, g, beta, state = (np.asarray(a, np.float32) for a in x)
    K = int(params.get("K", 1))
    n_s, T, H, S = v.shape                                     # numpy order: ne reversed
    heads = np.arange(H)
    qh, kh = heads % q.shape[2], heads % k.shape[2]            # tiled head broadcast
    seqs = np.arange(n_s)
    qs, ks = seqs // (n_s // q.shape[0]), seqs // (n_s // k.shape[0])
    scale = np.float32(1.0) / np.sqrt(np.float32(S))
    M = state.copy()                                           # [n_s, H, j, i]
    out = np.zeros((n_s, T, H, S), np.float32)
    snaps = np.zeros((K, n_s, H, S, S), np.float32)
    for t in range(T):
        qt = q[qs, t][:, qh]                                   # [n_s, H, S]
        kt = k[ks, t][:, kh]
        decay = np.exp(g[:, t])                                # [n_s, H, 1 or S]
        M *= decay[:, :, None, :]
        kv_mem = np.einsum("shji,shi->shj", M, kt)
        delta = (v[:, t] - kv_mem) * beta[:, t]                # beta [n_s, H, 1]
        M += delta[..., :, None] * kt[..., None, :]
        out[:, t] = np.einsum("shji,shi->shj", M, qt) * scale
        if 1 <= T - 1 - t < K:
            snaps[T - 1 - t] = M
    snaps[0] = M                                               # the final state
    return np.concatenate([out.reshape(-1, S * H), snaps.reshape(-1, S * H)])[None, None]


def _srcs(S: int, H_k: int, H_v: int, T: int, n_s: int, kda: bool = False, n_s_qk: int | None = None,
          ) -> tuple[SrcSpec, ...]:
    """A case's sources: keys and queries of unit length (as ggml_l2_norm makes them: with
    longer keys the recurrence is unstable), gates with exp(g) in (0, 1), beta in (0, 1)."""
    n_qk = n_s if n_s_qk is None else n_s_qk
    return (SrcSpec(F32, (S, H_k, T, n_qk), "l2norm"), SrcSpec(F32, (S, H_k, T, n_qk), "l2norm"),
            SrcSpec(F32, (S, H_v, T, n_s)), SrcSpec(F32, (S if kda else 1, H_v, T, n_s), "negative"),
            SrcSpec(F32, (1, H_v, T, n_s), "unit"), SrcSpec(F32, (S, S, H_v, n_s)))


def _cases() -> list[OpCase]:
    return [OpCase(_srcs(16, 2, 2, 5, 1), (("K", 1),), label="5 tokens"),
            OpCase(_srcs(16, 2, 4, 3, 2), (("K", 1),), label="2 k-heads 4 v-heads, 2 sequences"),
            OpCase(_srcs(32, 4, 4, 1, 1), (("K", 1),), label="one token"),
            OpCase(_srcs(12, 3, 3, 4, 1), (("K", 1),), label="S_v 12"),
            OpCase(_srcs(128, 1, 2, 2, 1), (("K", 1),), label="S_v 128, one k-head"),
            OpCase(_srcs(16, 2, 2, 4, 1, kda=True), (("K", 1),), label="KDA gate"),
            OpCase(_srcs(8, 1, 2, 3, 2, n_s_qk=1), (("K", 1),), label="q and k shared by 2 sequences"),
            OpCase(_srcs(16, 1, 2, 5, 1), (("K", 3),), label="3 snapshots"),
            OpCase(_srcs(12, 2, 2, 2, 2), (("K", 4),), label="4 snapshots, 2 tokens")]


def gated_delta_net(b: Any, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, K: int = 1) -> Any:
    """ggml_gated_delta_net: the outputs, then K state snapshots (see the module docstring)."""
    return b.make(OP, (q, k, v, g, beta, state), {"K": int(K)})


register(OpDef(OP, Kind.OPAQUE, _infer, _reference, api={"gated_delta_net": gated_delta_net}, cases=_cases,
               doc="a linear-attention layer's gated delta-rule recurrence over the ubatch (ggml_gated_delta_net)"))
