"""Naive oracles for every computing op, written independently of ggmlpy/ir/ops.

Each oracle takes the sources in ggml index order (`x[i0, i1, i2, i3]`, float64, or ints for
indices) and loops over ggml indices the way ggml's C kernels do, with scalar math written
differently from the numpy references where a formula allows it (sigmoid forms of silu and
gelu, erfc, per-pair complex rotation for rope). Slow, but the test shapes are small.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Sequence

import numpy as np

from ggmlpy.ir.ops.registry import OpCase
from ggmlpy.ir.types import GGMLType, is_quantized

from .oracles_kv import out_prod, round_row

Oracle = Callable[[Sequence[np.ndarray], dict, OpCase], np.ndarray]


def indices(shape: Sequence[int]):
    """Every ggml index (i0, i1, i2, i3), i0 fastest: the order of a contiguous tensor."""
    for rev in itertools.product(*(range(n) for n in reversed(tuple(shape)))):
        yield tuple(reversed(rev))


def pad4(ne: Sequence[int]) -> tuple[int, ...]:
    return tuple(ne) + (1,) * (4 - len(ne))


def round_to(ttype: GGMLType, v: float) -> float:
    """A float32 value as stored in `ttype` and read back."""
    if ttype == GGMLType.F16:
        return float(np.float16(np.float32(v)))
    if ttype == GGMLType.BF16:
        bits = int(np.float32(v).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
        return float(np.uint32(bits << 16).view(np.float32))
    return float(np.float32(v))


def sigmoid(x: float) -> float:
    return 0.5 * (1.0 + math.tanh(0.5 * x))


# elementwise ---------------------------------------------------------------------------------
def binary(fn: Callable[[float, float], float]) -> Oracle:
    def oracle(x, p, case):
        a, b = x
        out = np.empty(a.shape)
        for i in indices(a.shape):
            j = tuple(k % n for k, n in zip(i, b.shape))  # ggml tiles b over a
            out[i] = fn(a[i], b[j])
        return out
    return oracle


def unary(fn: Callable[[float], float]) -> Oracle:
    def oracle(x, p, case):
        out = np.empty(x[0].shape)
        for i in indices(x[0].shape):
            out[i] = fn(float(x[0][i]))
        return out
    return oracle


def gelu_tanh(v: float) -> float:
    # 0.5 * (1 + tanh(z)) == sigmoid(2z)
    z = math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)
    return v * sigmoid(2.0 * z)


def gelu_ggml(v: float) -> float:
    """ggml's CPU GELU, the op's semantics: its f16 table between -10 and 10."""
    if v <= -10.0:
        return 0.0
    if v >= 10.0:
        return v
    return float(np.float16(gelu_tanh(float(np.float16(v)))))


def silu(v: float) -> float:
    return v * sigmoid(v)


def glu(act: Callable[[float], float]) -> Oracle:
    def oracle(x, p, case):
        a, g = x
        out = np.empty(a.shape)
        for i in indices(a.shape):
            out[i] = act(float(a[i])) * g[i]
        return out
    return oracle


def scale(x, p, case):
    out = np.empty(x[0].shape)
    for i in indices(x[0].shape):
        out[i] = x[0][i] * p["s"] + p["b"]
    return out


# layout --------------------------------------------------------------------------------------
def cont(x, p, case):
    a = x[0]
    values = [a[i] for i in indices(a.shape)]
    ne = pad4(p["ne"]) if p.get("ne") else a.shape
    out = np.empty(ne)
    for v, j in zip(values, indices(ne)):
        out[j] = v
    return out


def cpy(x, p, case):
    dst, a = x  # write ops take their destination first
    dst_type = case.srcs[0].type
    out = np.empty(dst.shape)
    values = [a[i] for i in indices(a.shape)]
    if is_quantized(dst_type):   # whole rows (along dim 0) are quantised
        n = dst.shape[0]
        values = [v for r in range(0, len(values), n) for v in round_row(dst_type, values[r:r + n])]
    for v, j in zip(values, indices(dst.shape)):
        out[j] = v if is_quantized(dst_type) else round_to(dst_type, v)
    return out


def concat(x, p, case):
    a, c = x
    dim = p["dim"]
    ne = list(a.shape)
    ne[dim] += c.shape[dim]
    out = np.empty(ne)
    for i in indices(ne):
        if i[dim] < a.shape[dim]:
            out[i] = a[i]
        else:
            j = list(i)
            j[dim] -= a.shape[dim]
            out[i] = c[tuple(j)]
    return out


# matmul --------------------------------------------------------------------------------------
def mul_mat(x, p, case, tile: bool = False):
    """out[i0, i1, i2, i3] = a row i0 . b row i1; a's batch index is i2 // r2 (ggml repeats
    each a-matrix r2 times in a row). `tile` uses i2 % ne02 instead, to show that matters."""
    a, b = x
    r2, r3 = b.shape[2] // a.shape[2], b.shape[3] // a.shape[3]
    out = np.empty((a.shape[1], b.shape[1], b.shape[2], b.shape[3]))
    for i0, i1, i2, i3 in indices(out.shape):
        j2, j3 = (i2 % a.shape[2], i3 % a.shape[3]) if tile else (i2 // r2, i3 // r3)
        out[i0, i1, i2, i3] = np.dot(a[:, i0, j2, j3], b[:, i1, i2, i3])
    return out


# norms ---------------------------------------------------------------------------------------
def rms_norm(x, p, case):
    a = x[0]
    out = np.empty(a.shape)
    for i1, i2, i3 in itertools.product(*(range(n) for n in a.shape[1:])):
        row = [float(v) for v in a[:, i1, i2, i3]]
        mean_sq = sum(v * v for v in row) / len(row)
        inv = 1.0 / math.sqrt(mean_sq + p["eps"])
        out[:, i1, i2, i3] = [v * inv for v in row]
    return out


def norm(x, p, case):
    a = x[0]
    out = np.empty(a.shape)
    for i1, i2, i3 in itertools.product(*(range(n) for n in a.shape[1:])):
        row = [float(v) for v in a[:, i1, i2, i3]]
        mean = sum(row) / len(row)
        var = sum((v - mean) ** 2 for v in row) / len(row)
        out[:, i1, i2, i3] = [(v - mean) / math.sqrt(var + p["eps"]) for v in row]
    return out


# rope ----------------------------------------------------------------------------------------
def yarn_corr_dims(p: dict) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the pair range over which YaRN blends in extrapolation."""
    n_dims, base = p["n_dims"], p["freq_base"]

    def dim_for(n_rot: float) -> float:
        return n_dims * math.log(p["n_ctx_orig"] / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(dim_for(p["beta_fast"])))
    high = min(n_dims - 1.0, math.ceil(dim_for(p["beta_slow"])))
    return low, high


