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
from llama.arch import Architecture, register
from llama.graph import LlmGraph
from llama.hparams import HParams, HParamsError, MetadataReader
from llama.weights import TensorTable

ROPE_TYPE_NEOX = 2


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    if not hp.f_norm_rms_eps:
        raise HParamsError(f"required key {r.key('attention.layer_norm_rms_epsilon')} is missing")


def tensors(hp: HParams, t: TensorTable) -> None:
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    t.add("tok_embd", "token_embd.weight", (n_embd, n_vocab))  # also the output projection
    t.add("output_norm", "output_norm.weight", (n_embd,))
    for il in range(hp.n_layer):
        n_q, n_k, n_v = hp.n_embd_head_k * hp.n_head[il], hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_layer(il, "wq", "attn_q.weight", (n_embd, n_q))
        t.add_layer(il, "wk", "attn_k.weight", (n_embd, n_k))
        t.add_layer(il, "wv", "attn_v.weight", (n_embd, n_v))
        t.add_layer(il, "wo", "attn_output.weight", (hp.n_embd_head_v * hp.n_head[il], n_embd))
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
        t.add_gated_ffn(il, n_embd, hp.n_ff[il])


def build(g: LlmGraph) -> Tensor:
    b, hp, m = g.b, g.hp, g.model
    head = hp.n_embd_head_k
    inp_l = g.build_inp_embd(m.w.tok_embd)
    if not g.params.use_embd:  # raw embeddings (e.g. of images) are used as they are
        inp_l = g.cb(b.scale(inp_l, math.sqrt(hp.n_embd)), "inp_scaled")
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()
    rope = hp.rope_args()

    for il, layer in enumerate(m.layers):
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, "rms", il), "attn_norm", il)

        q = g.cb(g.build_lora_mm(layer.wq, cur), "Qcur", il)
        k = g.cb(g.build_lora_mm(layer.wk, cur), "Kcur", il)
        v = g.cb(g.build_lora_mm(layer.wv, cur), "Vcur", il)
        n_tokens = q.ne[1]
        q = b.reshape(q, head, hp.n_head[il], n_tokens)
        k = b.reshape(k, head, hp.n_head_kv[il], n_tokens)
        v = b.reshape(v, hp.n_embd_head_v, hp.n_head_kv[il], n_tokens)
        q = g.cb(b.rope_ext(q, inp_pos, None, **rope), "Qcur_rope", il)
        k = g.cb(b.rope_ext(k, inp_pos, None, **rope), "Kcur_rope", il)
        q = g.cb(b.scale(q, 1.0 / math.sqrt(head)), "Qcur_scaled", il)

        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0, il)
        if il == hp.n_layer - 1 and inp_out_ids is not None:
            cur = b.get_rows(cur, inp_out_ids)
            inp_l = b.get_rows(inp_l, inp_out_ids)
        sa_out = g.cb(b.add(cur, inp_l), "sa_out", il)

        cur = g.cb(g.build_norm(sa_out, layer.ffn_norm, None, "rms", il), "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, "gelu", il)
        inp_l = g.cb(b.add(cur, sa_out), "l_out", il)

    cur = g.cb(g.build_norm(inp_l, m.w.output_norm, None, "rms"), "result_norm")
    return b.mul_mat(g.w(m.w.tok_embd), cur)


register(Architecture("gemma", load_hparams, tensors, build))
