"""The vocabulary: token table, special ids, tokenize / token_to_piece / detokenize.

Follows llama.cpp's llama_vocab (llama-vocab.cpp): the same defaults and GGUF overrides,
the same text-based detection of end-of-generation tokens, the same special-token
partitioning, and the same detokenize clean-up. The tokenization algorithm itself (BPE,
SPM, ...) is a TokenizerModel chosen by `tokenizer.ggml.model`.
"""
from __future__ import annotations

import logging
import operator
from typing import Any, Iterable

import numpy as np
import regex

from llama.vocab.common import (ATTR_OF_TYPE, SPECIAL_ID_KEYS, SpecialIds, TokenAttr, TokenType,
                                VocabError, VocabFlags)
from llama.vocab.model import TokenizerModel, tokenizer_model_class
from llama.vocab import special as sp

log = logging.getLogger(__name__)

_SURROGATE = regex.compile("[\ud800-\udfff]")
_UNSET = object()


class Vocab:
    """A loaded vocabulary. Build it with `Vocab.from_metadata(gguf_metadata)`."""

    def __init__(self, model: TokenizerModel, tokens: list[str], token_to_id: dict[str, int],
                 scores: np.ndarray, types: np.ndarray, attrs: list[int], flags: VocabFlags,
                 special: SpecialIds, eog: set[int], special_order: list[int], md_model: str):
        self.model = model
        self.model_name = md_model
        self.tokens = tokens
        self.token_to_id = token_to_id
        self.scores = scores
        self.types = types
        self.attrs = attrs
        self.flags = flags
        self.special = special
        self.eog_ids = frozenset(eog)
        self.special_order = special_order
        # plain ints: partition() tests every special token per call, and IntFlag arithmetic
        # costs microseconds each (Gemma has 6,250 special tokens)
        self._specials = [(i, tokens[i], int(attrs[i])) for i in special_order]
        self._pieces: list[bytes | None] = [None] * len(tokens)
        self._linefeed: Any = _UNSET
        model.attach(self)

    # --- construction ----------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, md: dict[str, Any]) -> "Vocab":
        """Build from GGUF metadata (strings as str, arrays as lists or numpy arrays)."""
        name = md.get("tokenizer.ggml.model")
        if name is None:
            raise VocabError("missing tokenizer.ggml.model in model metadata")
        model = tokenizer_model_class(name)(md)
        flags, ids = model.defaults()
        for attr, key in (("add_space_prefix", "tokenizer.ggml.add_space_prefix"),
                          ("remove_extra_whitespaces", "tokenizer.ggml.remove_extra_whitespaces")):
            if key in md:
                setattr(flags, attr, _as_bool(md[key], key))

        tokens, token_to_id = _read_tokens(md)
        n = len(tokens)
        scores = _read_numeric(md, "tokenizer.ggml.scores", n, np.float32)
        types = _read_numeric(md, "tokenizer.ggml.token_type", n, np.int32)
        if types is None:
            types = np.full(n, TokenType.NORMAL, dtype=np.int32)
        if scores is None:
            scores = np.zeros(n, dtype=np.float32)
        attrs = _attrs_of_types(types)

        _read_special_ids(md, ids, n)
        for attr, key in (("add_bos", "tokenizer.ggml.add_bos_token"),
                          ("add_eos", "tokenizer.ggml.add_eos_token"),
                          ("add_sep", "tokenizer.ggml.add_sep_token")):
            if key in md:
                setattr(flags, attr, _as_bool(md[key], key))
        for flag, slot, key in (("add_bos", "bos", "bos_token_id"), ("add_eos", "eos", "eos_token_id"),
                                ("add_sep", "sep", "seperator_token_id")):
            if getattr(flags, flag) and getattr(ids, slot) is None:
                raise VocabError(f"tokenizer.ggml.{flag}_token is true, but tokenizer.ggml.{key} "
                                 "is not set")
        model.override_flags(flags)  # after the check: llama.cpp fails at tokenize, not load

        sp.detect_special_ids(ids, token_to_id, attrs)
        sp.mark_unused(tokens, attrs)
        eog = sp.eog_ids(ids, tokens, token_to_id, attrs)
        order = sp.special_token_order(tokens, attrs)
        sp.apply_strip_attrs(md, tokens, token_to_id, attrs, order)
        return cls(model, tokens, token_to_id, scores, types, attrs, flags, ids, eog, order, name)

    # --- token table -----------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def check_token(self, token: Any) -> int:
        """`token` as an int in [0, n_vocab), or a VocabError naming it."""
        try:
            tid = operator.index(token)
        except TypeError:
            raise VocabError(f"token id must be an integer, got {type(token).__name__}") from None
        if not 0 <= tid < len(self.tokens):
            raise VocabError(f"token id {tid} out of range [0, {len(self.tokens)})")
        return tid

    def text_to_token(self, text: str) -> int | None:
        return self.token_to_id.get(text)

    def token_text(self, token: int) -> str:
        return self.tokens[self.check_token(token)]

    def token_score(self, token: int) -> float:
        return float(self.scores[self.check_token(token)])

    def token_type(self, token: int) -> TokenType:
        """The type stored in the GGUF (before llama.cpp's text-based fix-ups)."""
        try:
            return TokenType(int(self.types[self.check_token(token)]))
        except ValueError:  # a value outside the enum: llama.cpp treats it as undefined
            return TokenType.UNDEFINED

    def token_attr(self, token: int) -> TokenAttr:
        """The attributes llama.cpp uses (after its fix-ups, e.g. EOG tokens made CONTROL)."""
        return TokenAttr(self.attrs[self.check_token(token)])

    def is_eog(self, token: int | None) -> bool:
        return token is not None and token in self.eog_ids

    def is_control(self, token: int) -> bool:
        return bool(self.attrs[self.check_token(token)] & TokenAttr.CONTROL)

    def is_user_defined(self, token: int) -> bool:
        return bool(self.attrs[self.check_token(token)] & TokenAttr.USER_DEFINED)

    def is_byte(self, token: int) -> bool:
        return bool(self.attrs[self.check_token(token)] & TokenAttr.BYTE)

    def is_unused(self, token: int) -> bool:
        return bool(self.attrs[self.check_token(token)] & TokenAttr.UNUSED)

    def is_normal(self, token: int) -> bool:
        return bool(self.attrs[self.check_token(token)] & TokenAttr.NORMAL)

    # --- special ids and flags -------------------------------------------------------------

    bos_id = property(lambda self: self.special.bos)
    eos_id = property(lambda self: self.special.eos)
    eot_id = property(lambda self: self.special.eot)
    eom_id = property(lambda self: self.special.eom)
    unk_id = property(lambda self: self.special.unk)
    sep_id = property(lambda self: self.special.sep)
    pad_id = property(lambda self: self.special.pad)
    mask_id = property(lambda self: self.special.mask)
    add_bos = property(lambda self: self.flags.add_bos)
    add_eos = property(lambda self: self.flags.add_eos)

    @property
    def linefeed_id(self) -> int | None:
        if self._linefeed is _UNSET:
            self._linefeed = self.model.linefeed_id()
        return self._linefeed

    def require_special(self, slot: str) -> int:
        tid = getattr(self.special, slot)
        if tid is None:
            raise VocabError(f"the vocabulary has no {slot.upper()} token")
        return tid

    # --- tokenize --------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text` (llama_tokenize).

        add_special: add BOS/EOS as the vocabulary asks (add_bos_token / add_eos_token).
        parse_special: also recognise control tokens written in the text, e.g. "<|im_end|>";
        user-defined tokens are recognised either way.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # lone surrogates: llama.cpp reads invalid UTF-8 as U+FFFD
                text = _SURROGATE.sub("\ufffd", text)
        fragments = sp.partition(text, self._specials, parse_special) if text else []
        return self.model.tokenize_fragments(fragments, add_special)

    # --- pieces and detokenize -------------------------------------------------------------

    def token_to_piece(self, token: int, special: bool = False, lstrip: int = 0) -> bytes:
        """The bytes a token stands for (llama_token_to_piece).

        Control and unknown tokens give b"" unless `special`; user-defined tokens give their
        text; `lstrip` drops up to that many leading spaces.
        """
        tid = self.check_token(token)
        attr = self.attrs[tid]
        if not special and attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL):
            return b""
        piece = self._pieces[tid]
        if piece is None:
            piece = self._pieces[tid] = self._make_piece(tid, attr)
        while lstrip > 0 and piece[:1] == b" ":
            piece = piece[1:]
            lstrip -= 1
        return piece

    def _make_piece(self, tid: int, attr: int) -> bytes:
        text = self.tokens[tid]
        if attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL | TokenAttr.USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")
        if attr & TokenAttr.NORMAL:
            return self.model.normal_piece(text)
        if attr & TokenAttr.BYTE:
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                raise VocabError(f"byte token {tid} has text {text!r}, expected '<0xXX>'") from None
        return b""

    def detokenize_bytes(self, ids: Iterable[int], remove_special: bool = False,
                         unparse_special: bool = False) -> bytes:
        """llama_detokenize before UTF-8 decoding."""
        ids = [self.check_token(t) for t in ids]
        remove_space = self.flags.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        out = bytearray()
        for tid in ids:
            out += self.token_to_piece(tid, special=unparse_special, lstrip=int(remove_space))
            remove_space = False
        return clean_spaces(bytes(out)) if self.flags.clean_spaces else bytes(out)

    def detokenize(self, ids: Iterable[int], remove_special: bool = False,
                   unparse_special: bool = False) -> str:
        """Text of a token sequence; invalid UTF-8 (split characters) becomes U+FFFD."""
        return self.detokenize_bytes(ids, remove_special, unparse_special).decode("utf-8", "replace")

    def __repr__(self) -> str:
        pre = getattr(self.model, "pre_name", None)
        return (f"Vocab(model={self.model_name!r}, pre={pre!r}, n_vocab={self.n_vocab}, "
                f"bos={self.bos_id}, eos={self.eos_id}, eog={sorted(self.eog_ids)})")


