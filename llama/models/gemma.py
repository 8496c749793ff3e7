"""Gemma (1): the LLaMA block with GELU, Gemma's embedding scale and tied embeddings.

Mirrors llama.cpp's src/models/gemma.cpp and the LLM_ARCH_GEMMA cases of load_hparams and
load_tensors:
- token embeddings are multiplied by sqrt(n_embd) (embeddings given as input are not);
- RMSNorm multiplies by (1 + w): the converter stores 1 + w, so the weights are used as
  they are;
- NeoX RoPE; the head size comes from `gemma.attention.key_length` (Gemma 7B: 16 heads of
  256 in a 3072-wide model); Q is scaled by 1/sqrt(head_dim) and attention uses scale 1;
- the FFN is GELU(tanh)-gated; the output projection is always the token embedding.
"""
from __future__ import annotations

import math

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.hparams import HParams, MetadataReader, require_rms_eps
from llama.weights import TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)


def tensors(hp: HParams, t: TensorTable) -> None:
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    t.add("tok_embd", "token_embd.weight", (n_embd, n_vocab))  # also the output projection
    t.add("output_norm", "output_norm.weight", (n_embd,))
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_attention(il, hp)
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
        t.add_gated_ffn(il, n_embd, hp.n_ff[il])


def build(g: LlmGraph) -> Tensor:
    b, hp, m = g.b, g.hp, g.model
    inp_l = g.build_inp_embd(m.w.tok_embd)
    if not g.params.use_embd:  # raw embeddings (e.g. of images) are used as they are
        inp_l = g.cb(b.scale(inp_l, math.sqrt(hp.n_embd)), "inp_scaled")
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()
    rope = hp.rope_args()

    for il, layer in enumerate(m.layers):
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        q, k, v = g.build_qkv_rope(layer, cur, inp_pos, rope, il)
        q = g.cb(b.scale(q, 1.0 / math.sqrt(hp.n_embd_head_k)), "Qcur_scaled", il)

        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0, il)
        cur, inp_l = g.select_out_rows(cur, inp_l, inp_out_ids, il)
        sa_out = g.cb(b.add(cur, inp_l), "sa_out", il)

        cur = g.cb(g.build_norm(sa_out, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, FfnOp.GELU, il)
        inp_l = g.cb(b.add(cur, sa_out), "l_out", il)

    cur = g.cb(g.build_norm(inp_l, m.w.output_norm, None, NormType.RMS), "result_norm")
    return g.build_lora_mm(m.w.tok_embd, cur)


register(Architecture("gemma", load_hparams, tensors, build))
