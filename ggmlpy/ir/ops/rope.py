"""Rotary position embedding as ggml_rope_ext computes it, YaRN corrections included.

`a` [head_dim, n_head, n_tokens], `pos` I32 [n_tokens], optional `freq_factors` F32
[n_dims/2]. Mode 0 rotates adjacent pairs (x[2i], x[2i+1]); mode 2 (NeoX) rotates
(x[i], x[i + n_dims/2]). Dimensions past n_dims pass through unchanged.

Multi-section RoPE (ggml_rope_multi; Qwen2-VL's M-RoPE, mode 8, and Qwen3-VL's interleaved
I-RoPE, mode 40) rotates NeoX-style, but each token has four positions (t, h, w, e: `pos` I32
[4 * n_tokens], component c of token i at pos[i + c * n_tokens]) and the `sections` param
(4 ints) says which one each pair's angle uses (`mrope_components`). ggml's vision mode (24)
is not supported.
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
ROPE_TYPE_MROPE = 8      # multi-section: sections of pairs take the t, h, w, e positions
ROPE_TYPE_IMROPE = 40    # interleaved multi-section (Qwen3-VL): pairs cycle t, h, w
ROPE_TYPE_VISION = 24    # ggml's vision M-RoPE: refused by name, not computed
ROPE_MULTI_MODES = (ROPE_TYPE_MROPE, ROPE_TYPE_IMROPE)
MROPE_SECTIONS = 4       # ggml's GGML_MROPE_SECTIONS: positions per token in the multi modes


def is_multi(mode: int) -> bool:
    """Whether `mode` is a multi-section rope (positions [4 * n_tokens], `sections` param)."""
    return mode in ROPE_MULTI_MODES


def mrope_components(n_dims: int, sections: Sequence[int], mode: int) -> tuple[int, ...]:
    """The position component (0 t, 1 h, 2 w, 3 e) each of the n_dims/2 pairs rotates by, as
    ggml_mrope_cache_init picks it: sector = pair % sum(sections); M-RoPE gives consecutive
    runs of sectors to t, h, w, e, I-RoPE cycles t, h, w while each has sectors left, the
    rest to e. A compile-time table: backends read pos[token + c * n_tokens] per pair."""
    s0, s1, s2, s3 = (int(v) for v in sections)
    total = s0 + s1 + s2 + s3
    out = []
    for pair in range(n_dims // 2):
        sector = pair % total
        if mode == ROPE_TYPE_IMROPE:
            if sector % 3 == 1 and sector < 3 * s1:
                c = 1
            elif sector % 3 == 2 and sector < 3 * s2:
                c = 2
            elif sector % 3 == 0 and sector < 3 * s0:
                c = 0
            else:
                c = 3
        else:
            c = 0 if sector < s0 else 1 if sector < s0 + s1 else 2 if sector < s0 + s1 + s2 else 3
        out.append(c)
    return tuple(out)


def _infer(srcs: Sequence[Any], params: dict) -> Inferred:
    a, pos = srcs[0], srcs[1]
    require(pos.type == GGMLType.I32, "rope", "positions must be I32")
    mode = params["mode"]
    require(mode != ROPE_TYPE_VISION, "rope", "mode 24 (GGML_ROPE_TYPE_VISION) is not supported")
    require(mode in (ROPE_TYPE_NORM, ROPE_TYPE_NEOX) + ROPE_MULTI_MODES, "rope", lambda: f"mode {mode} unsupported")
    n_dims = params["n_dims"]
    require(n_dims % 2 == 0 and (not isinstance(a.ne[0], int) or n_dims <= a.ne[0]), "rope",
            lambda: f"n_dims {n_dims} must be even and at most {a.ne[0]}")
    if is_multi(mode):
        _check_sections(params, a.ne[0])
        require(pos.ne[0] == MROPE_SECTIONS * a.ne[2], "rope", lambda: f"mode {mode} needs 4 positions per token: "
                f"{pos.shape_str()} positions for {a.shape_str()}")
    else:
        require("sections" not in params, "rope", lambda: f"sections only apply to modes 8 and 40, not {mode}")
        require(pos.ne[0] == a.ne[2], "rope", lambda: f"{pos.shape_str()} positions for {a.shape_str()}")
    return Inferred(F32, a.ne)


def _check_sections(params: dict, head_dim: Any) -> None:
    """ggml's asserts on sections (a pair needs a sector, t/h/w need one at least), and a tuple
    so that params stay hashable (fusion rules key ropes on them)."""
    sections = params.get("sections")
    require(sections is not None, "rope", lambda: f"mode {params['mode']} needs the `sections` param (4 ints)")
    require(isinstance(sections, tuple) and len(sections) == MROPE_SECTIONS
            and all(isinstance(v, int) and v >= 0 for v in sections), "rope",
            lambda: f"sections must be a tuple of 4 non-negative ints, not {sections!r}")
    require(sum(sections[:3]) > 0, "rope", lambda: f"sections {sections} give t, h and w no pair")
    require(not isinstance(head_dim, int) or sum(sections) <= head_dim, "rope",
            lambda: f"sections {sections} add up to more than the head dimension {head_dim}")


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    def corr_dim(n_rot: float) -> float:
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))

    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return max(0.0, start), min(n_dims - 1.0, end)


def rope_cos_sin(pos: np.ndarray, params: dict, freq_factors: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [n_tokens, n_dims/2] (shared by the reference and by tests). In the
    multi modes `pos` holds 4 * n_tokens positions and each pair takes its component's."""
    n_dims = params["n_dims"]
    freq_scale, ext_factor = params["freq_scale"], params["ext_factor"]
    i0 = np.arange(0, n_dims, 2, dtype=np.float64)
    if is_multi(params["mode"]):
        comp = np.array(mrope_components(n_dims, params["sections"], params["mode"]), dtype=np.int64)
        per_pair = pos.reshape(MROPE_SECTIONS, -1)[comp].T   # [n_tokens, n_dims/2]
    else:
        per_pair = pos[:, None]
    theta_extrap = per_pair.astype(np.float64) * params["freq_base"] ** (-i0 / n_dims)[None, :]
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
    if params["mode"] != ROPE_TYPE_NORM:   # NeoX and both multi modes rotate halves
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


