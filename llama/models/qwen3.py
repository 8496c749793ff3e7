"""Qwen 3: LLaMA's block with per-head RMS norms on Q and K (before RoPE), NeoX RoPE and no
projection biases.

Mirrors llama.cpp's src/models/qwen3.cpp. The head size comes from
`qwen3.attention.key_length` and need not be n_embd / n_head (Qwen3-0.6B: 16 heads of 128
in a 1024-wide model), so the Q projection and the attention output have their own widths.
The graph is LLaMA's (build_llama), which applies the layers' q/k norms.
"""
from __future__ import annotations

from ggmlpy.ir import Tensor
from ggmlpy.ir.ops.rope import ROPE_TYPE_NEOX
from llama.arch import Architecture, register
from llama.graph import LlmGraph
from llama.hparams import HParams, HParamsError, MetadataReader, require_rms_eps
from llama.models.decoder_tensors import add_decoder_layer, add_embd_output
from llama.models.llama import build_llama
from llama.weights import Need, TensorTable


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    hp.rope_type = ROPE_TYPE_NEOX
    require_rms_eps(r, hp)
    if hp.n_embd_head_k != hp.n_embd_head_v or hp.n_rot != hp.n_embd_head_k:
        raise HParamsError(f"qwen3: key_length {hp.n_embd_head_k}, value_length {hp.n_embd_head_v} "
                           f"and rope.dimension_count {hp.n_rot} must be equal")


def tensors(hp: HParams, t: TensorTable) -> None:
    add_embd_output(hp, t)
    for il in range(hp.n_layer):
        add_decoder_layer(hp, t, il, qk_norm=Need.REQUIRED)


def build(g: LlmGraph) -> Tensor:
    return build_llama(g, None, None)


register(Architecture("qwen3", load_hparams, tensors, build))
