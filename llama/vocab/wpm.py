"""WordPiece (`tokenizer.ggml.model == "bert"`), as llama.cpp's llm_tokenizer_wpm.

BERT's text is first normalised and cut into words (BertNormalizer + BertPreTokenizer):
optional accent stripping and lower-casing, control characters dropped, whitespace
separating words, and every punctuation mark, ASCII symbol and CJK ideograph a word of its
own. Each word, with "▁" in front, is then covered greedily by the longest vocabulary token
at each position; a word that cannot be covered completely becomes the unknown token.
(GGUF stores BERT's word-start tokens as "▁word" and its "##piece" continuations as "piece".)

The character classes follow llama.cpp's tables, which its generator takes from Python's
`regex` module (\\s, \\p{M}, \\p{P}, \\p{S}, \\p{C}) and from `str.lower` / NFD, keeping only
the first code point of a multi-character result.
"""
from __future__ import annotations

import unicodedata
from typing import Any

import numpy as np
import regex

from llama.vocab.common import SpecialIds, VocabError, VocabFlags
from llama.vocab.model import TokenizerModel, register_tokenizer_model

SPACE = "\u2581"

# character class bits
WHITESPACE, CONTROL, ACCENT, PUNCT, SYMBOL = 1, 2, 4, 8, 16
_CLASS_TESTS = [(WHITESPACE, regex.compile(r"\s")), (CONTROL, regex.compile(r"\p{C}")),
                (ACCENT, regex.compile(r"\p{M}")), (PUNCT, regex.compile(r"\p{P}")),
                (SYMBOL, regex.compile(r"\p{S}"))]

# CJK ideograph blocks as llama.cpp (after HF) lists them, 0x2B920 start included
_CHINESE = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
            (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


class _Classes(dict):
    """Character -> class bits, computed on first sight."""

    def __missing__(self, ch: str) -> int:
        bits = 0
        for bit, rx in _CLASS_TESTS:
            if rx.match(ch):
                bits |= bit
        self[ch] = bits
        return bits


_CLASSES = _Classes()


def is_chinese_char(cpt: int) -> bool:
    return any(lo <= cpt <= hi for lo, hi in _CHINESE)


def first_lower(ch: str) -> str:
    """llama.cpp's unicode_tolower: the first code point of the lower-case form."""
    return ch.lower()[0]


def first_nfd(ch: str) -> str:
    """llama.cpp's NFD: the first code point of the decomposition ("é" -> "e")."""
    return unicodedata.normalize("NFD", ch)[0] if ord(ch) >= 0xC0 else ch


def split_words(text: str, lowercase: bool, strip_accents: bool) -> list[str]:
    """llm_tokenizer_wpm_session::preprocess: normalised words of one text fragment."""
    classes = _CLASSES
    words: list[str] = []
    cur: list[str] = []
    for ch in text:
        if strip_accents:
            ch = first_nfd(ch)
        bits = classes[ch]
        if bits & WHITESPACE:
            if cur:
                words.append("".join(cur))
                cur = []
            continue
        if ch == "\0" or ch == "\ufffd" or bits & CONTROL:
            continue
        if strip_accents and bits & ACCENT:
            continue
        out = first_lower(ch) if lowercase else ch
        cpt = ord(ch)
        if bits & PUNCT or (cpt < 0x7F and bits & SYMBOL) or is_chinese_char(cpt):
            if cur:
                words.append("".join(cur))
                cur = []
            words.append(out)
        else:
            cur.append(out)
    if cur:
        words.append("".join(cur))
    return words


def _bool_key(md: dict[str, Any], key: str, default: bool) -> bool:
    value = md.get(key, default)
    if not isinstance(value, (bool, np.bool_)):
        raise VocabError(f"{key} must be a bool, got {type(value).__name__}")
    return bool(value)


@register_tokenizer_model("bert")
class WPMModel(TokenizerModel):
    """BERT WordPiece: greedy longest-match over normalised words."""

    cache_size = 1 << 16

    def __init__(self, md: dict[str, Any]):
        super().__init__(md)
        # BertNormalizer options; strip_accents follows lowercase unless given (as HF does)
        self.lowercase = _bool_key(md, "tokenizer.ggml.normalizer.lowercase", True)
        self.strip_accents = _bool_key(md, "tokenizer.ggml.normalizer.strip_accents",
                                       self.lowercase)

    def defaults(self) -> tuple[VocabFlags, SpecialIds]:
        flags = VocabFlags(add_bos=True, add_eos=False, add_sep=True, add_space_prefix=False,
                           clean_spaces=True)
        return flags, SpecialIds(bos=101, unk=100, sep=102, pad=0, mask=103)

    def attach(self, vocab: Any) -> None:
        super().attach(vocab)
        self._token_to_id = vocab.token_to_id
        self._max_len = max((len(t) for t in vocab.tokens), default=0)

    def tokenize_fragments(self, fragments: list[str | int], add_special: bool) -> list[int]:
        """BOS (CLS) first and SEP last whenever add_special, whatever add_bos/add_sep say."""
        return self.join_fragments(fragments, "bos" if add_special else None,
                                   "sep" if add_special else None)

    def encode(self, text: str) -> list[int]:
        words = split_words(text, self.lowercase, self.strip_accents)
        return self._cache.encode(words, self.encode_word)

    def encode_word(self, word: str) -> tuple[int, ...]:
        """Longest vocabulary token at each position of "▁" + word; all or nothing."""
        text = SPACE + word
        n = len(text)
        get = self._token_to_id.get
        ids: list[int] = []
        i = 0
        while i < n:
            for j in range(min(n, i + self._max_len), i, -1):
                tid = get(text[i:j])
                if tid is not None:
                    ids.append(tid)
                    i = j
                    break
            else:
                return (self.vocab.require_special("unk"),)
        return tuple(ids)

    def normal_piece(self, text: str) -> bytes:
        return text.replace(SPACE, " ").encode("utf-8", "surrogateescape")

    def linefeed_id(self) -> int | None:
        """llama.cpp takes the pad id while it still holds the WPM default, 0."""
        return self.defaults()[1].pad
