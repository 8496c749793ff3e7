"""The tokenizer-model interface and the registry keyed by `tokenizer.ggml.model`.

llama.cpp switches on the vocab type in several places (defaults, tokenize, token_to_piece).
Here each algorithm is one TokenizerModel subclass registered under its GGUF name; Vocab does
everything the algorithms share (token table, special ids, special-token partitioning,
pieces of control/user-defined/byte tokens, detokenize) and asks the model for the rest.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

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
    """Class decorator: make `cls` the implementation of `tokenizer.ggml.model == name`
    (its `name`)."""
    def deco(cls: type[TokenizerModel]) -> type[TokenizerModel]:
        cls.name = name
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


class PieceCache:
    """Token ids of the pieces (pre-tokenized words, chunks) a model has encoded, the
    oldest dropped first once `size` are held: text repeats its words, and merging or
    matching a word costs far more than looking it up."""

    def __init__(self, size: int):
        self.size = size
        self._ids: dict[str, tuple[int, ...]] = {}

    def clear(self) -> None:
        self._ids.clear()

    def encode(self, pieces: Iterable[str], encode_piece: Callable[[str], tuple[int, ...]]) -> list[int]:
        """The ids of every piece in turn, each from the cache or else encode_piece."""
        out: list[int] = []
        cache = self._ids
        for piece in pieces:
            ids = cache.get(piece)
            if ids is None:
                ids = encode_piece(piece)
                if len(cache) >= self.size:
                    del cache[next(iter(cache))]  # drop the oldest entry
                cache[piece] = ids
            out.extend(ids)
        return out


class TokenizerModel:
    """One tokenization algorithm. Subclasses read their own metadata in __init__.

    Models that encode text piece by piece (BPE's words, SPM's chunks, WPM's words) keep
    the pieces' ids in `_cache`, of at most `cache_size` pieces, emptied on attach."""

    name = ""  # the `tokenizer.ggml.model` value it is registered under
    cache_size = 1 << 17

    def __init__(self, md: dict[str, Any]):
        self.vocab: Vocab | None = None
        self._cache = PieceCache(self.cache_size)

    def defaults(self) -> tuple[VocabFlags, SpecialIds]:
        """llama.cpp's per-type defaults, applied before the GGUF keys override them."""
        return VocabFlags(), SpecialIds()

    def override_flags(self, flags: VocabFlags) -> None:
        """Change flags after the GGUF keys have set them: llama.cpp overrides some files'
        own keys (Gemma 4's add_bos_token). None by default."""

    def attach(self, vocab: "Vocab") -> None:
        """Called once the token table, flags and special ids are known."""
        self.vocab = vocab
        self._cache.clear()

    def encode(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment (no special tokens inside)."""
        raise NotImplementedError

    def tokenize_fragments(self, fragments: list[str | int], add_special: bool) -> list[int]:
        """Ids for text fragments and already-recognised special tokens, with BOS/EOS.

        This is llama.cpp's BPE arrangement; models with other rules (SPM's space prefix
        after special tokens) override it.
        """
        vocab = self.vocab
        return self.join_fragments(fragments, "bos" if add_special and vocab.add_bos else None,
                                   "eos" if add_special and vocab.add_eos else None,
                                   vocab.flags.escape_whitespaces)

    def join_fragments(self, fragments: list[str | int], first: str | None, last: str | None,
                       escape_spaces: bool = False) -> list[int]:
        """The special token in slot `first` (None: none), the fragments' ids (special
        tokens as they are, text through encode, its spaces written as U+2581 when
        escape_spaces), then the one in slot `last`: every model's tokenize_fragments but
        SPM's, whose space prefix depends on the fragment before."""
        vocab = self.vocab
        out: list[int] = []
        if first is not None:
            out.append(vocab.require_special(first))
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
            else:
                if escape_spaces:
                    frag = frag.replace(" ", "\u2581")
                out.extend(self.encode(frag))
        if last is not None:
            out.append(vocab.require_special(last))
        return out

    def normal_piece(self, text: str) -> bytes:
        """Bytes of a NORMAL token's text (BPE: undo the byte-to-unicode mapping)."""
        raise NotImplementedError

    def linefeed_id(self) -> int | None:
        """The newline token as llama.cpp finds it for this vocab type."""
        ids = self.vocab.tokenize("\n", add_special=False)
        return ids[0] if ids else self.vocab.pad_id
