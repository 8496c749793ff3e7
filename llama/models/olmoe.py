"""OLMoE (OLMoE-1B-7B): LLaMA's layer with RMS norms over Q's and K's whole rows (not per
head) before NeoX RoPE, and a mixture of experts in every layer: a softmax router picks
`expert_used_count` of `expert_count` SwiGLU experts, whose weights are not renormalised.

Mirrors llama.cpp's src/models/olmoe.cpp. An expert's width is `olmoe.feed_forward_length`
(the experts' tensors carry it; llama.cpp reads n_ff for them).
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph
from llama.hparams import HParams, MetadataReader, load_experts, require_rms_eps
from llama.models.decoder_tensors import add_embd_output
from llama.moe import build_moe_block
from llama.weights import Need, TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)
    load_experts(r, hp)
    hp.n_ff_exp = hp.n_ff[0]


def tensors(hp: HParams, t: TensorTable) -> None:
    add_embd_output(hp, t, output=False)
    t.add("output", "output.weight", (hp.n_embd, hp.n_vocab))
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (hp.n_embd,))
        t.add_attention(il, hp, qk_norm=Need.REQUIRED, qk_norm_rows=True)
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (hp.n_embd,))
        t.add_moe_ffn(il, hp.n_embd, hp.n_ff_exp, hp.n_expert)


def build(g: LlmGraph) -> Tensor:
    return g.build_decoder(lambda layer, x, il: build_moe_block(g, layer, x, FfnOp.SILU, False, il))


register(Architecture("olmoe", load_hparams, tensors, build))
