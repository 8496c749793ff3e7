"""Unigram (`tokenizer.ggml.model == "t5"`), as llama.cpp's llm_tokenizer_ugm.

Two steps. Normalisation: SentencePiece's precompiled charsmap (an XOR-compressed double
array over UTF-8 bytes whose leaves point at replacement strings) rewrites the longest
matching prefix at each position; a user-defined token's text is left alone; spaces become
"▁", with a space in front (add_space_prefix) and runs of spaces merged
(remove_extra_whitespaces) as the GGUF asks. Then a Viterbi pass over the normalised bytes
picks the segmentation with the highest total score, one code point at a time: every token
that starts there is a candidate (user-defined tokens score 0), and a code point no token
covers on its own may also be the unknown token, scored 10 below the worst normal token.
Runs of unknown tokens collapse into one.

Faithful quirks: the token tries are built from the GGUF token types before llama.cpp's
text-based fix-ups, and the user-defined prefix match stops where the trie ends, not where a
whole token ends (naive_trie::get_longest_prefix).
"""
from __future__ import annotations

import sys
from functools import cached_property
from typing import Any

import numpy as np

from llama.vocab.common import ATTR_OF_TYPE, SpecialIds, TokenAttr, VocabError, VocabFlags
from llama.vocab.model import TokenizerModel, register_tokenizer_model

CHARSMAP_KEY = "tokenizer.ggml.precompiled_charsmap"
UNKNOWN_PENALTY = np.float32(10.0)
ESCAPED_SPACE = "\u2581".encode("utf-8")
REPLACEMENT_CHAR = "\ufffd".encode("utf-8")
_UTF8_LEN = (1,) * 12 + (2, 2, 3, 4)  # by the lead byte's high nibble (unicode_len_utf8)
_VALUE = -1  # trie key under which a node keeps its token id
_WORST = -sys.float_info.max


class CharsMap:
    """SentencePiece's precompiled charsmap: uint32 blob size, XCDA entries, replacements.

    Each XCDA entry packs LCHECK (bits 0-7, plus bit 31 on value entries so that they never
    match a byte), LEAF (bit 8), BASE (bits 10-30, shifted left by 8 when bit 9 is set); a
    value entry holds the offset of a NUL-terminated replacement string in its low 31 bits.
    """

    def __init__(self, blob: bytes):
        if len(blob) < 4:
            raise VocabError("precompiled_charsmap too small for xcda_blob_size header")
        xcda_size = int.from_bytes(blob[:4], "little")
        if xcda_size + 4 >= len(blob):
            raise VocabError("Index out of array bounds in precompiled charsmap: XCDA blob of "
                             f"{xcda_size} bytes in a charsmap of {len(blob)}")
        n = xcda_size // 4
        self.xcda: list[int] = np.frombuffer(blob, dtype="<u4", count=n, offset=4).tolist()
        self.replacements = blob[4 + xcda_size:]

    def _node(self, index: int) -> int:
        if index >= len(self.xcda):
            raise VocabError("Index out of array bounds in XCDA array")
        return self.xcda[index]

    @staticmethod
    def _base(packed: int) -> int:
        return (packed >> 10) << ((packed & (1 << 9)) >> 6)

    def longest_match(self, data: bytes, pos: int) -> tuple[int, int]:
        """(bytes matched, replacement offset) of the longest key at data[pos:]; (0, 0) if none."""
        index = self._base(self._node(0))
        best_len = best_off = 0
        for p in range(pos, len(data)):
            c = data[p]
            if c == 0:
                break
            index ^= c
            packed = self._node(index)
            if packed & 0x800000FF != c:  # LCHECK
                break
            index ^= self._base(packed)
            if packed & 0x100:  # LEAF: the node at the new index holds the value
                best_len = p - pos + 1
                best_off = self._node(index) & 0x7FFFFFFF
        return best_len, best_off

    def replacement(self, offset: int) -> bytes:
        if offset >= len(self.replacements):
            raise VocabError("Index out of array bounds in precompiled charsmap")
        end = self.replacements.find(b"\0", offset)
        if end < 0:
            raise VocabError("Unterminated string in precompiled charsmap")
        return self.replacements[offset:end]


