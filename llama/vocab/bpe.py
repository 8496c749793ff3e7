"""Byte-level BPE (`tokenizer.ggml.model == "gpt2"`), as llama.cpp's llm_tokenizer_bpe_session.

A word from the pre-tokenizer is turned into GPT-2's printable "byte characters" (one code
point per UTF-8 byte), split into those characters, and merged pair by pair: always the
adjacent pair with the lowest merge rank, the leftmost one on ties. Each resulting symbol is
a token; a symbol missing from the vocabulary falls back to the tokens of its single ASCII
bytes (llama.cpp looks up each byte of the symbol's text as a one-byte string, which only
ever finds ASCII or raw-byte tokens; others are dropped).

SPM-style BPE (`PreSpec.spm_style`: pre-tokenizers gemma4, granite-embed-multi-311m and
sarvam-moe) differs in three places: spaces are written as U+2581 before anything else,
words (whole lines) stay raw characters, and a symbol missing from the vocabulary falls
back to the `<0xXX>` tokens of its UTF-8 bytes. The Gemma 4 tokenizer model is this with
the gemma4 pre-tokenizer fixed (llama/vocab/gemma4.py).

Words repeat a lot in real text, so results are cached per word.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

from llama.vocab.bigram_merge import merge_bigrams
from llama.vocab.common import SpecialIds, VocabError, VocabFlags
from llama.vocab.model import TokenizerModel, register_tokenizer_model
from llama.vocab.pretokenizers import PreTokenizer, pre_spec

log = logging.getLogger(__name__)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's table: byte -> printable character (printable Latin-1 stays, the rest shifts)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_UNICODE = _bytes_to_unicode()
UNICODE_TO_BYTE = {ch: b for b, ch in enumerate(BYTE_TO_UNICODE)}
# str.translate table taking a latin-1 decoded byte string to the byte characters
_ENCODE_TABLE = {b: ch for b, ch in enumerate(BYTE_TO_UNICODE)}

_BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]  # SPM-style BPE's byte tokens

MERGE_HEAP_THRESHOLD = 64  # longer words use the heap; shorter ones the plain rescans


def byte_encode(word: str) -> str:
    """The word's UTF-8 bytes as GPT-2 byte characters."""
    return word.encode("utf-8").decode("latin-1").translate(_ENCODE_TABLE)


def byte_decode(text: str) -> bytes:
    """Inverse of byte_encode, with llama.cpp's marker for characters outside the table."""
    out = bytearray()
    for ch in text:
        b = UNICODE_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:  # llama_decode_text: "[UNK_BYTE_0x" + hex of the character + whole text + "]"
            # a raw byte (surrogate) is invalid UTF-8, which llama.cpp reads as U+FFFD
            raw = "\ufffd".encode() if "\ud800" <= ch <= "\udfff" else ch.encode("utf-8")
            out += b"[UNK_BYTE_0x" + raw.hex().encode() + text.encode("utf-8", "surrogateescape") + b"]"
    return bytes(out)


def parse_merges(merges: Any, tokens: Sequence[str] = ()) -> dict[tuple[str, str], int]:
    """Merge ranks: "left right" at index i has rank i; the first duplicate wins.

    Split at the first space after position 0 (a merge may start with a space); a line with
    none becomes the pair ("", ""), both as llama.cpp does. With the vocabulary's `tokens`,
    a side that is a token is that token's own string object: Qwen2's 151,387 merges
    otherwise hold 300,000 strings of their own (16 MiB).
    """
    lines = list(merges)
    if not set(map(type, lines)) <= {str}:
        i, line = next((i, line) for i, line in enumerate(lines) if not isinstance(line, str))
        raise VocabError(f"tokenizer.ggml.merges[{i}] is {type(line).__name__}, expected str")
    own = dict(zip(tokens, tokens)).get   # a token's text -> that very string object
    pairs = [(own(left := line[:pos], left), own(right := line[pos + 1:], right))
             if (pos := line.find(" ", 1)) != -1 else ("", "") for line in lines]
    del lines, own
    ranks = dict(zip(pairs, range(len(pairs))))   # no duplicate (the rule): built at C speed
    if len(ranks) != len(pairs):
        ranks = {}
        for i, pair in enumerate(pairs):
            ranks.setdefault(pair, i)
    return ranks


