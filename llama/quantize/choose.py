"""The type each tensor is written as: llama.cpp's llama_tensor_get_type and, for the named
mixes, llama_tensor_get_type_impl's rules.

The rules are transcribed branch by branch in llama.cpp's order (the first branch that
matches wins, and some branches advance counters whatever they choose), because output equal
to llama-quantize's byte for byte needs exactly its choices, quirks included: Q3_K_M's
"i_attention_wv < 2" counts attn_v tensors, not layers, and with experts the layer comes from
the tensor name instead of the counter.
"""
from __future__ import annotations

from ggmlpy.ir.types import GGMLType, block_size, is_quantized
from llama.quantize import mixes as F
from llama.quantize.mixes import ggml_name
from llama.quantize.names import (ATTN_K, ATTN_OUTPUT, ATTN_Q, ATTN_V_LIKE, FFN_DOWN, FFN_GATE, FFN_UP, OUTPUT,
                                  TOKEN_EMBD, allows_quantization, category, layer_of)
from llama.quantize.rules import State, fallback

T = GGMLType

_IQ2_FAMILY = (F.MOSTLY_IQ2_XXS, F.MOSTLY_IQ2_XS, F.MOSTLY_IQ1_S, F.MOSTLY_IQ2_S, F.MOSTLY_IQ2_M, F.MOSTLY_IQ1_M)
_OUTPUT_Q5_K = (F.MOSTLY_IQ2_XXS, F.MOSTLY_IQ2_XS, F.MOSTLY_IQ3_XXS, F.MOSTLY_IQ1_S, F.MOSTLY_IQ2_S,
                F.MOSTLY_IQ2_M, F.MOSTLY_IQ1_M)
_MOE8_ATTN_OUTPUT_Q5_K = (F.MOSTLY_Q2_K, F.MOSTLY_IQ3_XS, F.MOSTLY_IQ3_XXS, F.MOSTLY_Q3_K_S, F.MOSTLY_Q3_K_M,
                          F.MOSTLY_IQ4_NL, F.MOSTLY_Q4_K_S, F.MOSTLY_Q4_K_M, F.MOSTLY_IQ3_S, F.MOSTLY_IQ3_M,
                          F.MOSTLY_IQ4_XS)
