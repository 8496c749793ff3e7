"""Qwen 3: LLaMA's block with per-head RMS norms on Q and K (before RoPE), NeoX RoPE and no
projection biases.

Mirrors llama.cpp's src/models/qwen3.cpp. The head size comes from
`qwen3.attention.key_length` and need not be n_embd / n_head (Qwen3-0.6B: 16 heads of 128
in a 1024-wide model), so the Q projection and the attention output have their own widths.
"""
from __future__ import annotations

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
    if hp.n_embd_head_k != hp.n_embd_head_v or hp.n_rot != hp.n_embd_head_k:
        raise HParamsError(f"qwen3: key_length {hp.n_embd_head_k}, value_length {hp.n_embd_head_v} "
                           f"and rope.dimension_count {hp.n_rot} must be equal")


def tensors(hp: HParams, t: TensorTable) -> None:
    n_embd, n_vocab, head = hp.n_embd, hp.n_vocab, hp.n_embd_head_k
    t.add("tok_embd", "token_embd.weight", (n_embd, n_vocab))
    t.add("output_norm", "output_norm.weight", (n_embd,))
    t.add("output", "output.weight", (n_embd, n_vocab), optional=True)  # absent: tied embeddings
    for il in range(hp.n_layer):
        n_q, n_k, n_v = head * hp.n_head[il], hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_layer(il, "wq", "attn_q.weight", (n_embd, n_q))
        t.add_layer(il, "wk", "attn_k.weight", (n_embd, n_k))
        t.add_layer(il, "wv", "attn_v.weight", (n_embd, n_v))
        t.add_layer(il, "wo", "attn_output.weight", (n_q, n_embd))
        t.add_layer(il, "attn_q_norm", "attn_q_norm.weight", (head,))
        t.add_layer(il, "attn_k_norm", "attn_k_norm.weight", (head,))
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

    for il, layer in enumerate(m.layers):
        inp_sa = inp_l
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, "rms", il), "attn_norm", il)

        q = g.cb(g.build_lora_mm(layer.wq, cur), "Qcur", il)
        k = g.cb(g.build_lora_mm(layer.wk, cur), "Kcur", il)
        v = g.cb(g.build_lora_mm(layer.wv, cur), "Vcur", il)
        n_tokens = q.ne[1]
        q = b.reshape(q, head, hp.n_head[il], n_tokens)
        k = b.reshape(k, head, hp.n_head_kv[il], n_tokens)
        v = b.reshape(v, hp.n_embd_head_v, hp.n_head_kv[il], n_tokens)
        q = g.cb(g.build_norm(q, layer.attn_q_norm, None, "rms", il), "Qcur_normed", il)
        q = g.cb(b.rope_ext(q, inp_pos, None, **rope), "Qcur_rope", il)
        k = g.cb(g.build_norm(k, layer.attn_k_norm, None, "rms", il), "Kcur_normed", il)
        k = g.cb(b.rope_ext(k, inp_pos, None, **rope), "Kcur_rope", il)

        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, kq_scale, il)
        if il == hp.n_layer - 1 and inp_out_ids is not None:
            cur = b.get_rows(cur, inp_out_ids)
            inp_sa = b.get_rows(inp_sa, inp_out_ids)
        ffn_inp = g.cb(b.add(cur, inp_sa), "ffn_inp", il)

        cur = g.cb(g.build_norm(ffn_inp, layer.ffn_norm, None, "rms", il), "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, "silu", il)
        inp_l = g.cb(b.add(cur, ffn_inp), "l_out", il)

    cur = g.cb(g.build_norm(inp_l, m.w.output_norm, None, "rms"), "result_norm")
    return b.mul_mat(g.w(m.w.output or m.w.tok_embd), cur)


register(Architecture("qwen3", load_hparams, tensors, build))
