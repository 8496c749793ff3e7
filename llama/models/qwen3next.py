"""Qwen3-Next (Qwen3-Next-80B-A3B): Qwen3.5's predecessor. The same hybrid layer loop
(llama/models/qwen35.py's build_hybrid) and the same experts with a gated shared expert
(qwen35moe.py), with three differences:

- the gated attention rotates Q and K with plain NeoX RoPE (one position per token);
- beta and alpha come from one product, `ssm_ba`, whose rows hold per key head its value
  heads' betas then their alphas; files from older converters also fuse Q, K, V and z into
  one product, `ssm_in`, per key head [q | k | v | z];
- with more value heads than key heads, value head h reads key head h // (n_v / n_k).

Mirrors llama.cpp's src/models/qwen3next.cpp.
"""
from __future__ import annotations

from types import SimpleNamespace

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.delta_net import Projections, build_layer_attn_linear, load_ssm_hparams
from llama.graph import LlmGraph
from llama.hparams import HParams, HParamsError, MetadataReader, load_experts, require_rms_eps
from llama.models import qwen35, qwen35moe
from llama.weights import TensorLoadError, TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)
    qwen35.load_nextn(r, hp)
    load_ssm_hparams(r, hp)
    if hp.n_embd_head_k != hp.n_embd_head_v:
        raise HParamsError(f"{hp.arch}: key_length {hp.n_embd_head_k} and value_length {hp.n_embd_head_v} differ")
    load_experts(r, hp)
    if not hp.n_ff_exp:
        hp.n_ff_exp = hp.n_ff[0] // hp.n_expert_used
    hp.extra["n_ff_shexp"] = r.int("expert_shared_feed_forward_length", 0) or hp.n_ff[0]


def add_linear_attention(t: TensorTable, hp: HParams, il: int) -> None:
    key_dim = hp.ssm_d_state * hp.ssm_n_group
    value_dim = hp.ssm_d_state * hp.ssm_dt_rank
    conv_dim = 2 * key_dim + value_dim
    t.add_layer(il, "ssm_in", "ssm_in.weight", (hp.n_embd, conv_dim + value_dim), optional=True)
    t.add_layer(il, "wqkv", "attn_qkv.weight", (hp.n_embd, conv_dim), optional=True)
    t.add_layer(il, "wqkv_gate", "attn_gate.weight", (hp.n_embd, value_dim), optional=True)
    t.add_layer(il, "ssm_conv1d", "ssm_conv1d.weight", (hp.ssm_d_conv, conv_dim))
    t.add_layer(il, "ssm_dt", "ssm_dt.bias", (hp.ssm_dt_rank,))
    t.add_layer(il, "ssm_a", "ssm_a", (hp.ssm_dt_rank,))
    t.add_layer(il, "ssm_beta_alpha", "ssm_ba.weight", (hp.n_embd, 2 * hp.ssm_dt_rank))
    t.add_layer(il, "ssm_norm", "ssm_norm.weight", (hp.ssm_d_state,))
    t.add_layer(il, "ssm_out", "ssm_out.weight", (value_dim, hp.n_embd))


def tensors(hp: HParams, t: TensorTable) -> None:
    qwen35.add_trunk(t, hp, add_linear=add_linear_attention)
    qwen35moe.add_shared_expert_moe(t, hp)


def project(g: LlmGraph, layer: SimpleNamespace, cur: Tensor, il: int) -> Projections:
    """Q/K/V and z from attn_qkv and attn_gate, or from the legacy ssm_in; beta and alpha
    from ssm_ba (llama.cpp's build_qkvz and the split of mixed_ba)."""
    b, hp = g.b, g.hp
    n_tokens = cur.ne[1]
    n_k, n_v = hp.ssm_n_group, hp.ssm_dt_rank
    r = n_v // n_k
    if layer.wqkv is not None and layer.wqkv_gate is not None:
        qkv = g.cb(g.build_lora_mm(layer.wqkv, cur), "linear_attn_qkv_mixed", il)
        z = g.cb(g.build_lora_mm(layer.wqkv_gate, cur), "z", il)
    elif layer.ssm_in is not None:
        qkv, z = _split_qkvz(g, g.cb(g.build_lora_mm(layer.ssm_in, cur), "mixed_qkvz", il), il)
    else:
        raise TensorLoadError(f"{hp.arch} layer {il}: the file has neither blk.{il}.attn_qkv.weight and "
                              f"blk.{il}.attn_gate.weight nor blk.{il}.ssm_in.weight")
    ba = b.reshape(g.build_lora_mm(layer.ssm_beta_alpha, cur), 2 * r, n_k, n_tokens)
    esz = ba.nb[0]
    beta = b.cont(b.view(ba, (r, n_k, n_tokens), (ba.nb[1], ba.nb[2]), 0), n_v, n_tokens)
    alpha = b.cont(b.view(ba, (r, n_k, n_tokens), (ba.nb[1], ba.nb[2]), esz * r), n_v, n_tokens)
    return Projections(qkv, z, beta, alpha)


def _split_qkvz(g: LlmGraph, mixed: Tensor, il: int) -> tuple[Tensor, Tensor]:
    """ssm_in's rows [q | k | v | z] per key head, as [all q | all k | all v] and z."""
    b, hp = g.b, g.hp
    n_tokens = mixed.ne[1]
    head_k, n_k = hp.ssm_d_state, hp.ssm_n_group
    vz = hp.ssm_d_inner // n_k                      # one key head's value (and z) channels
    per_head = 2 * head_k + 2 * vz
    m = b.reshape(mixed, per_head, n_k, n_tokens)
    esz = m.nb[0]

    def part(width: int, offset: int) -> Tensor:
        return b.cont(b.view(m, (width, n_k, n_tokens), (m.nb[1], m.nb[2]), esz * offset), width * n_k, n_tokens)

    q, k = part(head_k, 0), part(head_k, head_k)
    v, z = part(vz, 2 * head_k), part(vz, 2 * head_k + vz)
    return b.concat(b.concat(q, k, 0), v, 0), z


def build_layer_attn(g: LlmGraph, layer: SimpleNamespace, cur: Tensor, attn, pos: Tensor, il: int) -> Tensor:
    return qwen35.build_layer_attn(g, layer, cur, attn, pos, il, rope=lambda t: g.b.rope_ext(
        t, pos, None, **g.hp.rope_args(il)))


def build(g: LlmGraph) -> Tensor:
    return qwen35.build_hybrid(
        g, lambda layer, x, il: qwen35moe.build_shared_expert_moe(g, layer, x, il),
        linear=lambda layer, cur, rs, il: build_layer_attn_linear(g, layer, cur, rs, il, project=project,
                                                                  interleave_heads=True),
        attention=build_layer_attn)


register(Architecture("qwen3next", load_hparams, tensors, build))
