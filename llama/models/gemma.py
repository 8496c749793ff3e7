"""Gemma (1): the LLaMA block with GELU, Gemma's embedding scale and tied embeddings.

Mirrors llama.cpp's src/models/gemma.cpp and the LLM_ARCH_GEMMA cases of load_hparams and
load_tensors:
- token embeddings are multiplied by sqrt(n_embd) (embeddings given as input are not);
- RMSNorm multiplies by (1 + w): the converter stores 1 + w, so the weights are used as
  they are;
- NeoX RoPE; the head size comes from `gemma.attention.key_length` (Gemma 7B: 16 heads of
  256 in a 3072-wide model); Q is scaled by 1/sqrt(head_dim) and attention uses scale 1;
- the FFN is GELU(tanh)-gated; the output projection is always the token embedding.
"""
from __future__ import annotations

import math

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import FfnOp, LlmGraph
from llama.hparams import HParams, MetadataReader, require_rms_eps
from llama.models.decoder_tensors import add_decoder_layer, add_embd_output
from llama.weights import TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)


def tensors(hp: HParams, t: TensorTable) -> None:
    add_embd_output(hp, t, output=False)  # tok_embd is also the output projection
    for il in range(hp.n_layer):
        add_decoder_layer(hp, t, il)


def build(g: LlmGraph) -> Tensor:
    hp, m = g.hp, g.model
    inp_l = g.build_inp_embd_scaled(m.w.tok_embd)
    inp = g.build_layer_inputs()
    rope = hp.rope_args()
    q_scale = 1.0 / math.sqrt(hp.n_embd_head_k)

    for il, layer in enumerate(m.layers):
        sa_out = g.build_attn_block(inp, layer, inp_l, rope, 1.0, il, q_scale=q_scale, name="sa_out")
        inp_l = g.build_ffn_block(layer, sa_out, FfnOp.GELU, il)

    return g.build_output(inp_l, m.w.output_norm, m.w.tok_embd)


register(Architecture("gemma", load_hparams, tensors, build))
