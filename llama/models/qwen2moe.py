"""Qwen 2 MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen 2's attention (NeoX RoPE, q/k/v
biases where the file has them) and in every layer a mixture of experts beside a shared
expert: a softmax router picks `expert_used_count` experts whose weights are not
renormalised, and a gated FFN every token runs, scaled by a sigmoid of its own gate
(`ffn_gate_inp_shexp`), is added to their sum.

Mirrors llama.cpp's src/models/qwen2moe.cpp, down to the shared gate's sigmoid written as
silu(x) / x.
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.hparams import HParams, MetadataReader, load_experts, require_rms_eps
from llama.models.decoder_tensors import add_embd_output
from llama.moe import build_moe_ffn
from llama.weights import Need, TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)
    load_experts(r, hp)
    if not hp.n_ff_exp:
        hp.n_ff_exp = hp.n_ff[0] // hp.n_expert_used
    hp.extra["n_ff_shexp"] = r.int("expert_shared_feed_forward_length", 0) or hp.n_ff[0]


def tensors(hp: HParams, t: TensorTable) -> None:
    add_embd_output(hp, t, output=False)
    t.add("output", "output.weight", (hp.n_embd, hp.n_vocab))
    n_ff_shexp = hp.extra["n_ff_shexp"]
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (hp.n_embd,))
        t.add_attention(il, hp, qkv_bias=Need.OPTIONAL)
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (hp.n_embd,))
        t.add_moe_ffn(il, hp.n_embd, hp.n_ff_exp, hp.n_expert)
        t.add_layer(il, "ffn_gate_inp_shexp", "ffn_gate_inp_shexp.weight", (hp.n_embd,))
        t.add_shared_experts(il, hp.n_embd, n_ff_shexp)


def build(g: LlmGraph) -> Tensor:
    b = g.b

    def ffn(layer, ffn_inp: Tensor, il: int) -> Tensor:
        cur = g.cb(g.build_norm(ffn_inp, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
        moe_out = build_moe_ffn(g, cur, layer, FfnOp.SILU, False, il)
        gate_inp = g.cb(g.build_lora_mm(layer.ffn_gate_inp_shexp, cur), "ffn_shexp_gate_inp", il)
        gate = g.cb(b.div(b.silu(gate_inp), gate_inp), "ffn_shexp_gate", il)   # sigmoid
        shared = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp, None,
                             FfnOp.SILU, il)
        shared = g.cb(b.mul(shared, gate), "ffn_shexp_out", il)
        cur = g.cb(b.add(moe_out, shared), "ffn_out", il)
        return g.cb(b.add(cur, ffn_inp), "l_out", il)

    return g.build_decoder(ffn)


register(Architecture("qwen2moe", load_hparams, tensors, build))
