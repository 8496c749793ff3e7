"""Qwen3.5 / Qwen3.6 (dense): a hybrid of gated delta-net layers (three in four, by default)
and gated full attention, each followed by a SwiGLU FFN.

Mirrors llama.cpp's src/models/qwen35.cpp. The attention layers project Q together with a
per-head output gate ([q | gate] per head in attn_q), normalise Q and K per head, rotate
them with interleaved multi-section RoPE (text tokens: the same position in every section)
and multiply the attention's output by sigmoid(gate) before attn_output. The recurrent
layers are llama/delta_net.py's. The norm before the FFN is `post_attention_norm`. A file's
multi-token-prediction blocks (`nextn_predict_layers`, after the others) are not run.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import numpy as np

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_IMROPE
from llama.arch import Architecture, register
from llama.delta_net import add_linear_attention, build_layer_attn_linear, load_ssm_hparams
from llama.graph import AttnInput, FfnOp, LlmGraph, NormType
from llama.hparams import HParams, HParamsError, MetadataReader, require_rms_eps
from llama.models.decoder_tensors import add_embd_output
from llama.weights import TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_IMROPE
    require_rms_eps(r, hp)
    load_nextn(r, hp)
    sections = [int(x) for x in np.asarray(r.get("rope.dimension_sections", []), dtype=np.int64).reshape(-1)]
    if not sections or len(sections) > 4 or not any(sections[:3]):
        raise HParamsError(f"{r.key('rope.dimension_sections')} must give up to 4 sections, not all zero "
                           f"(got {sections})")
    hp.rope_sections = tuple((sections + [0, 0, 0, 0])[:4])
    load_ssm_hparams(r, hp)
    if hp.n_embd_head_k != hp.n_embd_head_v:
        raise HParamsError(f"{hp.arch}: key_length {hp.n_embd_head_k} and value_length {hp.n_embd_head_v} differ")


def load_nextn(r: MetadataReader, hp: HParams) -> None:
    """The last `nextn_predict_layers` blocks are the multi-token-prediction head: loaded as
    known tensors, not run (as llama.cpp's main graph)."""
    n_nextn = r.int("nextn_predict_layers", 0)
    if not 0 <= n_nextn < hp.n_layer:
        raise HParamsError(f"{r.key('nextn_predict_layers')} {n_nextn} is not below block_count {hp.n_layer}")
    hp.extra["n_layer_all"] = hp.n_layer
    hp.n_layer -= n_nextn


def add_gated_attention(t: TensorTable, hp: HParams, il: int) -> None:
    """A full-attention layer's tensors: attn_q holds Q and its gate ([q | gate] per head)."""
    head = hp.n_embd_head_k
    n_q = head * hp.n_head[il]
    t.add_layer(il, "wq", "attn_q.weight", (hp.n_embd, 2 * n_q))
    t.add_layer(il, "wk", "attn_k.weight", (hp.n_embd, hp.n_embd_k_gqa(il)))
    t.add_layer(il, "wv", "attn_v.weight", (hp.n_embd, hp.n_embd_v_gqa(il)))
    t.add_layer(il, "wo", "attn_output.weight", (n_q, hp.n_embd))
    t.add_layer(il, "attn_q_norm", "attn_q_norm.weight", (head,))
    t.add_layer(il, "attn_k_norm", "attn_k_norm.weight", (head,))


def add_trunk(t: TensorTable, hp: HParams, add_linear=add_linear_attention) -> None:
    """Embeddings, output and every layer's norms and attention (full, or linear with
    `add_linear`'s tensors); the FFN is the caller's. The MTP blocks are ignored."""
    add_embd_output(hp, t)
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (hp.n_embd,))
        t.add_layer(il, "attn_post_norm", "post_attention_norm.weight", (hp.n_embd,))
        if hp.is_recurrent(il):
            add_linear(t, hp, il)
        else:
            add_gated_attention(t, hp, il)
    for il in range(hp.n_layer, hp.extra["n_layer_all"]):
        t.ignore(f"blk.{il}.")


def tensors(hp: HParams, t: TensorTable) -> None:
    add_trunk(t, hp)
    for il in range(hp.n_layer):
        t.add_gated_ffn(il, hp.n_embd, hp.n_ff[il])


