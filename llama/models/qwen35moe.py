"""Qwen3.5 / Qwen3.6 MoE (Qwen3.5-35B-A3B, Qwen3.6-A3B): Qwen3.5's hybrid layers
(llama/models/qwen35.py) with a mixture of experts in every FFN: a softmax router picks
`expert_used_count` experts whose weights are renormalised, and a shared SwiGLU expert,
scaled by the sigmoid of its own one-column gate (`ffn_gate_inp_shexp`), is added.

Mirrors llama.cpp's src/models/qwen35moe.cpp. The shared expert's width is
`expert_shared_feed_forward_length` (else feed_forward_length).
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph
from llama.hparams import HParams, MetadataReader, load_experts
from llama.models import qwen35
from llama.moe import build_moe_ffn
from llama.weights import TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    qwen35.load_hparams(r, hp)
    load_experts(r, hp)
    if not hp.n_ff_exp:
        hp.n_ff_exp = hp.n_ff[0] // hp.n_expert_used
    hp.extra["n_ff_shexp"] = r.int("expert_shared_feed_forward_length", 0) or hp.n_ff[0]


def tensors(hp: HParams, t: TensorTable) -> None:
    qwen35.add_trunk(t, hp)
    add_shared_expert_moe(t, hp)


def add_shared_expert_moe(t: TensorTable, hp: HParams) -> None:
    """Every layer's router, experts and gated shared expert (also Qwen3-Next's)."""
    n_embd, n_ff_shexp = hp.n_embd, hp.extra["n_ff_shexp"]
    for il in range(hp.n_layer):
        t.add_moe_ffn(il, n_embd, hp.n_ff_exp, hp.n_expert)
        t.add_layer(il, "ffn_gate_inp_shexp", "ffn_gate_inp_shexp.weight", (n_embd,))
        t.add_shared_experts(il, n_embd, n_ff_shexp)


def build_shared_expert_moe(g: LlmGraph, layer, cur: Tensor, il: int) -> Tensor:
    """The experts' renormalised sum plus sigmoid(gate) times the shared expert."""
    b = g.b
    moe_out = g.cb(build_moe_ffn(g, cur, layer, FfnOp.SILU, True, il), "ffn_moe_out", il)
    shared = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None, layer.ffn_down_shexp, None,
                         FfnOp.SILU, il)
    gate = g.cb(b.sigmoid(g.build_lora_mm(layer.ffn_gate_inp_shexp, cur)), "shared_expert_gate_sigmoid", il)
    shared = g.cb(b.mul(shared, gate), "ffn_shexp_gated", il)
    return g.cb(b.add(moe_out, shared), "ffn_out", il)


def build(g: LlmGraph) -> Tensor:
    return qwen35.build_hybrid(g, lambda layer, x, il: build_shared_expert_moe(g, layer, x, il))


register(Architecture("qwen35moe", load_hparams, tensors, build))
