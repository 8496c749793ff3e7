"""gpt-oss (gpt-oss-20b, gpt-oss-120b), llama.cpp's LLM_ARCH_OPENAI_MOE: attention with
biases on Q, K, V and the output, one learned *sink* logit per head that joins every softmax,
sliding-window layers alternating with global ones, YaRN, and a mixture of experts in every
layer:

- the router has a bias; it picks the top `expert_used_count` experts by its raw logits and
  weights them by a softmax over the picked ones (SOFTMAX_WEIGHT gating);
- the experts (MXFP4 in the released files) have biases, added per selected expert
  (add_id), and the clamped SwiGLU of gpt-oss (alpha 1.702, limit 7);
- the FFN's input norm is stored as `post_attention_norm`.

Layers 0, 2, 4 ... see the last `attention.sliding_window` positions (pattern 2 unless the
file's `attention.sliding_window_pattern` says otherwise); the windowed layers use
`rope.freq_base_swa` when the file has it. Mirrors llama.cpp's src/models/openai-moe.cpp.
"""
from __future__ import annotations

import math

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.hparams import HParams, HParamsError, MetadataReader, load_experts, require_rms_eps
from llama.kv_cells import SWAType
from llama.models.decoder_tensors import add_embd_output
from llama.moe import Gating, build_moe_ffn
from llama.weights import Need, TensorTable

DEFAULT_SWA_PATTERN = 2


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)
    load_experts(r, hp)
    if not hp.n_ff_exp:
        raise HParamsError(f"required key {r.key('expert_feed_forward_length')} is missing")
    hp.n_swa = r.int("attention.sliding_window", required=True)
    if hp.n_swa <= 0:
        raise HParamsError(f"{r.key('attention.sliding_window')} must be > 0, got {hp.n_swa}")
    hp.extra["swa_type"] = int(SWAType.STANDARD)
    pattern = r.get("attention.sliding_window_pattern", DEFAULT_SWA_PATTERN)
    if isinstance(pattern, (list, tuple)):   # one flag per layer
        if len(pattern) != hp.n_layer:
            raise HParamsError(f"{r.key('attention.sliding_window_pattern')} has {len(pattern)} entries "
                               f"for {hp.n_layer} layers")
        hp.swa_layers = [bool(v) for v in pattern]
    else:
        hp.set_swa_pattern(int(pattern))
    hp.rope_freq_base_swa = float(r.get("rope.freq_base_swa", hp.rope_freq_base))
    hp.rope_freq_scale_swa = hp.rope_freq_scale


def tensors(hp: HParams, t: TensorTable) -> None:
    add_embd_output(hp, t, output=False)
    t.add("output", "output.weight", (hp.n_embd, hp.n_vocab))
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (hp.n_embd,))
        t.add_attention(il, hp, qkv_bias=Need.OPTIONAL, out_bias=Need.REQUIRED)
        t.add_layer(il, "attn_sinks", "attn_sinks.weight", (hp.n_head[il],))
        t.add_layer(il, "attn_post_norm", "post_attention_norm.weight", (hp.n_embd,))
        t.add_moe_ffn(il, hp.n_embd, hp.n_ff_exp, hp.n_expert, biases=Need.REQUIRED)


def build(g: LlmGraph) -> Tensor:
    hp, m, b = g.hp, g.model, g.b
    inp_l = g.build_inp_embd(m.w.tok_embd)
    inp = g.build_layer_inputs()
    kq_scale = 1.0 / math.sqrt(hp.n_rot)
    for il, layer in enumerate(m.layers):
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        q, k, v = g.build_qkv_rope(layer, cur, inp.pos, hp.rope_args(il), il)
        cur = g.build_attn(inp.attn, layer.wo, layer.bo, q, k, v, kq_scale, il, sinks=layer.attn_sinks)
        cur, inp_sa = g.select_out_rows(cur, inp_l, inp.out_ids, il)
        ffn_inp = g.cb(b.add(cur, inp_sa), "ffn_inp", il)
        cur = g.cb(g.build_norm(ffn_inp, layer.attn_post_norm, None, NormType.RMS, il), "attn_post_norm", il)
        cur = build_moe_ffn(g, cur, layer, FfnOp.SWIGLU_OAI, False, il, Gating.SOFTMAX_WEIGHT)
        inp_l = g.cb(b.add(cur, ffn_inp), "l_out", il)
    return g.build_output(inp_l, m.w.output_norm, m.w.output)


register(Architecture("gpt-oss", load_hparams, tensors, build))
