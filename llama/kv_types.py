"""The KV cache's element types, as llama.cpp's `--cache-type-k/-ctk` and `--cache-type-v/-ctv`
(llama_context_params.type_k/type_v): the rules a context checks before it allocates the
cache, and the Walsh-Hadamard rotation llama.cpp applies around a quantised cache.

The rules are llama_init_from_model's, with its messages: a quantised V cache needs flash
attention (with flash_attn "auto" it is turned on, with False refused), and a quantised
type's block must divide the head size of the cache it holds (K or V).

The rotation (llama_kv_cache's attn_rot_k / attn_rot_v): when K is quantised and the heads
are a multiple of 64 wide, Q and K are multiplied by an orthonormal Hadamard matrix (of the
largest power-of-two size from 64 up that divides the head) before K is stored; Q.K is
unchanged, but the rotated K spreads each outlier over the block, so the quantisation loses
less. A quantised V is rotated by the 64-wide matrix before it is stored and the attention's
output rotated back (H H = I). The K-shift undoes and redoes the K rotation around the RoPE.
(llama.cpp's debugging switch LLAMA_ATTN_ROT_DISABLE has no counterpart: the engine reads no
environment variables.)
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ggmlpy.ir.types import GGMLType, block_size, is_quantized

if TYPE_CHECKING:
    from llama.hparams import HParams

log = logging.getLogger("llama.context")

# llama.cpp's kv_cache_types (common/arg.cpp), in its order: the names -ctk/-ctv take
KV_TYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "bf16": GGMLType.BF16, "q8_0": GGMLType.Q8_0,
            "q4_0": GGMLType.Q4_0, "q4_1": GGMLType.Q4_1, "iq4_nl": GGMLType.IQ4_NL, "q5_0": GGMLType.Q5_0,
            "q5_1": GGMLType.Q5_1}
KV_TYPE_NAMES = {t: name for name, t in KV_TYPES.items()}
# llama-cpp-python's Llama(type_k=..., type_v=...) take ggml type ids
KV_TYPE_IDS = {int(t): name for name, t in KV_TYPES.items()}
ROT_MIN = 64   # llama.cpp rotates heads that are a multiple of this, with at least this size


def kv_type(value: str | int | GGMLType, what: str = "cache type") -> str:
    """A cache type as its llama.cpp name, from a name or a ggml type id; llama.cpp's
    message for any other."""
    if isinstance(value, str) and value in KV_TYPES:
        return value
    if not isinstance(value, (str, bool)) and isinstance(value, (int, np.integer)) and int(value) in KV_TYPE_IDS:
        return KV_TYPE_IDS[int(value)]
    raise ValueError(f"Unsupported {what}: {value!r} (allowed: {', '.join(KV_TYPES)}, or their ggml type ids "
                     f"{', '.join(f'{i} ({n})' for i, n in sorted(KV_TYPE_IDS.items()))})")


def check_kv_types(hp: "HParams", type_k: str, type_v: str, flash_attn: bool | None) -> bool | None:
    """Refuse what llama_init_from_model refuses; returns flash_attn as it then is (a
    quantised V cache turns "auto", None, into True)."""
    tk, tv = GGMLType(KV_TYPES[kv_type(type_k, "K cache type")]), GGMLType(KV_TYPES[kv_type(type_v, "V cache type")])
    if hp.is_mla and tk != tv:   # V is read from K's rows
        raise ValueError(f"model does not support different K ({KV_TYPE_NAMES[tk]}) and V ({KV_TYPE_NAMES[tv]}) "
                         f"cache types: its attention (MLA) reads V from the K cache")
    if is_quantized(tv) and flash_attn is not True:
        if flash_attn is False:
            raise ValueError("quantized V cache requires flash_attn to be enabled")
        log.info("enabling flash_attn since it is required for quantized V cache")
        flash_attn = True
    for which, t, heads in (("K", tk, _heads(hp, hp.head_k)), ("V", tv, _heads(hp, hp.head_v))):
        for head in sorted(heads):   # ggmlpy's cache views need whole blocks per head
            if is_quantized(t) and head % block_size(t):
                raise ValueError(f"{which} cache type {KV_TYPE_NAMES[t]} with block size {block_size(t)} does not "
                                 f"divide n_embd_head_{which.lower()}={head}")
    return flash_attn


def _heads(hp: "HParams", head_of) -> set[int]:
    """The head sizes of the layers that own a cache."""
    return {head_of(il) for il in range(hp.n_layer) if hp.has_kv(il)}


def rotation_sizes(hp: "HParams", type_k: GGMLType, type_v: GGMLType) -> tuple[int, int]:
    """(K's, V's) Hadamard size, 0 for none (llama_kv_cache's attn_rot_k/v and
    build_input_k_rot/v_rot). As llama.cpp, none where the cache's layers differ in head
    size (n_embd_head_k_all = -1; llama.cpp's iSWA cache of Gemma 4 rotates each half with
    its own size, which one rotation for the layout cannot: ggmlpy then rotates neither). MLA's
    K-only cache is not rotated: llama.cpp's attention input for it (llm_graph_input_attn_k)
    applies none, and its V, read from K's rows, could not be rotated back."""
    if hp.is_mla:
        return 0, 0
    heads_k, heads_v = _heads(hp, hp.head_k), _heads(hp, hp.head_v)
    head_k = heads_k.pop() if len(heads_k) == 1 else 0
    head_v = heads_v.pop() if len(heads_v) == 1 else 0
    rot_k = 0
    if is_quantized(type_k) and head_k > 0 and head_k % ROT_MIN == 0:
        rot_k = ROT_MIN
        while head_k % (2 * rot_k) == 0:
            rot_k *= 2
    rot_v = ROT_MIN if is_quantized(type_v) and head_v > 0 and head_v % ROT_MIN == 0 else 0
    return rot_k, rot_v


def hadamard(n: int) -> np.ndarray:
    """The orthonormal n x n Walsh-Hadamard matrix in Sylvester's order (ggml_gen_hadamard):
    symmetric, and its own inverse."""
    h = np.array([[1.0 / float(np.sqrt(np.float32(n)))]], np.float32)   # C's 1.0 / sqrtf(n)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return np.ascontiguousarray(h, dtype=np.float32)