def rope_rotation(pos: int, pair: int, p: dict, freq_factor: float) -> complex:
    """The complex number pair `pair` of a token at `pos` is multiplied by (rope_yarn)."""
    theta_extrap = pos * p["freq_base"] ** (-2.0 * pair / p["n_dims"]) / freq_factor
    theta = p["freq_scale"] * theta_extrap
    mscale = p["attn_factor"]
    if p["ext_factor"] != 0.0:
        low, high = yarn_corr_dims(p)
        y = (pair - low) / max(0.001, high - low)
        mix = (1.0 - min(1.0, max(0.0, y))) * p["ext_factor"]
        theta = theta * (1.0 - mix) + theta_extrap * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / p["freq_scale"])
    return mscale * complex(math.cos(theta), math.sin(theta))


def mrope_component(pair: int, sections: Sequence[int], interleaved: bool) -> int:
    """Which of a token's 4 positions (t, h, w, e) pair `pair` of a multi-section rope uses:
    M-RoPE walks the section bounds; I-RoPE's sector s belongs to component s % 3 while that
    component's 3 * sections[c] sectors last, to e after."""
    sector = pair % sum(sections)
    if interleaved:
        c = sector % 3
        return c if sector < 3 * sections[c] else 3
    bound = 0
    for c in range(3):
        bound += sections[c]
        if sector < bound:
            return c
    return 3


def rope(x, p, case):
    a, pos = x[0], x[1]
    ff = x[2][:, 0, 0, 0] if len(x) > 2 else None
    half = p["n_dims"] // 2
    multi = p["mode"] in (8, 40)
    out = a.copy()  # dims past n_dims pass through
    for i1, i2, i3 in itertools.product(*(range(n) for n in a.shape[1:])):
        for pair in range(half):
            # multi modes: 4 positions per token, component c of token i2 at pos[i2 + c * n_tokens]
            at = i2 + mrope_component(pair, p["sections"], p["mode"] == 40) * a.shape[2] if multi else i2
            rot = rope_rotation(int(pos[at, 0, 0, 0]), pair, p, 1.0 if ff is None else float(ff[pair]))
            j0, j1 = (2 * pair, 2 * pair + 1) if p["mode"] == 0 else (pair, pair + half)
            z = complex(a[j0, i1, i2, i3], a[j1, i1, i2, i3]) * rot
            out[j0, i1, i2, i3], out[j1, i1, i2, i3] = z.real, z.imag
    return out


# rows ----------------------------------------------------------------------------------------
def get_rows(x, p, case):
    a, idx = x
    out = np.empty((a.shape[0],) + idx.shape[:3], dtype=a.dtype)
    for i10, i11, i12 in itertools.product(*(range(n) for n in idx.shape[:3])):
        row = int(idx[i10, i11, i12, 0])
        out[:, i10, i11, i12] = a[:, row, i11 % a.shape[2], i12 % a.shape[3]]
    return out


