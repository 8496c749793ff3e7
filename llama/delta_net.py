"""The gated delta-net layer of hybrid models (Qwen3.5, Qwen3.6, Qwen3-Next), as llama.cpp's
src/models/delta-net-base.cpp and the linear-attention half of src/models/qwen35.cpp.

A layer projects the normed input to the mixed Q/K/V channels, runs them through a short
causal convolution whose last d_conv - 1 inputs per sequence are kept between ubatches
(`cache_r_l{il}`), L2-normalises Q and K per head, and updates each head's state matrix
(`cache_s_l{il}`) with the gated delta rule in one `gated_delta_net` node; the output is
RMS-normed, gated by silu(z) and projected back. The states are read from the rows the
memory gives (`inp_rs_src`) and written to others (`inp_rs_dst`): see llama/recurrent.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np

from ggmlpy.ir import GGMLType, Tensor
from llama.graph import LlmGraph, NormType, RSInput
from llama.hparams import HParams, HParamsError, MetadataReader
from llama.weights import TensorTable


def load_ssm_hparams(r: MetadataReader, hp: HParams) -> None:
    """The `ssm.*` keys and which layers are recurrent: `attention.recurrent_layers` (one
    flag per layer), else all but every `full_attention_interval`-th (default 4)."""
    for attr, key in (("ssm_d_conv", "ssm.conv_kernel"), ("ssm_d_inner", "ssm.inner_size"),
                      ("ssm_d_state", "ssm.state_size"), ("ssm_dt_rank", "ssm.time_step_rank"),
                      ("ssm_n_group", "ssm.group_count")):
        value = r.int(key, required=True)
        if value <= 0:
            raise HParamsError(f"{r.key(key)} must be positive, got {value}")
        setattr(hp, attr, value)
    if hp.ssm_dt_rank % hp.ssm_n_group:
        raise HParamsError(f"{r.key('ssm.time_step_rank')} {hp.ssm_dt_rank} (value heads) is not a multiple of "
                           f"{r.key('ssm.group_count')} {hp.ssm_n_group} (key heads)")
    if hp.ssm_d_inner != hp.ssm_d_state * hp.ssm_dt_rank:
        raise HParamsError(f"{r.key('ssm.inner_size')} {hp.ssm_d_inner} is not {r.key('ssm.state_size')} "
                           f"{hp.ssm_d_state} x {r.key('ssm.time_step_rank')} {hp.ssm_dt_rank}")
    flags = r.get("attention.recurrent_layers")
    if flags is not None:
        flags = [bool(x) for x in np.asarray(flags).reshape(-1)]
        if len(flags) < hp.n_layer:
            raise HParamsError(f"{r.key('attention.recurrent_layers')} has {len(flags)} entries "
                               f"for {hp.n_layer} layers")
        hp.recurrent_layers = flags[:hp.n_layer]
    else:
        interval = r.int("full_attention_interval", 4)
        if interval <= 0:
            raise HParamsError(f"{r.key('full_attention_interval')} must be positive, got {interval}")
        hp.recurrent_layers = [(il + 1) % interval != 0 for il in range(hp.n_layer)]


def add_linear_attention(t: TensorTable, hp: HParams, il: int) -> None:
    """A gated delta-net layer's tensors (llama.cpp's qwen35 load_block_trunk)."""
    key_dim = hp.ssm_d_state * hp.ssm_n_group
    value_dim = hp.ssm_d_state * hp.ssm_dt_rank
    conv_dim = 2 * key_dim + value_dim
    t.add_layer(il, "wqkv", "attn_qkv.weight", (hp.n_embd, conv_dim))
    t.add_layer(il, "wqkv_gate", "attn_gate.weight", (hp.n_embd, value_dim))
    t.add_layer(il, "ssm_conv1d", "ssm_conv1d.weight", (hp.ssm_d_conv, conv_dim))
    t.add_layer(il, "ssm_dt", "ssm_dt.bias", (hp.ssm_dt_rank,))
    t.add_layer(il, "ssm_a", "ssm_a", (hp.ssm_dt_rank,))
    t.add_layer(il, "ssm_beta", "ssm_beta.weight", (hp.n_embd, hp.ssm_dt_rank))
    t.add_layer(il, "ssm_alpha", "ssm_alpha.weight", (hp.n_embd, hp.ssm_dt_rank))
    t.add_layer(il, "ssm_norm", "ssm_norm.weight", (hp.ssm_d_state,))
    t.add_layer(il, "ssm_out", "ssm_out.weight", (value_dim, hp.n_embd))


def build_gdn_l2_norm(g: LlmGraph, x: Tensor, eps: float) -> Tensor:
    """x / sqrt(sum x^2 + eps) per row, written as llama.cpp writes it: an RMS norm with
    eps / n, scaled by 1 / sqrt(n)."""
    n = x.ne[0]
    return g.b.scale(g.b.rms_norm(x, eps / n), 1.0 / math.sqrt(n))


def build_rs(g: LlmGraph, name: str, n_embd: int, rs: RSInput) -> tuple[Tensor, Tensor]:
    """The layer's state buffer and its rows for the ubatch's sequences [n_embd, n_seqs]."""
    cache = g.b.cache(name, GGMLType.F32, (n_embd, g.kv.rs_rows))
    return cache, g.b.get_rows(cache, rs.src)


def store_rs(g: LlmGraph, cache: Tensor, rows: Tensor, rs: RSInput, il: int, name: str) -> None:
    """Write the new states (rows [n_embd, n_seqs]) to the rows for the next ubatch."""
    g.side_effects.append(g.cb(g.b.set_rows(cache, rows, rs.dst), name, il))


def build_conv_state(g: LlmGraph, qkv_mixed: Tensor, d_conv: int, conv_dim: int, rs: RSInput,
                     il: int) -> Tensor:
    """The convolution's input [d_conv - 1 + n_seq_tokens, conv_dim, n_seqs]: each
    sequence's kept inputs then its new ones (qkv_mixed [conv_dim, n_seq_tokens, n_seqs]);
    its last d_conv - 1 columns are stored for the next ubatch."""
    b = g.b
    hp = g.hp
    n_seq_tokens, n_seqs = g.rs_dims()
    cache, states = build_rs(g, f"cache_r_l{il}", hp.n_embd_r, rs)
    states = b.reshape(states, d_conv - 1, conv_dim, n_seqs)
    conv_input = g.cb(b.concat(states, b.transpose(qkv_mixed), 0), "conv_input", il)
    last = b.view(conv_input, (d_conv - 1, conv_dim, n_seqs), (conv_input.nb[1], conv_input.nb[2]),
                  conv_input.nb[0] * n_seq_tokens)
    store_rs(g, cache, b.cont(last, hp.n_embd_r, n_seqs), rs, il, "conv_state_stored")
    return conv_input


@dataclass
class Projections:
    """A delta-net layer's input projections: the mixed Q/K/V channels [conv_dim,
    n_tokens] (all Q heads, all K heads, all V heads), the output gate z [value_dim,
    n_tokens], and beta's and alpha's pre-activations [n_v_heads, n_tokens] (value heads in
    order)."""

    qkv_mixed: Tensor
    z: Tensor
    beta: Tensor
    alpha: Tensor


def project_qwen35(g: LlmGraph, layer: SimpleNamespace, cur: Tensor, il: int) -> Projections:
    """attn_qkv, attn_gate, ssm_beta and ssm_alpha, each its own product."""
    return Projections(g.cb(g.build_lora_mm(layer.wqkv, cur), "linear_attn_qkv_mixed", il),
                       g.cb(g.build_lora_mm(layer.wqkv_gate, cur), "z", il),
                       g.build_lora_mm(layer.ssm_beta, cur), g.build_lora_mm(layer.ssm_alpha, cur))


def build_layer_attn_linear(g: LlmGraph, layer: SimpleNamespace, cur: Tensor, rs: RSInput, il: int,
                            project: Callable[..., Projections] = project_qwen35,
                            interleave_heads: bool = False) -> Tensor:
    """A gated delta-net layer on the normed input cur [n_embd, n_tokens]; returns its
    projected output [n_embd, n_tokens] (before the residual add). With more value heads
    than key heads, value head h reads key head h % n_k (Qwen3.5: the op's own broadcast) or,
    with `interleave_heads`, h // (n_v / n_k) (Qwen3-Next: Q and K repeated first)."""
    b, hp = g.b, g.hp
    n_seq_tokens, n_seqs = g.rs_dims()
    head_k, head_v = hp.ssm_d_state, hp.ssm_d_inner // hp.ssm_dt_rank
    n_k_heads, n_v_heads = hp.ssm_n_group, hp.ssm_dt_rank
    conv_dim = 2 * head_k * n_k_heads + head_v * n_v_heads

    proj = project(g, layer, cur, il)
    qkv_mixed = b.reshape(proj.qkv_mixed, conv_dim, n_seq_tokens, n_seqs)
    beta = g.cb(b.sigmoid(b.reshape(proj.beta, 1, n_v_heads, n_seq_tokens, n_seqs)), "beta_sigmoid", il)
    alpha = b.reshape(proj.alpha, n_v_heads, n_seq_tokens, n_seqs)
    alpha = g.cb(b.softplus(b.add(alpha, g.w(layer.ssm_dt))), "a_softplus", il)
    gate = g.cb(b.mul(alpha, g.w(layer.ssm_a)), "gate", il)          # -exp(A_log) * softplus
    gate = b.reshape(gate, 1, n_v_heads, n_seq_tokens, n_seqs)

    conv_input = build_conv_state(g, qkv_mixed, hp.ssm_d_conv, conv_dim, rs, il)
    s_cache, state = build_rs(g, f"cache_s_l{il}", hp.n_embd_s, rs)
    state = b.reshape(state, head_v, head_v, n_v_heads, n_seqs)
    conv = g.cb(b.silu(b.ssm_conv(conv_input, g.w(layer.ssm_conv1d))), "conv_output_silu", il)

    esz, row = conv.nb[0], conv.nb[1]
    q = b.view(conv, (head_k, n_k_heads, n_seq_tokens, n_seqs), (esz * head_k, row, conv.nb[2]), 0)
    k = b.view(conv, (head_k, n_k_heads, n_seq_tokens, n_seqs), (esz * head_k, row, conv.nb[2]),
               esz * head_k * n_k_heads)
    v = b.view(conv, (head_v, n_v_heads, n_seq_tokens, n_seqs), (esz * head_v, row, conv.nb[2]),
               esz * 2 * head_k * n_k_heads)
    q = build_gdn_l2_norm(g, q, hp.f_norm_rms_eps)
    k = build_gdn_l2_norm(g, k, hp.f_norm_rms_eps)
    if interleave_heads and n_v_heads != n_k_heads:
        q, k = repeat_interleave_heads(g, q, n_v_heads), repeat_interleave_heads(g, k, n_v_heads)

    out, new_state = build_delta_net(g, q, k, v, gate, beta, state, il)
    store_rs(g, s_cache, b.reshape(new_state, hp.n_embd_s, n_seqs), rs, il, "ssm_state_stored")

    z = b.reshape(proj.z, head_v, n_v_heads, n_seq_tokens, n_seqs)
    normed = g.build_norm(out, layer.ssm_norm, None, NormType.RMS, il)
    cur = g.cb(b.mul(normed, b.silu(z)), "attn_out_norm", il)
    cur = b.reshape(cur, head_v * n_v_heads, n_seq_tokens * n_seqs)
    return g.cb(g.build_lora_mm(layer.ssm_out, cur), "linear_attn_out", il)


def repeat_interleave_heads(g: LlmGraph, t: Tensor, n_heads: int) -> Tensor:
    """t [d, n_k, n_seq_tokens, n_seqs] as [d, n_heads, ...] where head h is t's head
    h // (n_heads / n_k) (llama.cpp's ggml_repeat_4d over a size-1 axis), by joining r
    copies along that axis."""
    b = g.b
    d, n_k, n_seq_tokens, n_seqs = t.ne
    r = n_heads // n_k
    one = b.reshape(t, d, 1, n_k, n_seq_tokens * n_seqs)
    rep = one
    for _ in range(r - 1):
        rep = b.concat(rep, one, 1)
    return b.reshape(rep, d, n_heads, n_seq_tokens, n_seqs)


def build_delta_net(g: LlmGraph, q: Tensor, k: Tensor, v: Tensor, gate: Tensor, beta: Tensor, state: Tensor,
                    il: int) -> tuple[Tensor, Tensor]:
    """The fused recurrence (llama.cpp's build_delta_net_fused): the output [S_v, H_v,
    n_seq_tokens, n_seqs] and the final state [S_v, S_v, H_v, n_seqs], both views of the
    one result."""
    b = g.b
    s_v, h_v, n_seq_tokens, n_seqs = v.ne
    result = g.cb(b.gated_delta_net(q, k, v, gate, beta, state), "gdn_result", il)
    esz = result.nb[0]
    out = b.view(result, (s_v, h_v, n_seq_tokens, n_seqs),
                 (esz * s_v, esz * s_v * h_v, esz * s_v * h_v * n_seq_tokens), 0)
    new_state = b.view(result, (s_v, s_v, h_v, n_seqs), (esz * s_v, esz * s_v * s_v, esz * s_v * s_v * h_v),
                       esz * s_v * h_v * n_seq_tokens * n_seqs)
    return out, new_state