def clean_spaces(text: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces: " ?" -> "?", " ' " -> "'", " 's" -> "'s"...

    Three in-place passes in C; reproduced step by step, including the NUL the second pass
    writes over a removed space (which the next character then sees as its predecessor).
    """
    space, quote = 0x20, 0x27
    # pass 1: no space before ? ! . ,
    out = bytearray(text[:1])
    for i in range(1, len(text)):
        if text[i - 1] == space and text[i] in b"?!.,":
            out.pop()
        out.append(text[i])
    # pass 2: " ' " -> "'"
    src = bytearray(out)
    out = bytearray(src[:1])
    i = 1
    while i < len(src):
        x = src[i]
        if x == quote and i + 1 < len(src) and src[i - 1] == space and src[i + 1] == space:
            out.pop()
            i += 1
            src[i] = 0
        out.append(x)
        i += 1
    # pass 3: " 's", " 'm", " 're", " 've" lose the space
    src = bytes(out)
    out = bytearray(src[:1])
    n = len(src)
    for i in range(1, n):
        x = src[i]
        if src[i - 1] == space and x == quote and i + 1 < n:
            x1 = src[i + 1]
            if x1 in b"sm":
                out.pop()
            elif x1 not in b"td" and i + 2 < n and (x1, src[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):
                out.pop()
        out.append(x)
    return bytes(out)


# --- metadata readers ------------------------------------------------------------------------

def _as_bool(value: Any, key: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise VocabError(f"{key} must be a bool, got {type(value).__name__}")


def _read_tokens(md: dict[str, Any]) -> tuple[list[str], dict[str, int]]:
    """Token texts and their ids; empty texts renamed and duplicates refused, as llama.cpp."""
    raw = md.get("tokenizer.ggml.tokens")
    if raw is None:
        raise VocabError("cannot find tokenizer vocab (tokenizer.ggml.tokens) in model file")
    if isinstance(raw, (str, bytes)):
        raise VocabError("tokenizer.ggml.tokens must be an array of strings")
    tokens = raw.tolist() if hasattr(raw, "tolist") else list(raw)
    if set(map(type, tokens)) <= {str} and "" not in tokens:
        seen = dict(zip(tokens, range(len(tokens))))  # the common case, without a Python loop
        if len(seen) == len(tokens):
            return tokens, seen
    seen = {}
    for i, tok in enumerate(tokens):
        if not isinstance(tok, str):
            raise VocabError(f"tokenizer.ggml.tokens[{i}] is {type(tok).__name__}, expected str")
        if not tok:
            log.warning("empty token at index %d", i)
            tok = tokens[i] = f"[EMPTY_{i}]"
        if tok in seen:
            raise VocabError(f"duplicate token in vocabulary: {tok!r} has ids {seen[tok]} and {i}")
        seen[tok] = i
    return tokens, seen


def _attrs_of_types(types: np.ndarray) -> list[int]:
    """Per-token attributes from GGUF token types (vectorised: 262k tokens in a few ms)."""
    table = np.zeros(max(ATTR_OF_TYPE) + 1, dtype=np.int64)
    for ttype, attr in ATTR_OF_TYPE.items():
        table[int(ttype)] = int(attr)
    known = (types >= 0) & (types < len(table))
    return np.where(known, table[np.where(known, types, 0)], 0).tolist()


def _read_numeric(md: dict[str, Any], key: str, n: int, dtype: type) -> np.ndarray | None:
    raw = md.get(key)
    if raw is None:
        return None
    try:
        arr = np.asarray(raw)
    except (TypeError, ValueError):
        raise VocabError(f"{key} must be a numeric array") from None
    if arr.ndim != 1 or arr.dtype.kind not in "iuf" or (dtype is np.int32 and arr.dtype.kind == "f"):
        raise VocabError(f"invalid type for {key}: expected a 1-d {np.dtype(dtype).name} array, "
                         f"got {arr.dtype} with shape {arr.shape}")
    if len(arr) < n:
        raise VocabError(f"index out of array bounds for {key} ({len(arr)} < {n} tokens)")
    return arr[:n].astype(dtype)


def _read_special_ids(md: dict[str, Any], ids: SpecialIds, n: int) -> None:
    """Defaults outside the vocab are dropped; GGUF ids inside it replace the defaults."""
    for slot in ids.names():
        tid = getattr(ids, slot)
        if tid is not None and tid >= n:
            log.warning("default special token %s = %d out of vocab range, disabling", slot, tid)
            setattr(ids, slot, None)
    for slot, key in SPECIAL_ID_KEYS:
        if key not in md:
            continue
        try:
            new = operator.index(md[key])
        except TypeError:
            raise VocabError(f"{key} must be an integer, got {type(md[key]).__name__}") from None
        if 0 <= new < n:
            setattr(ids, slot, new)
        else:
            log.warning("bad special token %s = %d, using default id %s", key, new, getattr(ids, slot))
