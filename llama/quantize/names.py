"""Tensor names as llama-quantize reads them: broad roles (tensor_get_category), the loader's
order (weight_name_comparer) and the tensors it never quantises (tensor_allows_quantization).

Kept apart from the type rules because they are plain string tests on names, the part most
likely to grow as llama.cpp learns new architectures.
"""
from __future__ import annotations

import re
from typing import Protocol

# tensor categories (llama-quant.cpp's tensor_category)
TOKEN_EMBD, ATTN_Q, ATTN_V, ATTN_K, ATTN_QKV, ATTN_KV_B, ATTN_OUTPUT = range(7)
FFN_UP, FFN_GATE, FFN_DOWN, OUTPUT, OTHER = range(7, 12)
ATTN_V_LIKE = (ATTN_V, ATTN_QKV, ATTN_KV_B)   # more sensitive to quantization

_BLK = re.compile(r"blk\.\s*([+-]?\d+)")   # sscanf(name, "blk.%d.", &i)

# substrings of tensor names never quantised (tensor_allows_quantization)
_KEEP_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
    "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
    "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
    "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
    "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
    "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
)
_KEEP_NAMES = ("position_embd.weight", "token_types.weight")   # BERT's, by LLM_TN
_KEEP_GLM5_NEXT = (
    "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight",
    "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight",
)


class CopyParams(Protocol):
    """The options allows_quantization reads (rules.Params)."""

    only_copy: bool
    quantize_output_tensor: bool


def layer_of(name: str) -> int | None:
    """The block number of blk.N.* names, None for the others (output, token_embd, ...)."""
    m = _BLK.match(name)
    return int(m.group(1)) if m else None


def sort_key(name: str) -> tuple[int, bytes]:
    """The loader's weight_name_comparer: block number (-1 outside blocks), then the name."""
    layer = layer_of(name)
    return (-1 if layer is None else layer, name.encode("utf-8", "surrogateescape"))


def category(name: str) -> int:
    """tensor_get_category: broad roles by name, in llama.cpp's order of tests."""
    if name == "output.weight":
        return OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return TOKEN_EMBD
    for part, cat in (("attn_qkv.weight", ATTN_QKV), ("attn_kv_b.weight", ATTN_KV_B), ("attn_v.weight", ATTN_V),
                      ("attn_k.weight", ATTN_K), ("attn_q.weight", ATTN_Q), ("attn_output.weight", ATTN_OUTPUT),
                      ("ffn_up", FFN_UP), ("ffn_gate", FFN_GATE), ("ffn_down", FFN_DOWN)):
        if part in name:
            return cat
    return OTHER


def n_dims(ne: tuple[int, ...]) -> int:
    """ggml_n_dims: dimensions up to the last one above 1 (at least 1)."""
    for i in range(len(ne) - 1, 0, -1):
        if ne[i] > 1:
            return i + 1
    return 1


def allows_quantization(params: CopyParams, arch: str, name: str, ne: tuple[int, ...]) -> bool:
    """tensor_allows_quantization: 2-D and 3-D weights, but for norms, routers, positional and
    other small or sensitive tensors that llama.cpp always keeps as they are."""
    if params.only_copy or n_dims(ne) < 2 or not name.endswith("weight"):
        return False
    if name == "output.weight" and not params.quantize_output_tensor:
        return False
    if name in _KEEP_NAMES or any(s in name for s in _KEEP_SUBSTRINGS):
        return False
    return not (arch == "glm5-next" and any(s in name for s in _KEEP_GLM5_NEXT))
