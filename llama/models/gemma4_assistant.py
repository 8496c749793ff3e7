"""Gemma 4's assistant: the multi-token-prediction drafter that runs beside a gemma4 model.

Mirrors llama.cpp's src/models/gemma4-assistant.cpp. The assistant has no KV cache and no
token embedding of its own input: a draft step takes the pending token, looked up in the
*target's* embedding (times sqrt of the target's width), beside the target's final normed
hidden state that predicted it; `nextn.pre_projection` maps the pair to the assistant's
width. Each layer is Q-only attention over the target's cache (sliding-window layers read
the target's last window cache layer, global layers its last global one, through the
target's own KV sharing), post-norms, a GELU FFN and the layer's output scale. The output
norm's result gives the logits through the assistant's tied embedding, and through
`nextn.post_projection` the hidden state the next step continues from. Steps after the
first take the drafted token and that hidden state at the same position (llama.cpp's
shared-memory drafting). `llama/speculative/mtp.py` runs it.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ggmlpy.ir import N_KV, N_TOKENS, GGMLType, Tensor
from ggmlpy.ir.symbolic import N_KV_SWA
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.hparams import HParams, HParamsError, MetadataReader, require_rms_eps
from llama.kv_attention import CacheHeads, attend_cache
from llama.models.gemma4 import load_attention_layout
from llama.weights import TensorTable, WeightRef

if TYPE_CHECKING:
    from llama.model import Model

TARGET_EMBD = "target:token_embd.weight"   # the target's embedding, as the step graph names it


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    load_attention_layout(r, hp)
    require_rms_eps(r, hp)
    hp.extra["n_embd_backbone"] = r.int("embedding_length_out", required=True)
    if hp.extra["n_embd_backbone"] == hp.n_embd:
        raise HParamsError(f"{r.key('embedding_length_out')} must carry the target's width, not the "
                           f"assistant's own ({hp.n_embd})")
    for il in range(hp.n_layer):
        if hp.head_k(il) != hp.head_v(il):
            raise HParamsError("gemma4-assistant: the key and value head sizes must be equal")


def tensors(hp: HParams, t: TensorTable) -> None:
    n_embd, n_backbone = hp.n_embd, hp.extra["n_embd_backbone"]
    t.add("tok_embd", "token_embd.weight", (n_embd, hp.n_vocab))
    t.add("output_norm", "output_norm.weight", (n_embd,))
    t.add("proj_pre", "nextn.pre_projection.weight", (2 * n_backbone, n_embd))
    t.add("proj_post", "nextn.post_projection.weight", (n_embd, n_backbone))
    t.ignore("masked_embd_")   # loaded by llama.cpp, used by neither
    global_layers = [il for il in range(hp.n_layer) if not hp.is_swa(il)]
    if global_layers:
        t.add("rope_freqs", "rope_freqs.weight", (hp.head_k(global_layers[0]) // 2,))
    for il in range(hp.n_layer):
        head, n_head = hp.head_k(il), hp.n_head[il]
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_layer(il, "wq", "attn_q.weight", (n_embd, head * n_head))
        t.add_layer(il, "wo", "attn_output.weight", (head * n_head, n_embd))
        t.add_layer(il, "attn_q_norm", "attn_q_norm.weight", (head,))
        t.add_layer(il, "attn_post_norm", "post_attention_norm.weight", (n_embd,))
        t.add_layer(il, "out_scale", "layer_output_scale.weight", (1,))
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
        t.add_gated_ffn(il, n_embd, hp.n_ff[il])
        t.add_layer(il, "ffn_post_norm", "post_ffw_norm.weight", (n_embd,))


def build(g: LlmGraph) -> Tensor:
    raise ValueError("gemma4-assistant is a drafter: it runs beside a gemma4 model as its speculative "
                     "decoding (llama-server's --spec-type draft-mtp -md FILE), not on its own")


def target_layer(target: "Model", swa: bool) -> int:
    """The target's cache layer an assistant layer reads: its second-to-last layer's for the
    window layers, its last layer's for the global ones, through its KV sharing."""
    thp = target.hparams
    return thp.kv_layer(thp.n_layer - (2 if swa else 1))