def build_layer_attn(g: LlmGraph, layer: SimpleNamespace, cur: Tensor, attn: AttnInput, pos: Tensor,
                     il: int, rope: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """Gated full attention (llama.cpp's qwen35 build_layer_attn), before the residual add;
    Q and K rotated by `rope` (default: multi-section RoPE with the model's sections)."""
    b, hp = g.b, g.hp
    head, n_head, n_head_kv = hp.n_embd_head_k, hp.n_head[il], hp.n_head_kv[il]
    q_full = g.cb(g.build_lora_mm(layer.wq, cur), "Qcur_full", il)
    n_tokens, esz = q_full.ne[1], q_full.nb[0]
    q = b.view(q_full, (head, n_head, n_tokens), (esz * head * 2, esz * head * 2 * n_head), 0)
    q = g.cb(g.build_norm(q, layer.attn_q_norm, None, NormType.RMS, il), "Qcur_normed", il)
    k = b.reshape(g.build_lora_mm(layer.wk, cur), head, n_head_kv, n_tokens)
    k = g.cb(g.build_norm(k, layer.attn_k_norm, None, NormType.RMS, il), "Kcur_normed", il)
    gate = b.view(q_full, (head, n_head, n_tokens), (esz * head * 2, esz * head * 2 * n_head), esz * head)
    gate = g.cb(b.cont(gate, head * n_head, n_tokens), "gate_reshaped", il)
    v = b.reshape(g.build_lora_mm(layer.wv, cur), head, n_head_kv, n_tokens)
    if rope is None:
        def rope(t: Tensor) -> Tensor:
            return b.rope_multi(t, pos, None, sections=hp.rope_sections, **hp.rope_args(il))
    q, k = g.cb(rope(q), "Qcur", il), g.cb(rope(k), "Kcur", il)
    kq_scale = hp.f_attention_scale or g.default_kq_scale(hp)
    cur = g.build_attn(attn, None, None, q, k, v, kq_scale, il)
    cur = g.cb(b.mul(cur, b.sigmoid(gate)), "attn_gated", il)
    return g.cb(g.build_lora_mm(layer.wo, cur), "attn_output", il)


def build_hybrid(g: LlmGraph, ffn: Callable, linear: Callable | None = None,
                 attention: Callable | None = None) -> Tensor:
    """The Qwen3.5 layer loop: attn_norm, linear or full attention (`linear(layer, cur, rs,
    il)`, `attention(g, layer, cur, attn, pos, il)`; default Qwen3.5's), the residual add,
    post_attention_norm, `ffn(layer, x, il)` and its residual add; the output head."""
    linear = linear or (lambda layer, cur, rs, il: build_layer_attn_linear(g, layer, cur, rs, il))
    attention = attention or build_layer_attn
    b, hp, m = g.b, g.hp, g.model
    inp_l = g.build_inp_embd(m.w.tok_embd)
    pos = g.build_inp_pos()
    attn = g.build_attn_inp_kv()
    rs = g.build_inp_rs()
    out_ids = g.build_inp_out_ids()
    for il, layer in enumerate(m.layers):
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        if hp.is_recurrent(il):
            cur = linear(layer, cur, rs, il)
        else:
            cur = attention(g, layer, cur, attn, pos, il)
        cur, inp_l = g.select_out_rows(cur, inp_l, out_ids, il)
        cur = g.cb(b.add(cur, inp_l), "attn_residual", il)
        normed = g.cb(g.build_norm(cur, layer.attn_post_norm, None, NormType.RMS, il), "attn_post_norm", il)
        inp_l = g.cb(b.add(ffn(layer, normed, il), cur), "l_out", il)
    return g.build_output(inp_l, m.w.output_norm, m.w.output or m.w.tok_embd)


def build(g: LlmGraph) -> Tensor:
    return build_hybrid(g, lambda layer, x, il: g.build_ffn(x, layer.ffn_up, None, layer.ffn_gate, None,
                                                             layer.ffn_down, None, FfnOp.SILU, il))


register(Architecture("qwen35", load_hparams, tensors, build))