def set_rows(x, p, case):
    dst, src, idx = x
    dst_type = case.srcs[0].type
    out = dst.copy()
    for i01, i02, i03 in itertools.product(*(range(n) for n in src.shape[1:])):
        row = int(idx[i01, i02 % idx.shape[1], i03 % idx.shape[2], 0])
        values = src[:, i01, i02, i03]
        out[:, row, i02, i03] = (round_row(dst_type, values) if is_quantized(dst_type)
                                 else [round_to(dst_type, v) for v in values])
    return out


# softmax -------------------------------------------------------------------------------------
def alibi_slope(head: int, n_head: int, max_bias: float) -> float:
    if max_bias <= 0.0:
        return 1.0
    n_log2 = 2 ** int(math.floor(math.log2(n_head)))
    if head < n_log2:
        return (2.0 ** (-max_bias / n_log2)) ** (head + 1)
    return (2.0 ** (-max_bias / 2.0 / n_log2)) ** (2 * (head - n_log2) + 1)


def soft_max(x, p, case):
    a = x[0]
    mask = x[1] if len(x) > 1 else None
    out = np.empty(a.shape)
    for i1, i2, i3 in itertools.product(*(range(n) for n in a.shape[1:])):
        slope = alibi_slope(i2, a.shape[2], p["max_bias"])
        logits = []
        for i0 in range(a.shape[0]):
            v = float(a[i0, i1, i2, i3]) * p["scale"]
            if mask is not None:  # mask row i1 (rows may be padded), tiled over heads
                v += slope * float(mask[i0, i1, i2 % mask.shape[2], i3 % mask.shape[3]])
            logits.append(v)
        sink = [float(x[2][i2, 0, 0, 0])] if len(x) > 2 else []   # an extra logit without an output
        top = max(logits + sink)
        exps = [math.exp(v - top) for v in logits]
        total = sum(exps) + sum(math.exp(v - top) for v in sink)
        out[:, i1, i2, i3] = [e / total for e in exps]
    return out


# mixture of experts --------------------------------------------------------------------------
def swiglu_oai(p: dict) -> Callable[[float, float], float]:
    """gpt-oss's clamped SwiGLU as its reference code writes it (tanh form of the sigmoid)."""
    def f(a: float, g: float) -> float:
        x, y = min(a, p["limit"]), max(-p["limit"], min(g, p["limit"]))
        return x * (0.5 + 0.5 * math.tanh(0.5 * p["alpha"] * x)) * (y + 1.0)
    return f


def swiglu_oai_oracle(x, p, case):
    a, g = x
    f = swiglu_oai(p)
    out = np.empty(a.shape)
    for i in indices(a.shape):
        out[i] = f(float(a[i]), float(g[i]))
    return out


def argsort(x, p, case):
    """Per row, repeated selection of the smallest (largest) value left, the first index on
    ties."""
    a = x[0]
    out = np.empty(a.shape, dtype=np.int64)
    for i1, i2, i3 in itertools.product(*(range(n) for n in a.shape[1:])):
        left = list(range(a.shape[0]))
        for j in range(a.shape[0]):
            if p["order"] == 1:
                pick = max(left, key=lambda c: (a[c, i1, i2, i3], -c))
            else:
                pick = min(left, key=lambda c: (a[c, i1, i2, i3], c))
            out[j, i1, i2, i3] = pick
            left.remove(pick)
    return out


def mul_mat_id(x, p, case):
    """out[:, e, t] = as[:, :, ids[e, t]] . b[:, e % n_b, t], token by token."""
    w, b, ids = x
    n_used, n_tokens = ids.shape[0], ids.shape[1]
    out = np.empty((w.shape[1], n_used, n_tokens, 1))
    for e, t in itertools.product(range(n_used), range(n_tokens)):
        expert = int(ids[e, t, 0, 0])
        for row in range(w.shape[1]):
            out[row, e, t, 0] = sum(w[k, row, expert, 0] * b[k, e % b.shape[1], t, 0] for k in range(w.shape[0]))
    return out


def clamp(x, p, case):
    out = np.empty(x[0].shape)
    for i in indices(x[0].shape):
        out[i] = min(max(x[0][i], p["min"]), p["max"])
    return out


def sum_rows(x, p, case):
    a = x[0]
    out = np.zeros((1,) + a.shape[1:])
    for i0, i1, i2, i3 in indices(a.shape):
        out[0, i1, i2, i3] += a[i0, i1, i2, i3]
    return out


