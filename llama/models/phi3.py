"""Phi-3: fused QKV and gate/up projections, NeoX RoPE over the first `n_rot` dimensions.

Mirrors llama.cpp's src/models/phi3.cpp and the LLM_ARCH_PHI3 cases of load_hparams and
load_tensors:
- `attn_qkv.weight` projects to [Q | K | V] in one matmul (rows n_q, n_k, n_v); the three
  are views of the result. Files with separate `attn_q/k/v.weight` work too;
- `ffn_up.weight` holds [gate | up] (2 * n_ff rows): the FFN is down(silu(gate) * up);
- RoPE rotates the halves of the first `rope.dimension_count` dimensions of each head and
  passes the rest through (Phi-4-mini's partial rotary factor of 0.75);
- `rope_factors_short/long.weight` (LongRoPE, the 128k models) divide the frequencies: the
  long ones when the context exceeds the original training context, as llama.cpp's
  get_rope_factors (which counts per sequence; the graph sees the whole cache), with
  `rope.scaling.attn_factor` as the magnitude correction;
- Q is scaled by 1/sqrt(head_dim) before attention, which then uses scale 1;
- a sliding window in the file is ignored, as llama.cpp does (its converter does not yet
  record which layers use it).
"""
from __future__ import annotations

import math

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import LlmGraph, NormType
from llama.hparams import HParams, HParamsError, MetadataReader, require_rms_eps
from llama.kshift import rope_factors as kshift_rope_factors
from llama.kv_cells import SWAType
from llama.models.decoder_tensors import add_embd_output
from llama.weights import Need, TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)
    if hp.n_embd_head_k != hp.n_embd_head_v:
        raise HParamsError(f"phi3: key_length {hp.n_embd_head_k} and value_length "
                           f"{hp.n_embd_head_v} must be equal")
    hp.n_swa = 0
    hp.swa_layers = [False] * hp.n_layer
    hp.extra["swa_type"] = int(SWAType.NONE)


def tensors(hp: HParams, t: TensorTable) -> None:
    n_embd = hp.n_embd
    add_embd_output(hp, t, output_bias=True)
    t.add("rope_long", "rope_factors_long.weight", (hp.n_rot // 2,), optional=True)
    t.add("rope_short", "rope_factors_short.weight", (hp.n_rot // 2,), optional=True)
    for il in range(hp.n_layer):
        t.add_layer(il, "attn_norm", "attn_norm.weight", (n_embd,))
        t.add_attention(il, hp, qkv=Need.OPTIONAL, fused_qkv=Need.OPTIONAL)  # either one
        t.add_layer(il, "ffn_norm", "ffn_norm.weight", (n_embd,))
        t.add_layer(il, "ffn_up", "ffn_up.weight", (n_embd, 2 * hp.n_ff[il]))
        t.add_layer(il, "ffn_down", "ffn_down.weight", (hp.n_ff[il], n_embd))


def build_ffn_fused(g: LlmGraph, layer, cur: Tensor, il: int) -> Tensor:
    """down(silu(gate) * up) with gate and up the two halves of one projection."""
    b, n_ff = g.b, g.hp.n_ff[il]
    gate_up = g.cb(g.build_lora_mm(layer.ffn_up, cur), "ffn_up", il)
    n_tokens, esz, row = gate_up.ne[1], gate_up.nb[0], gate_up.nb[1]
    gate = b.cont(b.view(gate_up, (n_ff, n_tokens), (row,), 0), n_ff, n_tokens)
    up = b.cont(b.view(gate_up, (n_ff, n_tokens), (row,), esz * n_ff), n_ff, n_tokens)
    cur = g.cb(b.swiglu(gate, up), "ffn_swiglu", il)
    return g.cb(g.build_lora_mm(layer.ffn_down, cur), "ffn_out", il)


def rope_factors(g: LlmGraph):
    """LongRoPE's frequency factors for this context size (None for ordinary files); the
    K-shift graph rotates with the same ones (one rule: llama/kshift.py)."""
    return kshift_rope_factors(g.model, g.kv)


def build(g: LlmGraph) -> Tensor:
    b, hp, m = g.b, g.hp, g.model
    inp_l = g.build_inp_embd(m.w.tok_embd)
    inp = g.build_layer_inputs()
    rope = hp.rope_args()
    freqs = g.w(rope_factors(g))
    q_scale = 1.0 / math.sqrt(hp.n_embd_head_k)

    for il, layer in enumerate(m.layers):
        residual = g.build_attn_block(inp, layer, inp_l, rope, 1.0, il, freqs, q_scale=q_scale)
        cur = g.cb(g.build_norm(residual, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
        cur = build_ffn_fused(g, layer, cur, il)
        inp_l = g.cb(b.add(residual, cur), "l_out", il)

    return g.build_output(inp_l, m.w.output_norm, m.w.output or m.w.tok_embd, m.w.output_b)


register(Architecture("phi3", load_hparams, tensors, build))
