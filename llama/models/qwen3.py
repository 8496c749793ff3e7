"""Qwen 3: LLaMA's block with per-head RMS norms on Q and K (before RoPE), NeoX RoPE and no
projection biases.

Mirrors llama.cpp's src/models/qwen3.cpp. The head size comes from
`qwen3.attention.key_length` and need not be n_embd / n_head (Qwen3-0.6B: 16 heads of 128
in a 1024-wide model), so the Q projection and the attention output have their own widths.
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.hparams import HParams, HParamsError, MetadataReader, require_rms_eps
from llama.weights import Need, TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)
    if hp.n_embd_head_k != hp.n_embd_head_v or hp.n_rot != hp.n_embd_head_k:
        raise HParamsError(f"qwen3: key_length {hp.n_embd_head_k}, value_length {hp.n_embd_head_v} "
                           f"and rope.dimension_count {hp.n_rot} must be equal")


def tensors(hp: HParams, t: TensorTable) -> None:
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    t.add("tok_embd", "token_embd.weight", (n_embd, n_vocab))
    t.add("output_norm", "output_norm.weight", (n_embd,))
    t.add("output", "output.weight", (n_embd, n_vocab), optional=True)  # absent: tied embeddings
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_attention(il, hp, qk_norm=Need.REQUIRED)
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

    for il, layer in enumerate(m.layers):
        inp_sa = inp_l
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        q, k, v = g.build_qkv_rope(layer, cur, inp_pos, rope, il)
        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, kq_scale, il)
        cur, inp_sa = g.select_out_rows(cur, inp_sa, inp_out_ids, il)
        ffn_inp = g.cb(b.add(cur, inp_sa), "ffn_inp", il)

        cur = g.cb(g.build_norm(ffn_inp, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, FfnOp.SILU, il)
        inp_l = g.cb(b.add(cur, ffn_inp), "l_out", il)

    cur = g.cb(g.build_norm(inp_l, m.w.output_norm, None, NormType.RMS), "result_norm")
    return g.build_lora_mm(m.w.output or m.w.tok_embd, cur)


register(Architecture("qwen3", load_hparams, tensors, build))
