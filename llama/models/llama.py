"""LLaMA (and SmolLM, Mistral without a window): RMSNorm, GQA attention with RoPE, SwiGLU.

Mirrors llama.cpp's src/models/llama.cpp and the LLM_ARCH_LLAMA case of load_tensors.
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NORM
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.hparams import HParams, MetadataReader
from llama.weights import Need, TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NORM
    if not hp.f_norm_rms_eps:
        hp.f_norm_rms_eps = 1e-5


def tensors(hp: HParams, t: TensorTable) -> None:
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    t.add("tok_embd", "token_embd.weight", (n_embd, n_vocab))
    t.add("output_norm", "output_norm.weight", (n_embd,))
    t.add("output", "output.weight", (n_embd, n_vocab), optional=True)  # absent: tied embeddings
    t.add("rope_freqs", "rope_freqs.weight", (hp.n_rot // 2,), optional=True)
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_attention(il, hp, qkv_bias=Need.OPTIONAL, out_bias=Need.OPTIONAL)
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
        t.add_gated_ffn(il, n_embd, hp.n_ff[il])


def build(g: LlmGraph) -> Tensor:
    b, hp, m = g.b, g.hp, g.model
    inp_l = g.build_inp_embd(m.w.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()
    kq_scale = g.default_kq_scale(hp)
    rope = hp.rope_args()
    rope_freqs = g.w(m.w.rope_freqs)

    for il, layer in enumerate(m.layers):
        inp_sa = inp_l
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        q, k, v = g.build_qkv_rope(layer, cur, inp_pos, rope, il, rope_freqs)
        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, kq_scale, il)
        cur, inp_sa = g.select_out_rows(cur, inp_sa, inp_out_ids, il)
        ffn_inp = g.cb(b.add(cur, inp_sa), "ffn_inp", il)

        cur = g.cb(g.build_norm(ffn_inp, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, FfnOp.SILU, il)
        inp_l = g.cb(b.add(cur, ffn_inp), "l_out", il)

    cur = g.cb(g.build_norm(inp_l, m.w.output_norm, None, NormType.RMS), "result_norm")
    return g.build_lora_mm(m.w.output or m.w.tok_embd, cur)


register(Architecture("llama", load_hparams, tensors, build))
