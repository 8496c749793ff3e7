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
from llama.graph import FfnOp, LlmGraph
from llama.hparams import HParams, HParamsError, MetadataReader, require_rms_eps
from llama.kv_cells import SWAType
from llama.models.decoder_tensors import add_decoder_layer, add_embd_output
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
    add_embd_output(hp, t, output=False)  # tok_embd is also the output projection
    for il in range(hp.n_layer):
        add_decoder_layer(hp, t, il, post_norms=True)


def build(g: LlmGraph) -> Tensor:
    hp, m = g.hp, g.model
    inp_l = g.build_inp_embd_scaled(m.w.tok_embd, scale_input_embd=True)
    inp = g.build_layer_inputs()

    for il, layer in enumerate(m.layers):
        sa_out = g.build_attn_block(inp, layer, inp_l, hp.rope_args(il), 1.0, il,
                                    q_scale=hp.f_attention_scale, softcap=hp.f_attn_logit_softcapping,
                                    post_norm=layer.attn_post_norm, name="sa_out")
        inp_l = g.build_ffn_block(layer, sa_out, FfnOp.GELU, il, post_norm=layer.ffn_post_norm)

    logits = g.build_output(inp_l, m.w.output_norm, m.w.tok_embd)
    return g.build_softcap(logits, hp.f_final_logit_softcapping)


register(Architecture("gemma2", load_hparams, tensors, build))
