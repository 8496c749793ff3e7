"""The tokenizer-model interface and the registry keyed by `tokenizer.ggml.model`.

llama.cpp switches on the vocab type in several places (defaults, tokenize, token_to_piece).
Here each algorithm is one TokenizerModel subclass registered under its GGUF name; Vocab does
everything the algorithms share (token table, special ids, special-token partitioning,
pieces of control/user-defined/byte tokens, detokenize) and asks the model for the rest.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from llama.vocab.common import SpecialIds, VocabError, VocabFlags

if TYPE_CHECKING:
    from llama.vocab.vocab import Vocab

# GGUF tokenizer.ggml.model -> the class that implements it
TOKENIZER_MODELS: dict[str, type["TokenizerModel"]] = {}
# names llama.cpp knows; listed so the error says "not supported yet" rather than "unknown"
KNOWN_MODELS = {"llama": "SPM", "gpt2": "BPE", "bert": "WPM", "t5": "UGM", "rwkv": "RWKV",
                "plamo2": "PLaMo2", "gemma4": "BPE (gemma4)", "hybriddna": "BPE (DNA)",
                "whitespace": "BPE (whitespace)", "no_vocab": "none", "none": "none"}


def register_tokenizer_model(name: str) -> Callable[[type["TokenizerModel"]], type["TokenizerModel"]]:
    """Class decorator: make `cls` the implementation of `tokenizer.ggml.model == name`."""
    def deco(cls: type[TokenizerModel]) -> type[TokenizerModel]:
        TOKENIZER_MODELS[name] = cls
        return cls
    return deco


def tokenizer_model_class(name: Any) -> type["TokenizerModel"]:
    """The registered class for a `tokenizer.ggml.model` value, or a VocabError saying why not."""
    if not isinstance(name, str):
        raise VocabError(f"tokenizer.ggml.model must be a string, got {type(name).__name__}")
    if name in TOKENIZER_MODELS:
        return TOKENIZER_MODELS[name]
    supported = ", ".join(sorted(TOKENIZER_MODELS)) or "none"
    if name in KNOWN_MODELS:
        raise VocabError(f"tokenizer model '{name}' ({KNOWN_MODELS[name]}) is not supported yet "
                         f"(supported: {supported})")
    raise VocabError(f"unknown tokenizer model '{name}' (supported: {supported})")


class TokenizerModel:
    """One tokenization algorithm. Subclasses read their own metadata in __init__."""

    name = ""

    def __init__(self, md: dict[str, Any]):
        self.vocab: Vocab | None = None

    def defaults(self) -> tuple[VocabFlags, SpecialIds]:
        """llama.cpp's per-type defaults, applied before the GGUF keys override them."""
        return VocabFlags(), SpecialIds()

    def attach(self, vocab: "Vocab") -> None:
        """Called once the token table, flags and special ids are known."""
        self.vocab = vocab

    def encode(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment (no special tokens inside)."""
        raise NotImplementedError

    def tokenize_fragments(self, fragments: list[str | int], add_special: bool) -> list[int]:
        """Ids for text fragments and already-recognised special tokens, with BOS/EOS.

        This is llama.cpp's BPE arrangement; models with other rules (SPM's space prefix
        after special tokens) override it.
        """
        vocab = self.vocab
        out: list[int] = []
        if add_special and vocab.add_bos:
            out.append(vocab.require_special("bos"))
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
            else:
                if vocab.flags.escape_whitespaces:
                    frag = frag.replace(" ", "\u2581")
                out.extend(self.encode(frag))
        if add_special and vocab.add_eos:
            out.append(vocab.require_special("eos"))
        return out

    def normal_piece(self, text: str) -> bytes:
        """Bytes of a NORMAL token's text (BPE: undo the byte-to-unicode mapping)."""
        raise NotImplementedError

    def linefeed_id(self) -> int | None:
        """The newline token as llama.cpp finds it for this vocab type."""
        ids = self.vocab.tokenize("\n", add_special=False)
        return ids[0] if ids else self.vocab.pad_id
