"""Shared pieces of the numpy oracles: reading a GGUF with the official `gguf` package (not
ggmlpy's reader), and the transformer primitives as the Hugging Face modeling code
computes them (float64 here, so the oracle's own rounding is negligible).

Weights come back in Hugging Face layout: a linear layer's matrix is [out_features,
in_features] and `x @ W.T` applies it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np


@dataclass
class GGUFContents:
    meta: dict[str, Any]
    tensors: dict[str, np.ndarray]
    arch: str

    def key(self, suffix: str, default: Any = None) -> Any:
        return self.meta.get(f"{self.arch}.{suffix}", default)


def _field_value(f) -> Any:
    if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    value = f.parts[f.data[0]]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(value).decode("utf-8")
    return value.tolist()[0]


def read_gguf(path: str | Path) -> GGUFContents:
    reader = gguf.GGUFReader(str(path))
    meta = {name: _field_value(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    tensors = {}
    for t in reader.tensors:
        data = t.data
        if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            data = gguf.quants.dequantize(data, t.tensor_type)
        shape = tuple(reversed([int(n) for n in t.shape]))  # numpy order: [out, in] for matrices
        tensors[t.name] = np.asarray(data, dtype=np.float64).reshape(shape)
    return GGUFContents(meta, tensors, meta["general.architecture"])


@dataclass
class Config:
    """The hyperparameters an oracle needs, under Hugging Face's names."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_theta: float
    rotary_dim: int                          # < head_dim: partial rotary (Phi-3 family)
    vocab_size: int
    sliding_window: int = 0                  # 0: no window
    sliding_layers: list[bool] = field(default_factory=list)
    rope_local_theta: float | None = None    # Gemma 3's base on the sliding layers
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    query_scale: float | None = None         # None: 1/sqrt(head_dim)
    rope_style: str = "half"                 # HF rotate_half; "pairs" only in negative controls

    @property
    def n_rep(self) -> int:
        return self.num_heads // self.num_kv_heads


def base_config(c: GGUFContents, **extra: Any) -> Config:
    n_embd = c.key("embedding_length")
    n_head = c.key("attention.head_count")
    head_dim = c.key("attention.key_length", n_embd // n_head)
    return Config(
        hidden_size=n_embd, num_layers=c.key("block_count"), num_heads=n_head,
        num_kv_heads=c.key("attention.head_count_kv", n_head), head_dim=head_dim,
        rms_eps=c.key("attention.layer_norm_rms_epsilon"), rope_theta=c.key("rope.freq_base", 10000.0),
        rotary_dim=c.key("rope.dimension_count", head_dim),
        vocab_size=len(c.meta["tokenizer.ggml.tokens"]), **extra)


# primitives ---------------------------------------------------------------------------------
def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * w over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """gelu_pytorch_tanh, Gemma's hidden activation."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def rope(x: np.ndarray, pos: np.ndarray, theta: float, rotary_dim: int, style: str = "half") -> np.ndarray:
    """x [T, heads, head_dim]; the first rotary_dim dims rotate, the rest pass through.

    "half" is HF's rotate_half (pairs (i, i + d/2)); "pairs" rotates (2i, 2i + 1)."""
    inv_freq = 1.0 / theta ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]          # [T, d/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if style == "half":
        x1, x2 = rot[..., : rotary_dim // 2], rot[..., rotary_dim // 2:]
        out = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = np.empty_like(rot)
        out[..., 0::2], out[..., 1::2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return np.concatenate([out, rest], axis=-1)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, cfg: Config, window: int = 0) -> np.ndarray:
    """Causal multi-head attention of one sequence at positions 0..T-1.

    q [T, H, D], k/v [T, Hkv, D] (KV heads repeated as HF's repeat_kv); returns [T, H*D].
    window > 0: a query at i sees the keys j with i - window < j <= i (HF's sliding window).
    Scores are scaled, then soft-capped (Gemma 2: tanh(s / c) * c), then masked."""
    k, v = np.repeat(k, cfg.n_rep, axis=1), np.repeat(v, cfg.n_rep, axis=1)
    scale = cfg.query_scale if cfg.query_scale is not None else cfg.head_dim ** -0.5
    s = np.einsum("thd,shd->hts", q, k) * scale
    if cfg.attn_softcap:
        s = np.tanh(s / cfg.attn_softcap) * cfg.attn_softcap
    i, j = np.arange(q.shape[0])[:, None], np.arange(q.shape[0])[None, :]
    allowed = j <= i
    if window:
        allowed &= i - j < window
    s = np.where(allowed[None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("hts,shd->thd", p, v)
    return out.reshape(q.shape[0], -1)


def split_heads(x: np.ndarray, n_heads: int, head_dim: int) -> np.ndarray:
    return x.reshape(x.shape[0], n_heads, head_dim)


def heads_with_rope(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos: np.ndarray,
                    cfg: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Projections [T, heads * D] split into heads, Q and K rotated (rotate_half, the first
    rotary_dim dims): the step between the projections and attention() of most families."""
    q = rope(split_heads(q, cfg.num_heads, cfg.head_dim), pos, cfg.rope_theta, cfg.rotary_dim, cfg.rope_style)
    k = rope(split_heads(k, cfg.num_kv_heads, cfg.head_dim), pos, cfg.rope_theta, cfg.rotary_dim, cfg.rope_style)
    return q, k, split_heads(v, cfg.num_kv_heads, cfg.head_dim)


def moe_mlp(w: dict, p: str, h: np.ndarray, top_k: int, norm_topk: bool) -> np.ndarray:
    """A mixture-of-experts MLP (Mixtral's and Qwen's sparse blocks), token by token: a
    softmax router, the top_k experts (ties: the lower index), their SwiGLU outputs
    weighted by the router's probabilities (renormalised over the top_k with norm_topk)."""
    gate_inp = w[p + "ffn_gate_inp.weight"]                          # [n_expert, n_embd]
    gates, ups, downs = (w[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        logits = gate_inp @ h[t]
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        chosen = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[:top_k]
        weights = probs[chosen] / (probs[chosen].sum() if norm_topk else 1.0)
        for e, wt in zip(chosen, weights):
            out[t] += wt * (downs[e] @ (silu(gates[e] @ h[t]) * (ups[e] @ h[t])))
    return out