def ssm_conv(x, p, case):
    """out[i, t, s] = sum over k of sx[t + k, i, s] * c[k, i] (a causal convolution per channel)."""
    sx, c = x
    d_conv, d_inner, n_s = c.shape[0], c.shape[1], sx.shape[2]
    n_t = sx.shape[0] - d_conv + 1
    out = np.zeros((d_inner, n_t, n_s, 1))
    for i, t, s in itertools.product(range(d_inner), range(n_t), range(n_s)):
        out[i, t, s, 0] = sum(float(sx[t + k, i, s, 0]) * float(c[k, i, 0, 0]) for k in range(d_conv))
    return out


def gated_delta_net(x, p, case, interleaved=False):
    """The delta rule on S[i][j] (the state as ggml stores it, [i0, i1] = [i, j]), per value
    head and sequence, in float64: S = exp(g) S (KDA: row i by exp(g[i])); S += k (beta (v -
    S^T k))^T; o = S^T q / sqrt(S_v). Written into a flat buffer in ggml's memory order: the
    outputs, then K snapshots (slot n: the state n tokens before the last; zero past the start).
    `interleaved`: q/k head h * H_k // H_v instead of ggml's tiled h % H_k (to show the difference)."""
    q, k, v, g, beta, state = x
    S, H, T, n_s = v.shape
    K = p.get("K", 1)
    flat = np.zeros(S * H * (T * n_s + K * S * n_s))
    snap0 = S * H * T * n_s
    for h, s in itertools.product(range(H), range(n_s)):
        hq, hk = (h * q.shape[1] // H, h * k.shape[1] // H) if interleaved else (h % q.shape[1], h % k.shape[1])
        sq, sk = s // (n_s // q.shape[3]), s // (n_s // k.shape[3])
        St = state[:, :, h, s].copy()
        for t in range(T):
            kt, qt = k[:, hk, t, sk], q[:, hq, t, sq]
            St = St * np.exp(g[:, h, t, s])[:, None]          # a [1] gate scales every row
            delta = beta[0, h, t, s] * (v[:, h, t, s] - np.einsum("ij,i->j", St, kt))
            St = St + np.einsum("i,j->ij", kt, delta)
            o = np.einsum("ij,i->j", St, qt) / math.sqrt(S)
            at = S * (h + H * (t + T * s))
            flat[at:at + S] = o
            back = T - 1 - t
            if back < K:
                at = snap0 + S * S * (h + H * (s + n_s * back))
                flat[at:at + S * S] = St.reshape(-1, order="F")   # i fastest
    return flat.reshape((S * H, -1, 1, 1), order="F")


def add_id(x, p, case):
    a, b, ids = x
    out = np.empty(a.shape)
    for i0, i1, i2, i3 in indices(a.shape):
        out[i0, i1, i2, i3] = a[i0, i1, i2, i3] + b[i0, int(ids[i1, i2, 0, 0]), 0, 0]
    return out


ORACLES: dict[str, Oracle] = {
    "add": binary(lambda u, v: u + v),
    "sub": binary(lambda u, v: u - v),
    "mul": binary(lambda u, v: u * v),
    "div": binary(lambda u, v: u / v),
    "silu": unary(silu),
    "gelu": unary(gelu_ggml),
    "gelu_erf": unary(lambda v: 0.5 * v * math.erfc(-v / math.sqrt(2.0))),
    "tanh": unary(lambda v: 2.0 * sigmoid(2.0 * v) - 1.0),
    "relu": unary(lambda v: v if v > 0 else 0.0),
    "sigmoid": unary(lambda v: 1.0 / (1.0 + math.exp(-v)) if v > -700 else 0.0),
    "softplus": unary(lambda v: v if v > 20 else math.log1p(math.exp(v))),
    "sqr": unary(lambda v: v ** 2),
    "sqrt": unary(math.sqrt),
    "abs": unary(lambda v: v if v >= 0 else -v),
    "scale": scale,
    "swiglu": glu(silu),
    "geglu": glu(gelu_ggml),
    "cont": cont,
    "cpy": cpy,
    "concat": concat,
    "mul_mat": mul_mat,
    "out_prod": out_prod,
    "rms_norm": rms_norm,
    "norm": norm,
    "rope": rope,
    "get_rows": get_rows,
    "set_rows": set_rows,
    "soft_max": soft_max,
    "swiglu_oai": swiglu_oai_oracle,
    "argsort": argsort,
    "mul_mat_id": mul_mat_id,
    "add_id": add_id,
    "clamp": clamp,
    "sum_rows": sum_rows,
    "ssm_conv": ssm_conv,
    "gated_delta_net": gated_delta_net,
}


def run_oracle(op_name: str, values: Sequence[np.ndarray], params: dict[str, Any], case: OpCase,
               **kw: Any) -> np.ndarray:
    """Apply the oracle to numpy-ordered source values; returns a numpy-ordered result."""
    ggml_order = [v.T if v.dtype.kind in "iu" else v.T.astype(np.float64) for v in values]
    return np.asarray(ORACLES[op_name](ggml_order, params, case, **kw)).T