_ATTN_OUTPUT = {F.MOSTLY_Q2_K: T.Q3_K, F.MOSTLY_IQ3_XXS: T.IQ3_S, F.MOSTLY_Q3_K_M: T.Q4_K,
                F.MOSTLY_Q3_K_L: T.Q5_K, F.MOSTLY_IQ3_M: T.Q4_K}


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """The layers that get more bits: the first and last eighth, and every third between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _layer_info(state: State, counter: int, n_layer: int, name: str) -> tuple[int, int]:
    """(layer, layers): the counter, or with experts the block number in the name (Mixtral's
    experts are not stored in layer order)."""
    if max(1, state.model.n_expert) > 1:
        layer = layer_of(name)
        if layer is None:
            raise ValueError(f"tensor {name}: failed to determine its layer")
        if not 0 <= layer < n_layer:
            raise ValueError(f"tensor {name}: bad layer {layer}, must be in [0, {n_layer})")
        return layer, n_layer
    return counter, n_layer


def _output_like(state: State, new: GGMLType, ne: tuple[int, ...]) -> GGMLType:
    """output.weight, and token_embd.weight when it doubles as the output (tied)."""
    ftype, params = state.params.ftype, state.params
    if params.output_tensor_type is not None:
        return params.output_tensor_type
    if ftype == F.MOSTLY_MXFP4_MOE or state.model.arch == "falcon" or ne[0] % block_size(new):
        return T.Q8_0
    if ftype in _OUTPUT_Q5_K:
        return T.Q5_K
    return new if new == T.Q8_0 else T.Q6_K


def _iq2_family(state: State, new: GGMLType, cat: int) -> GGMLType:
    """The IQ1/IQ2 mixes: attn_v, attn_k (8 experts), the first eighth of ffn_down, attn_output."""
    ftype, m = state.params.ftype, state.model
    iq2_s = ftype in (F.MOSTLY_IQ2_S, F.MOSTLY_IQ2_M)
    if cat in ATTN_V_LIKE:
        new = T.Q4_K if m.n_gqa >= 4 or m.n_expert >= 4 else (T.IQ3_S if iq2_s else T.Q2_K)
        state.i_attention_wv += 1
    elif m.n_expert == 8 and cat == ATTN_K:
        new = T.Q4_K
    elif cat == FFN_DOWN:
        if state.i_ffn_down < state.n_ffn_down // 8:
            new = T.IQ3_S if iq2_s else T.Q2_K
        state.i_ffn_down += 1
    elif cat == ATTN_OUTPUT:
        if m.n_expert == 8:
            new = T.Q5_K
        elif ftype in (F.MOSTLY_IQ1_S, F.MOSTLY_IQ1_M):
            new = T.IQ2_XXS
        elif iq2_s:
            new = T.IQ3_S
    return new


def _attn_v(state: State, new: GGMLType) -> GGMLType:
    ftype, m = state.params.ftype, state.model
    gqa4 = m.n_gqa >= 4
    if ftype == F.MOSTLY_Q2_K:
        new = T.Q4_K if gqa4 else T.Q3_K
    elif ftype == F.MOSTLY_Q2_K_S and gqa4:
        new = T.Q4_K
    elif ftype == F.MOSTLY_IQ3_XXS:
        new = T.Q4_K if gqa4 else (T.IQ3_XXS if state.has_imatrix else T.IQ3_S)
    elif ftype in (F.MOSTLY_IQ3_XS, F.MOSTLY_IQ3_S) and gqa4:
        new = T.Q4_K
    elif ftype == F.MOSTLY_IQ3_M:
        new = T.Q4_K
    elif ftype == F.MOSTLY_Q3_K_M:
        new = T.Q5_K if state.i_attention_wv < 2 else T.Q4_K
    elif ftype == F.MOSTLY_Q3_K_L:
        new = T.Q5_K
    elif ftype in (F.MOSTLY_IQ4_NL, F.MOSTLY_IQ4_XS) and gqa4:
        new = T.Q5_K
    elif ftype in (F.MOSTLY_Q4_K_M, F.MOSTLY_Q5_K_M) and use_more_bits(state.i_attention_wv, state.n_attention_wv):
        new = T.Q6_K
    elif ftype == F.MOSTLY_Q4_K_S and state.i_attention_wv < 4:
        new = T.Q5_K
    if m.is_70b and new in (T.Q3_K, T.Q4_K):
        new = T.Q5_K   # 8 heads share attn_v there: more bits for a small tensor
    if m.n_expert == 8:
        new = T.Q8_0
    state.i_attention_wv += 1
    return new


def _ffn_down(state: State, new: GGMLType, name: str) -> GGMLType:
    ftype, m = state.params.ftype, state.model
    i_layer, n_layer = _layer_info(state, state.i_ffn_down, state.n_ffn_down, name)
    falcon = m.arch == "falcon"
    more = use_more_bits(i_layer, n_layer)
    if ftype == F.MOSTLY_Q2_K:
        new = T.Q3_K
    elif ftype == F.MOSTLY_Q2_K_S:
        if i_layer < n_layer // 8:
            new = T.Q4_K
    elif ftype == F.MOSTLY_IQ3_XXS and not state.has_imatrix:
        new = T.Q4_K if i_layer < n_layer // 8 else T.Q3_K
    elif ftype == F.MOSTLY_Q3_K_M:
        new = T.Q5_K if i_layer < n_layer // 16 else (T.Q4_K if not falcon or more else T.Q3_K)
    elif ftype == F.MOSTLY_IQ3_M and (i_layer < n_layer // 8 or (m.n_expert == 8 and more)):
        new = T.Q4_K
    elif ftype == F.MOSTLY_Q3_K_L:
        new = T.Q4_K if falcon else T.Q5_K
    elif ftype == F.MOSTLY_Q4_K_M:
        if falcon:
            new = T.Q6_K if i_layer < n_layer // 16 else (T.Q5_K if more else T.Q4_K)
        elif more:
            new = T.Q6_K
    elif (i_layer < n_layer // 8 and ftype in (F.MOSTLY_IQ4_NL, F.MOSTLY_IQ4_XS)
          and not state.has_imatrix):
        new = T.Q5_K
    elif ftype == F.MOSTLY_Q5_K_M and more:
        new = T.Q6_K
    elif ftype == F.MOSTLY_Q4_K_S and not falcon and i_layer < n_layer // 8:
        new = T.Q5_K
    elif ftype in (F.MOSTLY_Q4_0, F.MOSTLY_Q5_0) and state.has_imatrix and i_layer < n_layer // 8:
        new = T.Q4_1 if ftype == F.MOSTLY_Q4_0 else T.Q5_1
    state.i_ffn_down += 1
    return new


def _attn_output(state: State, new: GGMLType) -> GGMLType:
    ftype, m = state.params.ftype, state.model
    if m.arch == "falcon":
        return T.Q4_K if ftype == F.MOSTLY_Q3_K_L else new
    if m.n_expert == 8:
        return T.Q5_K if ftype in _MOE8_ATTN_OUTPUT_Q5_K else new
    return _ATTN_OUTPUT.get(ftype, new)


def _gate_up(state: State, new: GGMLType, name: str, up: bool) -> GGMLType:
    counter, n = (state.i_ffn_up, state.n_ffn_up) if up else (state.i_ffn_gate, state.n_ffn_gate)
    i_layer, n_layer = _layer_info(state, counter, n, name)
    if state.params.ftype == F.MOSTLY_IQ3_XS and n_layer // 8 <= i_layer < 7 * n_layer // 8:
        new = T.IQ3_XXS
    if up:
        state.i_ffn_up += 1
    else:
        state.i_ffn_gate += 1
    return new


def mix_type(state: State, new: GGMLType, name: str, ne: tuple[int, ...], cat: int) -> GGMLType:
    """llama_tensor_get_type_impl: the mix's refinement of `new` (its default type) for one
    tensor, advancing the state's counters as llama.cpp does."""
    ftype, m = state.params.ftype, state.model
    if m.arch == "glm5-next" and any(s in name for s in ("attn_q_a", "attn_q_b", "nextn.eh_proj")):
        if new not in (T.F32, T.BF16, T.F16):
            return T.Q8_0
    if cat == OUTPUT or (state.has_tied_embeddings and cat == TOKEN_EMBD):
        return _output_like(state, new, ne)
    if ftype == F.MOSTLY_MXFP4_MOE:   # experts (3-D) MXFP4, everything else Q8_0
        is_expert = len(ne) > 2 and ne[2] > 1
        if m.arch == "bailingmoe3":   # its MLA projections are 3-D too
            is_expert = is_expert and cat in (FFN_UP, FFN_GATE, FFN_DOWN)
        return T.MXFP4 if is_expert else T.Q8_0
    if cat == TOKEN_EMBD:
        if state.params.token_embedding_type is not None:
            return state.params.token_embedding_type
        if ftype in (F.MOSTLY_IQ2_XXS, F.MOSTLY_IQ2_XS, F.MOSTLY_IQ1_S, F.MOSTLY_IQ1_M):
            return T.Q2_K
        if ftype in (F.MOSTLY_IQ2_S, F.MOSTLY_IQ2_M, F.MOSTLY_IQ3_XXS):
            return T.IQ3_S
        if ftype in (F.MOSTLY_TQ1_0, F.MOSTLY_TQ2_0, F.MOSTLY_Q2_0):
            return T.Q4_K
        return new
    if ftype in _IQ2_FAMILY:
        return _iq2_family(state, new, cat)
    if cat in ATTN_V_LIKE:   # attn_qkv too: llama.cpp's own attn_qkv branch is never reached
        return _attn_v(state, new)
    if cat == ATTN_K:
        if m.n_expert == 8:
            return T.Q8_0
        return {F.MOSTLY_IQ3_XS: T.IQ3_XXS, F.MOSTLY_IQ3_XXS: T.IQ2_S}.get(ftype, new)
    if cat == ATTN_Q:
        return {F.MOSTLY_IQ3_XS: T.IQ3_XXS, F.MOSTLY_IQ3_XXS: T.IQ2_S}.get(ftype, new)
    if cat == FFN_DOWN:
        return _ffn_down(state, new, name)
    if cat == ATTN_OUTPUT:
        return _attn_output(state, new)
    if cat in (FFN_GATE, FFN_UP):
        return _gate_up(state, new, name, up=cat == FFN_UP)
    return new


