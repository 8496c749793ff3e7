"""IBM Granite 3 (granite) and Granite MoE (granitemoe, with or without a shared expert):
LLaMA's layer with four scalars of their own:

- the token embeddings times `embedding_scale`;
- the attention scale `attention.scale` in place of 1/sqrt(head_dim);
- each block's output times `residual_scale` before its residual add;
- the logits divided by `logit_scale` (required).

Where `rope.scaling.finetuned` is false the model has no RoPE at all. The MoE layers run a
softmax router whose chosen weights are renormalised, plus, where
`expert_shared_feed_forward_length` is set, a shared SwiGLU FFN every token runs.

Mirrors llama.cpp's src/models/granite.cpp (both architectures build that graph) and
granite-moe.cpp's tensors.
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NORM
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.hparams import HParams, HParamsError, MetadataReader, load_experts, require_rms_eps
from llama.models.decoder_tensors import add_embd_output
from llama.moe import build_moe_ffn
from llama.weights import Need, TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NORM
    require_rms_eps(r, hp)
    if not r.has("logit_scale"):
        raise HParamsError(f"required key {r.key('logit_scale')} is missing")
    hp.extra["logit_scale"] = float(r.get("logit_scale"))
    hp.extra["residual_scale"] = float(r.get("residual_scale", 0.0))
    hp.extra["embedding_scale"] = float(r.get("embedding_scale", 0.0))
    hp.f_attention_scale = float(r.get("attention.scale", 0.0))
    hp.extra["has_rope"] = bool(r.get("rope.scaling.finetuned", True))
    hp.extra["n_ff_shexp"] = r.int("expert_shared_feed_forward_length", 0)
    if r.int("expert_count", 0):
        load_experts(r, hp)
        hp.n_ff_exp = hp.n_ff[0]


def tensors(hp: HParams, t: TensorTable) -> None:
    add_embd_output(hp, t)
    t.add("rope_freqs", "rope_freqs.weight", (hp.n_rot // 2,), optional=True)
    n_embd, n_ff_shexp = hp.n_embd, hp.extra["n_ff_shexp"]
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_attention(il, hp, out_bias=Need.OPTIONAL)
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
        if not hp.n_expert:
            n_ff = hp.n_ff[il]
            t.add_gated_ffn(il, n_embd, n_ff)
            t.add_layer(il, "ffn_gate_b", "ffn_gate.bias", (n_ff,), optional=True)
            t.add_layer(il, "ffn_up_b", "ffn_up.bias", (n_ff,), optional=True)
            t.add_layer(il, "ffn_down_b", "ffn_down.bias", (n_embd,), optional=True)
            continue
        t.add_moe_ffn(il, n_embd, hp.n_ff_exp, hp.n_expert, gate=Need.OPTIONAL)
        if n_ff_shexp:
            t.add_shared_experts(il, n_embd, n_ff_shexp)


def build(g: LlmGraph) -> Tensor:
    hp, m, b = g.hp, g.model, g.b
    residual_scale = hp.extra["residual_scale"]
    inp_l = g.build_inp_embd(m.w.tok_embd)
    if hp.extra["embedding_scale"]:
        inp_l = g.cb(b.scale(inp_l, hp.extra["embedding_scale"]), "inp_scaled")
    inp = g.build_layer_inputs()
    kq_scale = hp.f_attention_scale or g.default_kq_scale(hp)
    rope = hp.rope_args() if hp.extra["has_rope"] else None
    freqs = g.w(m.w.rope_freqs)

    def scaled(t: Tensor) -> Tensor:
        return b.scale(t, residual_scale) if residual_scale else t

    for il, layer in enumerate(m.layers):
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        q, k, v = g.build_qkv_rope(layer, cur, inp.pos, rope, il, freqs)
        cur = g.cb(g.build_attn(inp.attn, layer.wo, layer.bo, q, k, v, kq_scale, il), "attn_out", il)
        cur, inp_sa = g.select_out_rows(cur, inp_l, inp.out_ids, il)
        ffn_inp = g.cb(b.add(scaled(cur), inp_sa), "ffn_inp", il)

        cur = g.cb(g.build_norm(ffn_inp, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
        if not hp.n_expert:
            cur = g.build_ffn(cur, layer.ffn_up, layer.ffn_up_b, layer.ffn_gate, layer.ffn_gate_b,
                              layer.ffn_down, layer.ffn_down_b, FfnOp.SILU, il)
        else:
            moe_out = build_moe_ffn(g, cur, layer, FfnOp.SILU, True, il)
            if hp.extra["n_ff_shexp"]:
                shared = g.build_ffn(cur, layer.ffn_up_shexp, None, layer.ffn_gate_shexp, None,
                                     layer.ffn_down_shexp, None, FfnOp.SILU, il)
                cur = g.cb(b.add(moe_out, g.cb(shared, "ffn_shexp", il)), "ffn_out", il)
            else:
                cur = moe_out
        inp_l = g.cb(b.add(scaled(cur), ffn_inp), "l_out", il)

    logits = g.build_output(inp_l, m.w.output_norm, m.w.output or m.w.tok_embd)
    return b.scale(logits, 1.0 / hp.extra["logit_scale"])


register(Architecture("granite", load_hparams, tensors, build))
register(Architecture("granitemoe", load_hparams, tensors, build))