def charsmap_bytes(value: Any) -> bytes:
    """The charsmap as bytes, from a GGUF int8/uint8 array (or bytes)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    arr = np.asarray(value)
    if arr.size == 0:
        return b""
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or \
            (arr.dtype.itemsize > 1 and ((arr < -128) | (arr > 255)).any()):
        raise VocabError(f"invalid type for {CHARSMAP_KEY}: expected an int8/uint8 array, got "
                         f"{arr.dtype} with shape {arr.shape}")
    return arr.astype(np.uint8).tobytes()  # int8 wraps to the same bytes


def utf8_char_len(data: bytes, pos: int) -> int:
    """Length of the UTF-8 sequence at pos, or 0 if invalid (unicode_cpt_from_utf8's checks)."""
    lead = data[pos]
    if lead < 0x80:
        return 1
    if lead < 0xC0:
        return 0
    n = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4 if lead < 0xF8 else 0
    if n == 0 or pos + n > len(data):
        return 0
    for k in range(1, n):
        if data[pos + k] & 0xC0 != 0x80:
            return 0
    return n


def _insert(trie: dict, key: bytes, value: int) -> None:
    node = trie
    for b in key:
        node = node.setdefault(b, {})
    node[_VALUE] = value


@register_tokenizer_model("t5")
class UGMModel(TokenizerModel):
    """T5-style unigram language model with SentencePiece normalisation."""


    def __init__(self, md: dict[str, Any]):
        super().__init__(md)
        self.charsmap: CharsMap | None = None
        if CHARSMAP_KEY in md:
            self.charsmap = CharsMap(charsmap_bytes(md[CHARSMAP_KEY]))

    def defaults(self) -> tuple[VocabFlags, SpecialIds]:
        return VocabFlags(add_bos=False, add_eos=True), SpecialIds(eos=1, unk=2, pad=0)

    def attach(self, vocab: Any) -> None:
        super().attach(vocab)
        self._scores = vocab.scores.tolist()
        self._user = int(TokenAttr.USER_DEFINED)
        self.__dict__.pop("_tries", None)

    @cached_property
    def _tries(self) -> tuple[dict, dict, float]:
        """Token trie, user-defined trie and the unknown token's score, from the GGUF types."""
        tokens, types = self.vocab.tokens, self.vocab.types.tolist()
        normal, user = int(TokenAttr.NORMAL), int(TokenAttr.USER_DEFINED)
        wanted = normal | user | int(TokenAttr.UNUSED)
        tokens_trie: dict = {}
        user_trie: dict = {}
        min_score = np.float32(np.finfo(np.float32).max)
        for tid, ttype in enumerate(types):
            attr = int(ATTR_OF_TYPE.get(ttype, 0))
            if not attr & wanted:
                continue
            key = tokens[tid].encode("utf-8", "surrogateescape")
            if attr & normal:
                min_score = min(min_score, np.float32(self._scores[tid]))
            _insert(tokens_trie, key, tid)
            if attr & user:
                _insert(user_trie, key, tid)
        return tokens_trie, user_trie, float(min_score - UNKNOWN_PENALTY)

    # --- tokenize --------------------------------------------------------------------------

    def tokenize_fragments(self, fragments: list[str | int], add_special: bool) -> list[int]:
        """BOS/EOS as the vocabulary asks; text goes to the normaliser unescaped."""
        vocab = self.vocab
        return self.join_fragments(fragments, "bos" if add_special and vocab.add_bos else None,
                                   "eos" if add_special and vocab.add_eos else None)

    def encode(self, text: str) -> list[int]:
        return self.viterbi(self.normalize(text))

    def normalize(self, text: str) -> bytes:
        """llm_tokenizer_ugm_session::normalize: charsmap, then llama.cpp's space handling."""
        flags = self.vocab.flags
        space = ESCAPED_SPACE if flags.escape_whitespaces else b" "
        prepend = flags.add_space_prefix  # treat_whitespace_as_suffix is never set
        merge = flags.remove_extra_whitespaces
        data = text.encode("utf-8")
        out = bytearray()
        space_prepended = in_word = False
        pos = 0
        while pos < len(data):
            piece, consumed = self._normalize_prefix(data, pos)
            for c in piece:
                if c != 0x20:
                    if not in_word:
                        in_word = True
                        if (prepend and not space_prepended) or merge:
                            out += space
                            space_prepended = True
                    out.append(c)
                else:
                    in_word = False
                    if not merge:
                        out += space
            pos += consumed
        return bytes(out)

    def _normalize_prefix(self, data: bytes, pos: int) -> tuple[bytes, int]:
        """(replacement, bytes consumed) for the text at pos."""
        node = self._tries[1]
        end = pos
        while end < len(data):  # how far the user-defined trie goes, whole token or not
            node = node.get(data[end])
            if node is None:
                break
            end += 1
        if end > pos:
            return data[pos:end], end - pos
        if self.charsmap is not None:
            length, offset = self.charsmap.longest_match(data, pos)
            if length:
                return self.charsmap.replacement(offset), length
        n = utf8_char_len(data, pos)
        if n == 0:
            return REPLACEMENT_CHAR, 1
        return data[pos:pos + n], n

    def viterbi(self, norm: bytes) -> list[int]:
        """Best-scoring segmentation of normalised bytes (scores summed in double)."""
        n = len(norm)
        if n == 0:
            return []
        root, _, unk_score = self._tries
        unk = self.vocab.unk_id
        attrs, scores, user = self.vocab.attrs, self._scores, self._user
        best = [_WORST] * (n + 1)
        best_tok: list[int | None] = [unk] * (n + 1)
        best_from = [0] * (n + 1)
        best[0] = 0.0
        pos = 0
        while pos < n:
            step = min(_UTF8_LEN[norm[pos] >> 4], n - pos)
            base = best[pos]
            whole_char = False
            node = root.get(norm[pos])
            end = pos + 1
            while node is not None:
                tid = node.get(_VALUE)
                if tid is not None:
                    if end - pos == step:
                        whole_char = True
                    score = base + (0.0 if attrs[tid] & user else scores[tid])
                    if score > best[end]:
                        best[end], best_tok[end], best_from[end] = score, tid, pos
                if end >= n:
                    break
                node = node.get(norm[end])
                end += 1
            if not whole_char:
                score = base + unk_score
                end = pos + step
                if score > best[end]:
                    best[end], best_tok[end], best_from[end] = score, unk, pos
            pos += step
        out: list[int] = []
        prev_unknown = False
        end = n
        while True:  # back from the end; consecutive unknown tokens become one
            tid = best_tok[end]
            unknown = tid == unk
            if not (prev_unknown and unknown):
                if tid is None:
                    raise VocabError("text needs the unknown token, but the vocabulary has none")
                out.append(tid)
            if best_from[end] == 0:
                break
            prev_unknown = unknown
            end = best_from[end]
        out.reverse()
        return out

    # --- pieces ----------------------------------------------------------------------------

    def normal_piece(self, text: str) -> bytes:
        return text.replace("\u2581", " ").encode("utf-8", "surrogateescape")

    def linefeed_id(self) -> int | None:
        """The first token of "\\n" (no special tokens), else the UGM default pad id, 0."""
        ids = self.encode("\n")
        return ids[0] if ids else self.defaults()[1].pad
