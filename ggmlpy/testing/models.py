"""Tiny random-weight GGUF models for tests: real files through the real loader, small
enough that a whole forward pass takes milliseconds.

The vocabulary is byte-level BPE (the 256 GPT-2 byte symbols, a few merges and an
end-of-text control token), so the tokenizer path is the real one too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from ggmlpy.gguf.writer import GGUFWriter
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import quantize
from ggmlpy.quants.quant import REQUIRES_IMATRIX


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> printable character table."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|fim_repo|>",
              "<|file_sep|>")  # Qwen2.5-Coder's names; the last six ids with fim=True


def add_random_matrix(add: Callable[..., None], rng: np.random.Generator, name: str, n_in: int,
                      n_out: int, weight_type: GGMLType) -> None:
    """A random [n_out, n_in] matrix (ggml ne = (n_in, n_out)) scaled by 1/sqrt(n_in) to keep
    activations O(1), given to `add` (GGUFWriter.add_tensor's arguments) as weight_type."""
    data = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
    if weight_type == GGMLType.F32:
        add(name, data)
    elif weight_type == GGMLType.F16:
        add(name, data.astype(np.float16))
    else:   # the types ggml writes only with an importance matrix: a uniform one
        imatrix = np.ones(n_in, np.float32) if weight_type in REQUIRES_IMATRIX else None
        add(name, quantize(data, weight_type, imatrix), type=weight_type, ne=(n_in, n_out))


def add_tiny_bpe_vocab(w: GGUFWriter, n_vocab: int, fim: bool = False) -> None:
    symbols = _byte_symbols()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "e r"]
    tokens = ["<|endoftext|>"] + symbols + [m.replace(" ", "") for m in merges]
    if n_vocab < len(tokens) + (len(FIM_TOKENS) if fim else 0):
        raise ValueError(f"n_vocab must be at least {len(tokens)}")
    tokens += [f"<|unused{i}|>" for i in range(n_vocab - len(tokens))]
    types = np.ones(n_vocab, np.int32)
    types[0] = 3
    types[len(symbols) + len(merges) + 1:] = 5
    if fim:  # control tokens with their ids in the metadata, as converted FIM models have
        first = n_vocab - len(FIM_TOKENS)
        tokens[first:] = FIM_TOKENS
        types[first:] = 3
        for i, key in enumerate(("pre", "suf", "mid", "pad", "rep", "sep")):
            w.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", first + i)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "gpt-2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", 0)
    w.add_uint32("tokenizer.ggml.eos_token_id", 0)
    w.add_bool("tokenizer.ggml.add_bos_token", False)


def write_tiny_llama(path: str | Path, *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 96, n_vocab: int = 320, n_ctx_train: int = 512,
                     weight_type: GGMLType = GGMLType.F32, tied: bool = False, seed: int = 0,
                     rope_base: float = 10000.0, fim: bool = False) -> Path:
    """A llama-architecture model with random weights (scaled so activations stay O(1))."""
    rng = np.random.default_rng(seed)
    head = n_embd // n_head
    w = GGUFWriter("llama")
    w.add_string("general.name", "tiny-llama")
    w.add_uint32("llama.context_length", n_ctx_train)
    w.add_uint32("llama.embedding_length", n_embd)
    w.add_uint32("llama.block_count", n_layer)
    w.add_uint32("llama.feed_forward_length", n_ff)
    w.add_uint32("llama.attention.head_count", n_head)
    w.add_uint32("llama.attention.head_count_kv", n_head_kv)
    w.add_uint32("llama.rope.dimension_count", head)
    w.add_float32("llama.rope.freq_base", rope_base)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32("llama.vocab_size", n_vocab)
    add_tiny_bpe_vocab(w, n_vocab, fim=fim)

    def mat(name: str, n_in: int, n_out: int) -> None:
        add_random_matrix(w.add_tensor, rng, name, n_in, n_out, weight_type)

    def vec(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float32))
    vec("output_norm.weight", n_embd)
    if not tied:
        mat("output.weight", n_embd, n_vocab)
    for il in range(n_layer):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", n_embd)
        mat(p + "attn_q.weight", n_embd, n_embd)
        mat(p + "attn_k.weight", n_embd, head * n_head_kv)
        mat(p + "attn_v.weight", n_embd, head * n_head_kv)
        mat(p + "attn_output.weight", n_embd, n_embd)
        vec(p + "ffn_norm.weight", n_embd)
        mat(p + "ffn_gate.weight", n_embd, n_ff)
        mat(p + "ffn_up.weight", n_embd, n_ff)
        mat(p + "ffn_down.weight", n_ff, n_embd)
    return w.write(path)




def write_pair_vocab(path: str | Path, pre: str, texts: list[str]) -> Path:
    """A vocabulary-only llama file whose BPE merges every adjacent pair of byte symbols in
    `texts` (first pairs first), under pre-tokenizer `pre`: since BPE merges only inside a
    pre-token, the tokens of a text show where the pre-tokenizer cut it (a test of `pre`
    against another implementation on the same file)."""
    symbols = _byte_symbols()
    merges: list[str] = []
    for text in texts:
        chars = [symbols[b] for b in text.encode("utf-8")]
        for a, b in zip(chars, chars[1:]):
            if f"{a} {b}" not in merges:
                merges.append(f"{a} {b}")
    tokens = ["<|endoftext|>"] + symbols + [m.replace(" ", "") for m in merges]
    w = GGUFWriter("llama")
    w.add_string("general.name", f"pair-vocab-{pre}")
    for key, value in (("context_length", 512), ("embedding_length", 64), ("block_count", 1),
                       ("feed_forward_length", 96), ("attention.head_count", 4), ("vocab_size", len(tokens))):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", np.array([3] + [1] * (len(tokens) - 1), np.int32))
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", 0)
    w.add_uint32("tokenizer.ggml.eos_token_id", 0)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    return w.write(path)
