"""LLaMA (and SmolLM, Mistral without a window): RMSNorm, GQA attention with RoPE, SwiGLU.

Mirrors llama.cpp's src/models/llama.cpp and the LLM_ARCH_LLAMA case of load_tensors.
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from llama.arch import Architecture, register
from llama.graph import LlmGraph
from llama.hparams import HParams, MetadataReader
from llama.weights import TensorTable

ROPE_TYPE_NORM = 0


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
        n_q, n_k, n_v = hp.n_embd_head_k * hp.n_head[il], hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_layer(il, "wq", "attn_q.weight", (n_embd, n_q))
        t.add_layer(il, "wk", "attn_k.weight", (n_embd, n_k))
        t.add_layer(il, "wv", "attn_v.weight", (n_embd, n_v))
        t.add_layer(il, "wo", "attn_output.weight", (n_q, n_embd))
        t.add_layer(il, "bq", "attn_q.bias", (n_q,), optional=True)
        t.add_layer(il, "bk", "attn_k.bias", (n_k,), optional=True)
        t.add_layer(il, "bv", "attn_v.bias", (n_v,), optional=True)
        t.add_layer(il, "bo", "attn_output.bias", (n_embd,), optional=True)
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
        t.add_gated_ffn(il, n_embd, hp.n_ff[il])


def build(g: LlmGraph) -> Tensor:
    b, hp, m = g.b, g.hp, g.model
    head = hp.n_embd_head_k
    inp_l = g.build_inp_embd(m.w.tok_embd)
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()
    kq_scale = g.default_kq_scale(hp)
    rope = hp.rope_args()
    rope_freqs = g.w(m.w.rope_freqs)

    for il, layer in enumerate(m.layers):
        inp_sa = inp_l
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, "rms", il), "attn_norm", il)

        q = g.cb(g.build_lora_mm(layer.wq, cur, layer.bq), "Qcur", il)
        k = g.cb(g.build_lora_mm(layer.wk, cur, layer.bk), "Kcur", il)
        v = g.cb(g.build_lora_mm(layer.wv, cur, layer.bv), "Vcur", il)
        q = b.reshape(q, head, hp.n_head[il], b_tokens(q))
        k = b.reshape(k, head, hp.n_head_kv[il], b_tokens(k))
        v = b.reshape(v, hp.n_embd_head_v, hp.n_head_kv[il], b_tokens(v))
        q = g.cb(b.rope_ext(q, inp_pos, rope_freqs, **rope), "Qcur_rope", il)
        k = g.cb(b.rope_ext(k, inp_pos, rope_freqs, **rope), "Kcur_rope", il)

        cur = g.build_attn(inp_attn, layer.wo, layer.bo, q, k, v, kq_scale, il)
        if il == hp.n_layer - 1 and inp_out_ids is not None:
            cur = b.get_rows(cur, inp_out_ids)
            inp_sa = b.get_rows(inp_sa, inp_out_ids)
        ffn_inp = g.cb(b.add(cur, inp_sa), "ffn_inp", il)

        cur = g.cb(g.build_norm(ffn_inp, layer.ffn_norm, None, "rms", il), "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, "silu", il)
        inp_l = g.cb(b.add(cur, ffn_inp), "l_out", il)

    cur = g.cb(g.build_norm(inp_l, m.w.output_norm, None, "rms"), "result_norm")
    logits = b.mul_mat(g.w(m.w.output or m.w.tok_embd), cur)
    return logits


def b_tokens(t: Tensor):
    """The token dimension of a [features, n_tokens] activation."""
    return t.ne[1]


register(Architecture("llama", load_hparams, tensors, build))