def tensor_type(state: State, name: str, ne: tuple[int, ...], current: GGMLType, default: GGMLType) -> GGMLType:
    """llama_tensor_get_type: the type `name` (shape ne, now of type `current`) is written as:
    its own type when it is never quantised, the --token-embedding-type / --output-tensor-type
    when given, else (for quantised mixes) the first matching --tensor-type or the mix's rule,
    then the fallback for rows the type's block does not divide."""
    params = state.params
    if not allows_quantization(params, state.model.arch, name, ne):
        return current
    cat = category(name)
    if params.token_embedding_type is not None and cat == TOKEN_EMBD:
        # per_layer_token_embd follows --token-embedding-type unless a --tensor-type names it
        if not (name == "per_layer_token_embd.weight" and state.match(name) is not None):
            return params.token_embedding_type
    if params.output_tensor_type is not None and cat == OUTPUT:
        return params.output_tensor_type
    new = default
    if not is_quantized(default):   # F32, F16, BF16: every quantisable tensor as that type
        return new
    manual = state.match(name)
    if manual is not None:
        if manual != new:
            state.warnings.append(f"{name} - applying manual override: {ggml_name(new)} -> {ggml_name(manual)}")
        new = manual
    elif not params.pure:
        new = mix_type(state, new, name, ne, cat)
    return fallback(state, name, ne[0], new)
