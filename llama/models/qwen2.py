"""Qwen 2: LLaMA's block with biases on the Q, K and V projections and NeoX RoPE.

Mirrors llama.cpp's src/models/qwen2.cpp and the LLM_ARCH_QWEN2 cases of load_hparams and
load_tensors: the q/k/v biases are required (they are what sets Qwen 2 apart), an
attention-output bias is used when present, the output projection is tied to the
embedding when `output.weight` is absent, and an optional `output.bias` is added to the
logits. Qwen's rotary embedding rotates the two halves of a head (NeoX), so the converter
does not permute Q and K as it does for LLaMA. The graph is LLaMA's (build_llama), which
adds the layers' biases and the output bias.
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import LlmGraph
from llama.hparams import HParams, MetadataReader, require_rms_eps
from llama.models.decoder_tensors import add_decoder_layer, add_embd_output
from llama.models.llama import build_llama
from llama.weights import Need, TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)


def tensors(hp: HParams, t: TensorTable) -> None:
    add_embd_output(hp, t, output_bias=True)
    for il in range(hp.n_layer):
        add_decoder_layer(hp, t, il, qkv_bias=Need.REQUIRED, out_bias=Need.OPTIONAL)


def build(g: LlmGraph) -> Tensor:
    return build_llama(g, None, g.model.w.output_b)


register(Architecture("qwen2", load_hparams, tensors, build))