def build_step(g: LlmGraph, target: "Model") -> tuple[Tensor, Tensor]:
    """One draft step for each token of the ubatch: (logits [n_vocab, n_tokens], the next
    hidden state [n_embd_backbone, n_tokens]). `g.kv` is the target's cache layout; the
    graph reads `inp_tokens`, `inp_h`, `inp_pos` and the masks `inp_kq_mask` (and
    `inp_kq_mask_swa`) over the target's cells, and writes no cache."""
    hp, m, b = g.hp, g.model, g.b
    kv = g.kv
    n_backbone = hp.extra["n_embd_backbone"]
    emb = target.w.tok_embd
    tokens = b.input("inp_tokens", GGMLType.I32, (N_TOKENS,))
    x = b.get_rows(g.w(WeightRef(TARGET_EMBD, emb.type, emb.ne)), tokens)
    x = g.cb(b.scale(x, math.sqrt(n_backbone)), "inp_embd_target")
    h = b.input("inp_h", GGMLType.F32, (n_backbone, N_TOKENS))
    inp_l = g.cb(g.build_lora_mm(m.w.proj_pre, b.concat(x, h, 0)), "pre_proj")
    pos = b.input("inp_pos", GGMLType.I32, (N_TOKENS,))
    mask = b.input("inp_kq_mask", GGMLType.F32, (N_KV, N_TOKENS))
    mask_swa = b.input("inp_kq_mask_swa", GGMLType.F32,
                       (N_KV_SWA if kv.kv_size_swa else N_KV, N_TOKENS)) if any(hp.swa_layers) else None
    for il, layer in enumerate(m.layers):
        swa = hp.is_swa(il)
        head, n_head = hp.head_k(il), hp.n_head[il]
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        q = b.reshape(g.build_lora_mm(layer.wq, cur), head, n_head, N_TOKENS)
        q = g.cb(g.build_norm(q, layer.attn_q_norm, None, NormType.RMS, il), "Qcur_normed", il)
        factors = None if swa else g.w(m.w.rope_freqs)
        q = g.cb(b.rope_ext(q, pos, factors, **hp.rope_args(il)), "Qcur_pos", il)
        cur = _attend_target(g, target, q, swa, head, n_head, mask_swa if swa else mask, il)
        cur = g.cb(g.build_lora_mm(layer.wo, cur), "attn_out", il)
        cur = g.cb(g.build_norm(cur, layer.attn_post_norm, None, NormType.RMS, il), "attn_post_norm", il)
        attn_out = g.cb(b.add(cur, inp_l), "attn_out", il)
        cur = g.cb(g.build_norm(attn_out, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, FfnOp.GELU, il)
        cur = g.cb(g.build_norm(cur, layer.ffn_post_norm, None, NormType.RMS, il), "ffn_post_norm", il)
        cur = b.add(cur, attn_out)
        inp_l = g.cb(b.mul(cur, g.w(layer.out_scale)), "out_scaled", il)
    cur = g.cb(g.build_norm(inp_l, m.w.output_norm, None, NormType.RMS), "result_norm")
    logits = g.cb(g.build_lora_mm(m.w.tok_embd, cur), "result_output")
    return logits, g.cb(g.build_lora_mm(m.w.proj_post, cur), "h_nextn")


def _attend_target(g: LlmGraph, target: "Model", q: Tensor, swa: bool, head: int, n_head: int, mask: Tensor,
                   il: int) -> Tensor:
    """Layer il's queries over the target's cache layer for its kind (no K or V of its own)."""
    thp, kv, b = target.hparams, g.kv, g.b
    src = target_layer(target, swa)
    if thp.head_k(src) != head or thp.head_v(src) != head:
        raise HParamsError(f"gemma4-assistant layer {il}: head size {head}, but the target's cache layer "
                           f"{src} holds heads of {thp.head_k(src)}")
    size = kv.size_of(thp, src)
    cache_k = b.cache(f"cache_k_l{src}", kv.type_k, (thp.n_embd_k_gqa(src), size))
    cache_v = b.cache(f"cache_v_l{src}", kv.type_v, (thp.n_embd_v_gqa(src), size))
    n_kv = N_KV_SWA if kv.separate_swa(thp, src) else N_KV
    heads = CacheHeads(head, head, thp.n_head_kv[src], n_head, n_kv)
    return attend_cache(g, q, cache_k, cache_v, heads, mask, g.hp.f_attention_scale, il)


register(Architecture("gemma4-assistant", load_hparams, tensors, build, drafter=True))
