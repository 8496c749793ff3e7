"""Gemma 2: Gemma with sandwich norms, logit soft-capping and alternating sliding windows.

Mirrors llama.cpp's src/models/gemma2-iswa.cpp and the LLM_ARCH_GEMMA2 cases of
load_hparams and load_tensors:
- token embeddings are multiplied by sqrt(n_embd); RMSNorm weights hold 1 + w already;
- even layers see the last `sliding_window` positions (default 4096), odd layers all of
  them (`attention.sliding_window_pattern`, default 2: every 2nd layer is global); the
  windowed layers rotate with `rope.freq_base_swa` when given, else the global base;
- Q is scaled by 1/sqrt(head_dim) (1/sqrt(n_embd/n_head) for the 27B) and the attention
  scores are soft-capped, tanh(s / c) * c with c = `attn_logit_softcapping` (default 50);
- the attention and FFN outputs are RMS-normalised again before their residual adds; the
  FFN is GELU(tanh)-gated;
- the logits are soft-capped with `final_logit_softcapping` (default 30); the output
  projection is the token embedding.
"""
from __future__ import annotations

import math

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.hparams import HParams, HParamsError, MetadataReader, require_rms_eps
from llama.kv_cells import SWAType
from llama.weights import TensorTable

DEFAULT_N_SWA = 4096
DEFAULT_SWA_PATTERN = 2
DEFAULT_ATTN_SOFTCAP = 50.0
DEFAULT_FINAL_SOFTCAP = 30.0


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)
    hp.n_swa = r.int("attention.sliding_window", DEFAULT_N_SWA)
    if hp.n_swa <= 0:
        raise HParamsError(f"{r.key('attention.sliding_window')} must be > 0, got {hp.n_swa}")
    hp.extra["swa_type"] = int(SWAType.STANDARD)
    hp.set_swa_pattern(r.int("attention.sliding_window_pattern", DEFAULT_SWA_PATTERN))
    hp.rope_freq_base_swa = float(r.get("rope.freq_base_swa", hp.rope_freq_base))
    hp.rope_freq_scale_swa = hp.rope_freq_scale
    hp.f_attn_logit_softcapping = float(r.get("attn_logit_softcapping", DEFAULT_ATTN_SOFTCAP))
    hp.f_final_logit_softcapping = float(r.get("final_logit_softcapping", DEFAULT_FINAL_SOFTCAP))
    if hp.f_attn_logit_softcapping <= 0 or hp.f_final_logit_softcapping <= 0:
        raise HParamsError(f"gemma2: soft-capping values must be > 0, got "
                           f"{hp.f_attn_logit_softcapping} and {hp.f_final_logit_softcapping}")
    is_27b = hp.n_layer == 46
    hp.f_attention_scale = 1.0 / math.sqrt(hp.n_embd / hp.n_head[0] if is_27b else hp.n_embd_head_k)


def tensors(hp: HParams, t: TensorTable) -> None:
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    t.add("tok_embd", "token_embd.weight", (n_embd, n_vocab))  # also the output projection
    t.add("output_norm", "output_norm.weight", (n_embd,))
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_attention(il, hp)
        t.add_layer(il, "attn_post_norm", "post_attention_norm.weight", (n_embd,))
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
        t.add_gated_ffn(il, n_embd, hp.n_ff[il])
        t.add_layer(il, "ffn_post_norm", "post_ffw_norm.weight", (n_embd,))


def build(g: LlmGraph) -> Tensor:
    b, hp, m = g.b, g.hp, g.model
    inp_l = g.build_inp_embd(m.w.tok_embd)
    inp_l = g.cb(b.scale(inp_l, math.sqrt(hp.n_embd)), "inp_scaled")
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(m.layers):
        rope = hp.rope_args(il)
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        q, k, v = g.build_qkv_rope(layer, cur, inp_pos, rope, il)
        q = g.cb(b.scale(q, hp.f_attention_scale), "Qcur_scaled", il)

        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0, il,
                           softcap=hp.f_attn_logit_softcapping)
        cur, inp_l = g.select_out_rows(cur, inp_l, inp_out_ids, il)
        cur = g.cb(g.build_norm(cur, layer.attn_post_norm, None, NormType.RMS, il), "attn_post_norm", il)
        sa_out = g.cb(b.add(cur, inp_l), "sa_out", il)

        cur = g.cb(g.build_norm(sa_out, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, FfnOp.GELU, il)
        cur = g.cb(g.build_norm(cur, layer.ffn_post_norm, None, NormType.RMS, il), "ffn_post_norm", il)
        inp_l = g.cb(b.add(cur, sa_out), "l_out", il)

    cur = g.cb(g.build_norm(inp_l, m.w.output_norm, None, NormType.RMS), "result_norm")
    logits = g.build_lora_mm(m.w.tok_embd, cur)
    cap = hp.f_final_logit_softcapping
    return b.scale(b.tanh(b.scale(logits, 1.0 / cap)), cap)


register(Architecture("gemma2", load_hparams, tensors, build))
