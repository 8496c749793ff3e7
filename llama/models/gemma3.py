"""Gemma 3: interleaved sliding-window and global attention, q/k norms, sandwich norms, GeGLU.

Mirrors llama.cpp's src/models/gemma3.cpp and the LLM_ARCH_GEMMA3 cases of load_hparams and
load_tensors:
- the token embedding is scaled by sqrt(n_embd) (not embeddings given as input);
- every 6th layer is global, the others see the last `sliding_window` positions and rotate
  with their own RoPE base (10000; the global layers use `rope.freq_base`), NeoX RoPE;
- Q and K are RMS-normalised per head before RoPE; Q is then scaled by f_attention_scale
  (1/sqrt(head_dim), or 1/sqrt(n_embd/n_head) for the 27B) and attention uses scale 1;
- the attention and FFN outputs are RMS-normalised again (post_attention_norm,
  post_ffw_norm) before their residual adds; the FFN is GELU(tanh)-gated;
- the output projection is tied to the embedding when `output.weight` is absent.
Gemma's RMSNorm multiplies by (1 + w); the converter stores 1 + w in the GGUF, so the
weights are used as they are. A Gemma 3 file without a window (embedding variants) has no
SWA layers and soft-caps the final logits when the file says so.
"""
from __future__ import annotations

import math

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph, NormType
from llama.hparams import HParams, HParamsError, MetadataReader, require_rms_eps
from llama.kv_cells import SWAType
from llama.weights import Need, TensorTable

SWA_PATTERN = 6            # layers 5, 11, 17, ... are global
ROPE_FREQ_BASE_SWA = 10000.0


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    n_swa = r.int("attention.sliding_window", 0)
    if n_swa < 0:
        raise HParamsError(f"{r.key('attention.sliding_window')} must be >= 0, got {n_swa}")
    if n_swa > 0:
        hp.n_swa = n_swa
        hp.extra["swa_type"] = int(SWAType.STANDARD)
        hp.set_swa_pattern(SWA_PATTERN)
        hp.rope_freq_base_swa = ROPE_FREQ_BASE_SWA
        hp.rope_freq_scale_swa = 1.0
    else:
        hp.n_swa = 0
        hp.extra["swa_type"] = int(SWAType.NONE)
        hp.swa_layers = [False] * hp.n_layer
    hp.f_final_logit_softcapping = float(r.get("final_logit_softcapping", 0.0))
    require_rms_eps(r, hp)
    is_27b = hp.n_layer == 62
    hp.f_attention_scale = 1.0 / math.sqrt(hp.n_embd / hp.n_head[0] if is_27b else hp.n_embd_head_k)


def tensors(hp: HParams, t: TensorTable) -> None:
    n_embd, n_vocab = hp.n_embd, hp.n_vocab
    t.add("tok_embd", "token_embd.weight", (n_embd, n_vocab))
    t.add("output_norm", "output_norm.weight", (n_embd,))
    t.add("output", "output.weight", (n_embd, n_vocab), optional=True)  # absent: tied embeddings
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_attention(il, hp, qk_norm=Need.REQUIRED)
        t.add_layer(il, "attn_post_norm", "post_attention_norm.weight", (n_embd,))
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
        t.add_gated_ffn(il, n_embd, hp.n_ff[il])
        t.add_layer(il, "ffn_post_norm", "post_ffw_norm.weight", (n_embd,))


def build(g: LlmGraph) -> Tensor:
    b, hp, m = g.b, g.hp, g.model
    inp_l = g.build_inp_embd(m.w.tok_embd)
    if not g.params.use_embd:  # raw embeddings (e.g. of images) are used as they are
        inp_l = g.cb(b.scale(inp_l, math.sqrt(hp.n_embd)), "inp_scaled")
    inp_pos = g.build_inp_pos()
    inp_attn = g.build_attn_inp_kv()
    inp_out_ids = g.build_inp_out_ids()

    for il, layer in enumerate(m.layers):
        rope = hp.rope_args(il)
        cur = g.cb(g.build_norm(inp_l, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        q, k, v = g.build_qkv_rope(layer, cur, inp_pos, rope, il)
        q = g.cb(b.scale(q, hp.f_attention_scale), "Qcur_scaled", il)

        cur = g.build_attn(inp_attn, layer.wo, None, q, k, v, 1.0, il)
        cur, inp_l = g.select_out_rows(cur, inp_l, inp_out_ids, il)
        cur = g.cb(g.build_norm(cur, layer.attn_post_norm, None, NormType.RMS, il), "attn_post_norm", il)
        sa_out = g.cb(b.add(cur, inp_l), "sa_out", il)

        cur = g.cb(g.build_norm(sa_out, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
        cur = g.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, FfnOp.GELU, il)
        cur = g.cb(g.build_norm(cur, layer.ffn_post_norm, None, NormType.RMS, il), "ffn_post_norm", il)
        inp_l = g.cb(b.add(cur, sa_out), "l_out", il)

    cur = g.cb(g.build_norm(inp_l, m.w.output_norm, None, NormType.RMS), "result_norm")
    logits = g.build_lora_mm(m.w.output or m.w.tok_embd, cur)
    cap = hp.f_final_logit_softcapping
    if cap and not any(hp.swa_layers):  # llama.cpp caps only the variant without a window
        logits = b.scale(b.tanh(b.scale(logits, 1.0 / cap)), cap)
    return logits


register(Architecture("gemma3", load_hparams, tensors, build))
