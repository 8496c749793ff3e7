"""LLaMA (and SmolLM, Mistral without a window): RMSNorm, GQA attention with RoPE, SwiGLU;
Mixtral: the same with a mixture of experts in every layer (`llama.expert_count`), its
experts feed_forward_length wide.

Mirrors llama.cpp's src/models/llama.cpp and the LLM_ARCH_LLAMA case of load_tensors.
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NORM
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph
from llama.hparams import HParams, MetadataReader, load_experts
from llama.models.decoder_tensors import add_decoder_layer, add_embd_output
from llama.moe import build_moe_block
from llama.weights import Need, TensorTable, WeightRef


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NORM
    if not hp.f_norm_rms_eps:
        hp.f_norm_rms_eps = 1e-5
    if r.int("expert_count", 0):   # Mixtral
        load_experts(r, hp)
        hp.n_ff_exp = hp.n_ff[0]


def tensors(hp: HParams, t: TensorTable) -> None:
    add_embd_output(hp, t)
    t.add("rope_freqs", "rope_freqs.weight", (hp.n_rot // 2,), optional=True)
    for il in range(hp.n_layer):
        if not hp.n_expert:
            add_decoder_layer(hp, t, il, qkv_bias=Need.OPTIONAL, out_bias=Need.OPTIONAL)
            continue
        t.add_layer(il, "attn_norm", "attn_norm.weight", (hp.n_embd,))
        t.add_attention(il, hp, qkv_bias=Need.OPTIONAL, out_bias=Need.OPTIONAL)
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (hp.n_embd,))
        t.add_moe_ffn(il, hp.n_embd, hp.n_ff[il], hp.n_expert, gate=Need.OPTIONAL)


def build_llama(g: LlmGraph, rope_freqs: WeightRef | None, output_b: WeightRef | None) -> Tensor:
    """LLaMA's graph, with the frequency factors `rope_freqs` and the logits' bias
    `output_b` where given. Qwen 2 and 3 build this graph too: their q/k/v biases and q/k
    norms are tensors of the layer, which build_qkv_rope uses where the layer has them."""
    hp, m = g.hp, g.model
    inp_l = g.build_inp_embd(m.w.tok_embd)
    inp = g.build_layer_inputs()
    kq_scale = g.default_kq_scale(hp)
    rope = hp.rope_args()
    freqs = g.w(rope_freqs)

    for il, layer in enumerate(m.layers):
        ffn_inp = g.build_attn_block(inp, layer, inp_l, rope, kq_scale, il, freqs)
        if hp.n_expert:   # Mixtral
            inp_l = build_moe_block(g, layer, ffn_inp, FfnOp.SILU, True, il)
        else:
            inp_l = g.build_ffn_block(layer, ffn_inp, FfnOp.SILU, il)

    return g.build_output(inp_l, m.w.output_norm, m.w.output or m.w.tok_embd, output_b)


def build(g: LlmGraph) -> Tensor:
    return build_llama(g, g.model.w.rope_freqs, None)


register(Architecture("llama", load_hparams, tensors, build))
