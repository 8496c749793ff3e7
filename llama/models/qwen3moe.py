"""Qwen 3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen 3's attention (per-head RMS norms on Q
and K, NeoX RoPE, no biases) and a mixture-of-experts FFN in every layer: a softmax router,
the top `expert_used_count` experts' SwiGLU FFNs, their weights normalised to sum 1.

Mirrors llama.cpp's src/models/qwen3moe.cpp. An expert's width is
`qwen3moe.expert_feed_forward_length` (else feed_forward_length / expert_used_count).
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph
from llama.hparams import HParams, MetadataReader, load_experts
from llama.models import qwen3
from llama.models.decoder_tensors import add_embd_output
from llama.moe import build_moe_block
from llama.weights import Need, TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    qwen3.load_hparams(r, hp)
    load_experts(r, hp)
    if not hp.n_ff_exp:
        hp.n_ff_exp = hp.n_ff[0] // hp.n_expert_used


def tensors(hp: HParams, t: TensorTable) -> None:
    add_embd_output(hp, t)
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (hp.n_embd,))
        t.add_attention(il, hp, qk_norm=Need.REQUIRED)
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (hp.n_embd,))
        t.add_moe_ffn(il, hp.n_embd, hp.n_ff_exp, hp.n_expert)


def build(g: LlmGraph) -> Tensor:
    return g.build_decoder(lambda layer, x, il: build_moe_block(g, layer, x, FfnOp.SILU, True, il))


register(Architecture("qwen3moe", load_hparams, tensors, build))
