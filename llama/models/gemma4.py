"""Gemma 4: per-layer embedding inputs, per-layer head sizes, KV shared across layers, experts.

Mirrors llama.cpp's src/models/gemma4.cpp (llama_model_gemma4: load_arch_hparams,
load_arch_tensors and the graph):
- which layers use the sliding window is a per-layer array (attention.sliding_window_pattern);
  the window layers have their own head size (key_length_swa), rotary dims
  (rope.dimension_count_swa) and RoPE base (rope.freq_base_swa); the global layers rotate
  with rope_freqs.weight, whose huge factors leave the unrotated dims of their "proportional"
  RoPE still;
- Q and K are RMS-normalised per head with weights, V without; attention scale 1; a global
  layer without attn_v uses its K projection for V; a file may instead give Q, K and V as
  the rows of one attn_qkv;
- the last attention.shared_kv_layers layers own no cache: each reads the cache of the last
  earlier layer of its kind (HParams.kv_layer), so the cache holds only the first layers;
- sandwich norms around attention and the GELU FFN; in the experts' variant (26B-A4B) the
  dense FFN runs beside the experts as a shared expert, each half with its own norms, and
  the router scores a separately normalised and scaled input (ffn_gate_inp.scale);
- per-layer embeddings (E2B, E4B): a second embedding table, [n_embd_per_layer * n_layer]
  wide, plus a projection of the token embedding give every layer a small input, gated by the
  layer's output and projected back onto the residual stream;
- each layer's output is scaled by layer_output_scale where the file has one; the final
  logits are soft-capped.
Embeddings given as input (of images) take the padding token's row (id 0) of the per-layer
table for every position, as llama.cpp does.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from ggmlpy.ir import GGMLType, Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.graph_inputs import GraphInput, fill_input
from llama.hparams import HParams, HParamsError, MetadataReader, load_experts, require_rms_eps
from llama.kv_cells import SWAType
from llama.models.decoder_tensors import add_embd_output
from llama.moe import Gating, build_moe_ffn
from llama.weights import Need, TensorLoadError, TensorTable


def load_attention_layout(r: MetadataReader, hp: HParams) -> None:
    """What Gemma 4 and its assistant share: the per-layer window pattern, the window layers'
    RoPE base, rope_freqs on the global layers only, NeoX RoPE and attention scale 1."""
    hp.rope_type = ROPE_TYPE_NEOX
    pattern = r.get("attention.sliding_window_pattern", required=True)
    if len(pattern) != hp.n_layer:
        raise HParamsError(f"{r.key('attention.sliding_window_pattern')} has {len(pattern)} entries "
                           f"for {hp.n_layer} layers")
    hp.swa_layers = [bool(x) for x in pattern]
    hp.extra["swa_type"] = int(SWAType.STANDARD)
    hp.n_swa = r.int("attention.sliding_window", required=True)
    hp.rope_freq_base_swa = float(r.get("rope.freq_base_swa", hp.rope_freq_base_swa))
    hp.rope_freqs_swa = False
    hp.f_attention_scale = 1.0


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    load_attention_layout(r, hp)
    hp.f_final_logit_softcapping = float(r.get("final_logit_softcapping", 0.0))
    hp.n_embd_per_layer = r.int("embedding_length_per_layer_input", required=True)
    for suffix in ("attention.key_length_swa", "attention.value_length_swa"):
        r.int(suffix, required=True)
    if hp.n_embd_head_k != hp.n_embd_head_v or hp.head_k(0) != hp.head_v(0) or hp.head_k(
            hp.n_layer - 1) != hp.head_v(hp.n_layer - 1):
        raise HParamsError("gemma4: the key and value head sizes must be equal (key_length, value_length "
                           "and their _swa values)")
    require_rms_eps(r, hp)
    _load_shared_kv(r, hp)
    if r.int("expert_count", 0):
        load_experts(r, hp)
        widths = set(r.per_layer("expert_feed_forward_length", hp.n_layer, required=True))
        if len(widths) != 1:
            raise HParamsError(f"{r.key('expert_feed_forward_length')}: experts of different widths per layer "
                               "are not supported")
        hp.n_ff_exp = widths.pop()


def _load_shared_kv(r: MetadataReader, hp: HParams) -> None:
    """The layers past n_layer - shared_kv_layers read the last owning layer of their kind,
    so the two layers before them must be a window layer and then a global one."""
    n_shared = r.int("attention.shared_kv_layers", 0)
    if n_shared <= 0:
        return
    start = hp.n_layer - n_shared
    if start < 2 or not hp.is_swa(start - 2) or hp.is_swa(start - 1):
        raise HParamsError(f"{r.key('attention.shared_kv_layers')} = {n_shared}: the layers sharing a cache read "
                           f"layers {start - 2} (sliding-window) and {start - 1} (global), which the "
                           "sliding-window pattern does not have")
    hp.n_layer_kv_from_start = start


# what a layer with experts has besides them: the router's input scale and the halves' norms
MOE_NORMS = (("ffn_gate_inp_s", "ffn_gate_inp.scale"), ("ffn_pre_norm_2", "pre_ffw_norm_2.weight"),
             ("ffn_post_norm_1", "post_ffw_norm_1.weight"), ("ffn_post_norm_2", "post_ffw_norm_2.weight"))


def tensors(hp: HParams, t: TensorTable) -> None:
    n_embd, n_pl = hp.n_embd, hp.n_embd_per_layer
    add_embd_output(hp, t)
    if n_pl:
        t.add("per_layer_tok_embd", "per_layer_token_embd.weight", (n_pl * hp.n_layer, hp.n_vocab))
        t.add("per_layer_model_proj", "per_layer_model_proj.weight", (n_embd, n_pl * hp.n_layer))
        t.add("per_layer_proj_norm", "per_layer_proj_norm.weight", (n_pl,))
    global_layers = [il for il in range(hp.n_layer) if not hp.is_swa(il)]
    if global_layers:
        t.add("rope_freqs", "rope_freqs.weight", (hp.head_k(global_layers[0]) // 2,))
    for il in range(hp.n_layer):
        head, n_head, no_kv = hp.head_k(il), hp.n_head[il], not hp.has_kv(il)
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        n_qkv = head * n_head + hp.n_embd_k_gqa(il) + hp.n_embd_v_gqa(il)
        t.add_layer(il, "wqkv", "attn_qkv.weight", (n_embd, n_qkv), optional=True)   # or attn_q/k/v
        t.add_layer(il, "wq", "attn_q.weight", (n_embd, head * n_head), optional=True)
        t.add_layer(il, "wk", "attn_k.weight", (n_embd, hp.n_embd_k_gqa(il)), optional=True)  # see build_attention
        t.add_layer(il, "wv", "attn_v.weight", (n_embd, hp.n_embd_v_gqa(il)), optional=True)
        t.add_layer(il, "wo", "attn_output.weight", (head * n_head, n_embd))
        t.add_layer(il, "attn_q_norm", "attn_q_norm.weight", (head,))
        t.add_layer(il, "attn_k_norm", "attn_k_norm.weight", (head,), optional=no_kv)
        t.add_layer(il, "attn_post_norm", "post_attention_norm.weight", (n_embd,))
        t.add_layer(il, "out_scale", "layer_output_scale.weight", (1,), optional=True)
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
        t.add_gated_ffn(il, n_embd, hp.n_ff[il])
        t.add_layer(il, "ffn_post_norm", "post_ffw_norm.weight", (n_embd,))
        if hp.n_expert:   # a layer has experts where it has a router (llama.cpp's has_expert)
            t.add_moe_ffn(il, n_embd, hp.n_ff_exp, hp.n_expert, gate_up=Need.OPTIONAL, down_scale=Need.OPTIONAL,
                          present=Need.OPTIONAL)
            for attr, name in MOE_NORMS:
                t.add_layer(il, attr, name, (n_embd,), optional=True)
        if n_pl:
            t.add_layer(il, "per_layer_inp_gate", "inp_gate.weight", (n_embd, n_pl))
            t.add_layer(il, "per_layer_proj", "proj.weight", (n_pl, n_embd))
            t.add_layer(il, "per_layer_post_norm", "post_norm.weight", (n_embd,))


def build(g: LlmGraph) -> Tensor:
    hp, m, b = g.hp, g.model, g.b
    inp_l = g.build_inp_embd(m.w.tok_embd)
    # the per-layer table's rows are looked up next to the embedding's, on the host, before
    # anything that may run on a device
    per_layer_rows = lookup_per_layer_rows(g) if hp.n_embd_per_layer else None
    if per_layer_rows is not None:
        g.first.append(per_layer_rows)
    inp_l = g.scale_inp_embd(inp_l)
    inp = g.build_layer_inputs()
    per_layer = project_per_layer_inputs(g, inp_l, per_layer_rows) if per_layer_rows is not None else None

    for il, layer in enumerate(m.layers):
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        cur = build_attention(g, layer, cur, inp, il)
        cur, inp_l = g.select_out_rows(cur, inp_l, inp.out_ids, il)
        cur = g.cb(g.build_norm(cur, layer.attn_post_norm, None, NormType.RMS, il), "attn_post_norm", il)
        attn_out = g.cb(b.add(cur, inp_l), "attn_out", il)

        if hp.n_expert and layer.ffn_gate_inp is not None:
            cur = build_ffn_with_experts(g, layer, attn_out, il)
        else:
            cur = g.cb(g.build_norm(attn_out, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
            cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, FfnOp.GELU, il)
        cur = g.cb(g.build_norm(cur, layer.ffn_post_norm, None, NormType.RMS, il), "ffn_post_norm", il)
        cur = b.add(cur, attn_out)

        if per_layer is not None:
            cur = add_per_layer_input(g, layer, cur, per_layer, inp.out_ids, il)
        if layer.out_scale is not None:
            cur = g.cb(b.mul(cur, g.w(layer.out_scale)), "out_scaled", il)
        inp_l = g.cb(cur, "l_out", il)

    logits = g.build_output(inp_l, m.w.output_norm, m.w.output or m.w.tok_embd)
    if hp.f_final_logit_softcapping:
        logits = g.build_softcap(logits, hp.f_final_logit_softcapping)
    return logits


def build_attention(g: LlmGraph, layer: SimpleNamespace, cur: Tensor, inp, il: int) -> Tensor:
    """Q of this layer; K and V of this layer where it owns a cache (V: the K projection
    where the file has no attn_v), else the cache of hp.kv_layer(il). A fused attn_qkv
    gives all three (its K and V rows go unused in a layer that owns no cache)."""
    hp, b = g.hp, g.b
    head, n_head, n_head_kv = hp.head_k(il), hp.n_head[il], hp.n_head_kv[il]
    rope = hp.rope_args(il)
    factors = g.w(g.model.w.rope_freqs) if hp.uses_rope_freqs(il) else None
    if layer.wqkv is not None:
        q, k, v = g.split_fused_qkv(g.cb(g.build_lora_mm(layer.wqkv, cur), "wqkv", il), il)
    elif layer.wq is not None:
        q = g.cb(g.build_lora_mm(layer.wq, cur), "Qcur", il)
        q, k, v = b.reshape(q, head, n_head, q.ne[1]), None, None
    else:
        raise TensorLoadError(f"gemma4 layer {il}: the file has neither blk.{il}.attn_qkv.weight "
                              f"nor blk.{il}.attn_q.weight")
    n_tokens = q.ne[2]
    q = g.cb(g.build_norm(q, layer.attn_q_norm, None, NormType.RMS, il), "Qcur_normed", il)
    q = g.cb(b.rope_ext(q, inp.pos, factors, **rope), "Qcur_pos", il)
    if not hp.has_kv(il):
        return g.build_attn(inp.attn, layer.wo, None, q, None, None, hp.f_attention_scale, il)
    if layer.attn_k_norm is None or (k is None and layer.wk is None):
        raise TensorLoadError(f"gemma4 layer {il} owns a KV cache but the file lacks blk.{il}.attn_k.weight "
                              f"or blk.{il}.attn_k_norm.weight")
    if k is None:
        k = g.cb(g.build_lora_mm(layer.wk, cur), "Kcur", il)
        v = g.cb(g.build_lora_mm(layer.wv, cur), "Vcur", il) if layer.wv is not None else k
        k = b.reshape(k, head, n_head_kv, n_tokens)
        v = b.reshape(v, head, n_head_kv, n_tokens)
    k = g.cb(g.build_norm(k, layer.attn_k_norm, None, NormType.RMS, il), "Kcur_normed", il)
    v = g.cb(g.build_norm(v, None, None, NormType.RMS, il), "Vcur_normed", il)
    k = g.cb(b.rope_ext(k, inp.pos, factors, **rope), "Kcur_pos", il)
    return g.build_attn(inp.attn, layer.wo, None, q, k, v, hp.f_attention_scale, il)


def build_ffn_with_experts(g: LlmGraph, layer: SimpleNamespace, attn_out: Tensor, il: int) -> Tensor:
    """The dense FFN (a shared expert) plus the experts, each normalised before and after; the
    router reads attn_out RMS-normalised, over sqrt(n_embd) and times ffn_gate_inp.scale."""
    hp, b = g.hp, g.b
    needed = (*MOE_NORMS, ("ffn_down_exps", "ffn_down_exps.weight"))
    missing = [name for attr, name in needed if vars(layer)[attr] is None]
    if missing:
        raise TensorLoadError(f"gemma4 layer {il} has a router but not blk.{il}.{missing[0]}")
    mlp = g.cb(g.build_norm(attn_out, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm_1", il)
    mlp = g.build_ffn(mlp, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, FfnOp.GELU, il)
    mlp = g.cb(g.build_norm(mlp, layer.ffn_post_norm_1, None, NormType.RMS, il), "ffn_mlp", il)

    moe = g.cb(g.build_norm(attn_out, layer.ffn_pre_norm_2, None, NormType.RMS, il), "ffn_norm_2", il)
    router_in = b.scale(b.rms_norm(attn_out, hp.f_norm_rms_eps), 1.0 / math.sqrt(hp.n_embd))
    router_in = b.mul(router_in, g.w(layer.ffn_gate_inp_s))
    logits = g.cb(g.build_lora_mm(layer.ffn_gate_inp, router_in), "ffn_moe_logits", il)
    moe = build_moe_ffn(g, moe, layer, FfnOp.GELU, True, il, Gating.SOFTMAX, logits=logits)
    moe = g.cb(g.build_norm(moe, layer.ffn_post_norm_2, None, NormType.RMS, il), "ffn_moe", il)
    return g.cb(b.add(mlp, moe), "ffn_moe_combined", il)


def lookup_per_layer_rows(g: LlmGraph) -> Tensor:
    """The tokens' rows of the per-layer table [n_embd_per_layer * n_layer, n_tokens]
    (llama.cpp's build_inp_per_layer). With embeddings as input the row is the padding
    token's, one row for every token."""
    m, b = g.model, g.b
    ids = g.inp_tokens
    if ids is None:
        g.inputs.append(InpPaddingRow())
        ids = b.input(InpPaddingRow.names[0], GGMLType.I32, (1,))
    return b.get_rows(g.w(m.w.per_layer_tok_embd), ids)


def project_per_layer_inputs(g: LlmGraph, inp_embd: Tensor, rows: Tensor) -> Tensor:
    """Every layer's input [n_embd_per_layer, n_layer, n_tokens]: the rows plus the
    normalised projection of the scaled embedding (over sqrt(n_embd)), the sum over sqrt(2)
    (llama.cpp's project_per_layer_inputs). The rows are scaled by sqrt(n_embd_per_layer)
    first; one row (embeddings as input) is added to every token's projection."""
    hp, m, b = g.hp, g.model, g.b
    rows = b.reshape(rows, hp.n_embd_per_layer, hp.n_layer, rows.ne[1])
    rows = g.cb(b.scale(rows, math.sqrt(hp.n_embd_per_layer)), "inp_per_layer_selected")
    proj = b.scale(g.build_lora_mm(m.w.per_layer_model_proj, inp_embd), 1.0 / math.sqrt(hp.n_embd))
    proj = b.reshape(proj, hp.n_embd_per_layer, hp.n_layer, inp_embd.ne[1])
    proj = g.cb(g.build_norm(proj, m.w.per_layer_proj_norm, None, NormType.RMS), "per_layer_proj")
    return g.cb(b.scale(b.add(proj, rows), 1.0 / math.sqrt(2.0)), "inp_per_layer")


class InpPaddingRow(GraphInput):
    """The padding token's id, 0, whose per-layer row embeddings given as input take."""

    names = ("inp_per_layer_pad",)

    def set_input(self, ub, state, bufs=None):
        return {self.names[0]: fill_input(bufs, self.names[0], np.int32, [0])}


def add_per_layer_input(g: LlmGraph, layer: SimpleNamespace, cur: Tensor, per_layer: Tensor,
                        out_ids: Tensor | None, il: int) -> Tensor:
    """cur + post_norm(proj(gelu(inp_gate · cur) * this layer's input)); in the last layer
    only the output rows of the input, as of cur."""
    hp, b = g.hp, g.b
    n_pl = hp.n_embd_per_layer
    this = b.view(per_layer, (n_pl, per_layer.ne[2]), (per_layer.nb[2],), il * per_layer.nb[1])
    if il == hp.n_layer - 1 and out_ids is not None:
        this = b.get_rows(b.cont(this), out_ids)
    gate = b.gelu(g.build_lora_mm(layer.per_layer_inp_gate, cur))
    out = g.build_lora_mm(layer.per_layer_proj, b.mul(gate, this))
    out = g.cb(g.build_norm(out, layer.per_layer_post_norm, None, NormType.RMS, il), "per_layer_embd_out", il)
    return b.add(cur, out)


register(Architecture("gemma4", load_hparams, tensors, build))
