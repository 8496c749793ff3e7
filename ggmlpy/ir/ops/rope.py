"""Rotary position embedding as ggml_rope_ext computes it, YaRN corrections included.

`a` [head_dim, n_head, n_tokens], `pos` I32 [n_tokens], optional `freq_factors` F32
[n_dims/2]. Mode 0 rotates adjacent pairs (x[2i], x[2i+1]); mode 2 (NeoX) rotates
(x[i], x[i + n_dims/2]). Dimensions past n_dims pass through unchanged.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import require
from ggmlpy.ir.ops.registry import Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.types import GGMLType

F32 = GGMLType.F32
# the op's `mode`, llama.cpp's LLAMA_ROPE_TYPE_*: model files set hp.rope_type from these
ROPE_TYPE_NORM = 0
ROPE_TYPE_NEOX = 2


def _infer(srcs: Sequence[Any], params: dict) -> Inferred:
    a, pos = srcs[0], srcs[1]
    require(pos.type == GGMLType.I32, "rope", "positions must be I32")
    require(pos.ne[0] == a.ne[2], "rope", lambda: f"{pos.shape_str()} positions for {a.shape_str()}")
    require(params["mode"] in (ROPE_TYPE_NORM, ROPE_TYPE_NEOX), "rope", lambda: f"mode {params['mode']} unsupported")
    n_dims = params["n_dims"]
    require(n_dims % 2 == 0 and (not isinstance(a.ne[0], int) or n_dims <= a.ne[0]), "rope",
            lambda: f"n_dims {n_dims} must be even and at most {a.ne[0]}")
    return Inferred(F32, a.ne)


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    def corr_dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))

    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return max(0.0, start), min(n_dims - 1.0, end)


def rope_cos_sin(pos: np.ndarray, params: dict, freq_factors: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [n_tokens, n_dims/2] (shared by the reference and by tests)."""
    n_dims = params["n_dims"]
    freq_scale, ext_factor = params["freq_scale"], params["ext_factor"]
    i0 = np.arange(0, n_dims, 2, dtype=np.float64)
    theta_extrap = pos.astype(np.float64)[:, None] * params["freq_base"] ** (-i0 / n_dims)[None, :]
    if freq_factors is not None:
        theta_extrap = theta_extrap / freq_factors.astype(np.float64).reshape(-1)[None, : n_dims // 2]
    theta = freq_scale * theta_extrap
    mscale = params["attn_factor"]
    if ext_factor != 0.0:
        low, high = yarn_corr_dims(n_dims, params["n_ctx_orig"], params["freq_base"],
                                   params["beta_fast"], params["beta_slow"])
        y = (i0 / 2 - low) / max(0.001, high - low)
        ramp_mix = (1 - np.clip(y, 0, 1)) * ext_factor
        theta = theta * (1 - ramp_mix) + theta_extrap * ramp_mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    return np.cos(theta) * mscale, np.sin(theta) * mscale


def _reference(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    a = x[0].astype(np.float32)  # numpy order [ne3, n_tokens, n_head, head_dim]
    pos = x[1].reshape(-1)
    ff = x[2] if len(x) > 2 else None
    cos, sin = rope_cos_sin(pos, params, ff)
    cos = cos[None, :, None, :]
    sin = sin[None, :, None, :]
    n_dims = params["n_dims"]
    out = a.copy()
    if params["mode"] == ROPE_TYPE_NEOX:
        x0, x1 = a[..., : n_dims // 2], a[..., n_dims // 2: n_dims]
        out[..., : n_dims // 2] = x0 * cos - x1 * sin
        out[..., n_dims // 2: n_dims] = x0 * sin + x1 * cos
    else:
        x0, x1 = a[..., 0:n_dims:2], a[..., 1:n_dims:2]
        out[..., 0:n_dims:2] = x0 * cos - x1 * sin
        out[..., 1:n_dims:2] = x0 * sin + x1 * cos
    return out.astype(np.float32)


def _api(b, a, pos, freq_factors, n_dims: int, mode: int, n_ctx_orig: int = 0,
         freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
         attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0):
    """ggml_rope_ext's argument order."""
    srcs = (a, pos) if freq_factors is None else (a, pos, freq_factors)
    params = {"n_dims": int(n_dims), "mode": int(mode), "n_ctx_orig": int(n_ctx_orig),
              "freq_base": float(freq_base), "freq_scale": float(freq_scale),
              "ext_factor": float(ext_factor), "attn_factor": float(attn_factor),
              "beta_fast": float(beta_fast), "beta_slow": float(beta_slow)}
    return b.make("rope", srcs, params)


def _params(n_dims: int, mode: int, **over: float) -> tuple[tuple[str, Any], ...]:
    p = {"n_dims": n_dims, "mode": mode, "n_ctx_orig": 4096, "freq_base": 10000.0, "freq_scale": 1.0,
         "ext_factor": 0.0, "attn_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}
    p.update(over)
    return tuple(p.items())


def _cases() -> list[OpCase]:
    return [
        OpCase((SrcSpec(F32, (64, 4, 5, 1)), SrcSpec(GGMLType.I32, (5,), fill="pos")),
               _params(64, ROPE_TYPE_NORM), label="norm"),
        OpCase((SrcSpec(F32, (64, 4, 5, 1)), SrcSpec(GGMLType.I32, (5,), fill="pos")),
               _params(64, ROPE_TYPE_NEOX, freq_base=1e6), label="neox"),
        OpCase((SrcSpec(F32, (32, 2, 3, 1)), SrcSpec(GGMLType.I32, (3,), fill="pos")),
               _params(16, ROPE_TYPE_NEOX), label="partial rotary"),
        OpCase((SrcSpec(F32, (32, 2, 3, 1)), SrcSpec(GGMLType.I32, (3,), fill="pos")),
               _params(32, ROPE_TYPE_NORM, freq_scale=0.25, ext_factor=1.0), label="yarn"),
        OpCase((SrcSpec(F32, (16, 2, 3, 1)), SrcSpec(GGMLType.I32, (3,), fill="pos"),
                SrcSpec(F32, (8,), fill="positive")), _params(16, ROPE_TYPE_NEOX), label="freq factors"),
    ]


register(OpDef("rope", Kind.ROW, _infer, _reference, api={"rope_ext": _api}, cases=_cases,
               doc="rotary position embedding (ggml_rope_ext)"))