def _api_multi(b, a, pos, freq_factors, n_dims: int, sections: Sequence[int], mode: int, n_ctx_orig: int = 0,
               freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
               attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0):
    """ggml_rope_multi's argument order: `pos` holds 4 positions per token, `sections` 4 ints."""
    require(is_multi(int(mode)), "rope", lambda: f"rope_multi takes modes 8 and 40 (M-RoPE, I-RoPE), not {mode}")
    srcs = (a, pos) if freq_factors is None else (a, pos, freq_factors)
    params = {"n_dims": int(n_dims), "sections": tuple(int(v) for v in sections), "mode": int(mode),
              "n_ctx_orig": int(n_ctx_orig), "freq_base": float(freq_base), "freq_scale": float(freq_scale),
              "ext_factor": float(ext_factor), "attn_factor": float(attn_factor),
              "beta_fast": float(beta_fast), "beta_slow": float(beta_slow)}
    return b.make("rope", srcs, params)


def _params(n_dims: int, mode: int, **over: Any) -> tuple[tuple[str, Any], ...]:
    p = {"n_dims": n_dims, "mode": mode, "n_ctx_orig": 4096, "freq_base": 10000.0, "freq_scale": 1.0,
         "ext_factor": 0.0, "attn_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}
    p.update(over)
    return tuple(p.items())


def _multi(ne: tuple[int, ...], n_dims: int, mode: int, sections: tuple[int, ...], label: str,
           ff: bool = False, **over: Any) -> OpCase:
    """A multi-section case: 4 * n_tokens positions, drawn independently (4 distinct components)."""
    srcs = (SrcSpec(F32, ne), SrcSpec(GGMLType.I32, (4 * ne[2],), fill="pos"))
    srcs += (SrcSpec(F32, (n_dims // 2,), fill="positive"),) if ff else ()
    return OpCase(srcs, _params(n_dims, mode, sections=sections, **over), label=label)


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
        # pairs t t h w e e t t: a run of each component, e included, and the sector wrap
        _multi((16, 3, 5, 1), 16, ROPE_TYPE_MROPE, (2, 1, 1, 2), "mrope"),
        # pairs t h w t h e t h: the interleave, e once w's sectors run out, the wrap
        _multi((16, 3, 5, 1), 16, ROPE_TYPE_IMROPE, (2, 2, 1, 1), "imrope"),
        _multi((32, 2, 3, 2), 16, ROPE_TYPE_MROPE, (2, 2, 1, 0), "mrope partial rotary ne3=2"),
        _multi((128, 2, 3, 1), 128, ROPE_TYPE_IMROPE, (24, 20, 20, 0), "imrope qwen3-vl", freq_base=5e6),
        _multi((32, 2, 3, 1), 32, ROPE_TYPE_IMROPE, (3, 3, 2, 0), "imrope yarn ff", ff=True,
               freq_scale=0.25, ext_factor=1.0),
    ]


register(OpDef("rope", Kind.ROW, _infer, _reference, api={"rope_ext": _api, "rope_multi": _api_multi},
               cases=_cases, doc="rotary position embedding (ggml_rope_ext, ggml_rope_multi)"))
