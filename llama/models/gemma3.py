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
from llama.graph import FfnOp, LlmGraph
from llama.hparams import HParams, HParamsError, MetadataReader, require_rms_eps
from llama.kv_cells import SWAType
from llama.models.decoder_tensors import add_decoder_layer, add_embd_output
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
    add_embd_output(hp, t)
    for il in range(hp.n_layer):
        add_decoder_layer(hp, t, il, post_norms=True, qk_norm=Need.REQUIRED)


def build(g: LlmGraph) -> Tensor:
    hp, m = g.hp, g.model
    inp_l = g.build_inp_embd_scaled(m.w.tok_embd)
    inp = g.build_layer_inputs()

    for il, layer in enumerate(m.layers):
        sa_out = g.build_attn_block(inp, layer, inp_l, hp.rope_args(il), 1.0, il,
                                    q_scale=hp.f_attention_scale, post_norm=layer.attn_post_norm,
                                    name="sa_out")
        inp_l = g.build_ffn_block(layer, sa_out, FfnOp.GELU, il, post_norm=layer.ffn_post_norm)

    logits = g.build_output(inp_l, m.w.output_norm, m.w.output or m.w.tok_embd)
    cap = hp.f_final_logit_softcapping
    if cap and not any(hp.swa_layers):  # llama.cpp caps only the variant without a window
        logits = g.build_softcap(logits, cap)
    return logits


register(Architecture("gemma3", load_hparams, tensors, build))