def merge_simple(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Repeatedly merge the lowest-ranked adjacent pair (leftmost on ties)."""
    syms = list(symbols)
    get = ranks.get
    while len(syms) > 1:
        best_i = -1
        best_rank = None
        prev = syms[0]
        for i in range(1, len(syms)):
            cur = syms[i]
            r = get((prev, cur))
            if r is not None and (best_rank is None or r < best_rank):
                best_rank = r
                best_i = i - 1
            prev = cur
        if best_i < 0:
            break
        syms[best_i:best_i + 2] = [syms[best_i] + syms[best_i + 1]]
    return syms


def merge_heap(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Same result as merge_simple in O(n log n): llama.cpp's priority queue of bigrams.

    Entries are keyed by rank and carry the merged text; an entry is stale when either side
    has changed since it was pushed, which shows as a text mismatch.
    """
    def rank(left: str, right: str) -> tuple[int, str] | None:
        r = ranks.get((left, right))
        return None if r is None else (r, left + right)

    return merge_bigrams(symbols, rank, lambda left, right, merged: left + right == merged)


@register_tokenizer_model("gpt2")
class BPEModel(TokenizerModel):
    """GPT-2 style byte-level BPE with the pre-tokenizer named by `tokenizer.ggml.pre`."""

    def __init__(self, md: dict[str, Any]):
        super().__init__(md)
        self.pre_name = self.pre_tokenizer_name(md)
        if not self.pre_name:
            log.warning("missing pre-tokenizer type (tokenizer.ggml.pre), using 'default'; "
                        "generation quality will be degraded")
        self.pre = pre_spec(self.pre_name)
        self.pretokenizer = PreTokenizer.named(self.pre.regex_set)
        merges = md.get("tokenizer.ggml.merges")
        if merges is None:
            raise VocabError("cannot find tokenizer merges (tokenizer.ggml.merges) in model file")
        if isinstance(merges, (str, bytes)):
            raise VocabError("tokenizer.ggml.merges must be an array of strings")
        self._merges = merges   # parsed on attach, sharing the vocabulary's strings
        self.ranks: dict[tuple[str, str], int] = {}

    def pre_tokenizer_name(self, md: dict[str, Any]) -> Any:
        """The pre-tokenizer's name: the file's `tokenizer.ggml.pre`."""
        return md.get("tokenizer.ggml.pre")

    def defaults(self) -> tuple[VocabFlags, SpecialIds]:
        flags = VocabFlags(add_space_prefix=False, escape_whitespaces=self.pre.spm_style,
                           clean_spaces=self.pre.clean_spaces, ignore_merges=self.pre.ignore_merges,
                           add_bos=self.pre.add_bos, add_sep=self.pre.add_sep)
        ids = SpecialIds(bos=None if self.pre.null_bos else 11, eos=11)
        return flags, ids

    def override_flags(self, flags: VocabFlags) -> None:
        """Gemma 4 needs its BOS, so llama.cpp adds it even where a file's
        add_bos_token says false (as some conversions do)."""
        if self.pre.gemma4:
            flags.add_bos = True

    def attach(self, vocab: Any) -> None:
        super().attach(vocab)
        self._token_to_id = vocab.token_to_id
        if self._merges is not None:
            self.ranks = parse_merges(self._merges, vocab.tokens)
            self._merges = None
        self._ignore_merges = vocab.flags.ignore_merges

    def encode(self, text: str) -> list[int]:
        return self._cache.encode(self.pretokenizer.split(text), self.encode_word)

    def encode_word(self, word: str) -> tuple[int, ...]:
        """Token ids of one pre-tokenized word (uncached)."""
        token_to_id = self._token_to_id
        spm_style = self.pre.spm_style
        encoded = word if spm_style else byte_encode(word)
        # ignore_merges: a word that is a token is that token; Gemma 4: so is a newline run
        if self._ignore_merges or (self.pre.gemma4 and not word.strip("\n")):
            tid = token_to_id.get(encoded)
            if tid is not None:
                return (tid,)
        chars = list(encoded)
        merge = merge_heap if len(chars) > MERGE_HEAP_THRESHOLD else merge_simple
        ids: list[int] = []
        for sym in merge(chars, self.ranks):
            tid = token_to_id.get(sym)
            if tid is not None:
                ids.append(tid)
                continue
            for b in sym.encode("utf-8"):
                if spm_style:
                    tid = token_to_id.get(_BYTE_TOKENS[b])
                else:  # a one-byte token text: ASCII, or a raw byte kept by surrogateescape decoding
                    tid = token_to_id.get(chr(b) if b < 0x80 else chr(0xDC00 + b))
                if tid is not None:
                    ids.append(tid)
        return tuple(ids)

    def normal_piece(self, text: str) -> bytes:
        if self.pre.spm_style:
            return text.replace("\u2581", " ").encode("utf-8", "surrogateescape")
        return byte_decode(text)
