"""SentencePiece BPE (`tokenizer.ggml.model == "llama"`), as llama.cpp's llm_tokenizer_spm.

A text fragment (spaces already turned into U+2581 "▁") is split into characters, and the
adjacent pair whose concatenation is the vocabulary token with the highest score is merged,
leftmost first on ties, until no adjacent pair forms a token. Each final symbol is its token;
a symbol that is not one falls back to the `<0xNN>` tokens of its UTF-8 bytes.

llama.cpp runs this on a whole fragment with a priority queue of bigrams. The result only
depends on pairs that can merge, and two characters can only end up in one symbol when some
token contains them side by side. So the fragment can be cut wherever that never happens
(before a "▁" that no token has right after the preceding character) and the pieces merged
one at a time, each result cached: the same ids as one big merge, much faster on real text.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Callable

import re

from llama.vocab.bigram_merge import merge_bigrams
from llama.vocab.common import SpecialIds, VocabError, VocabFlags
from llama.vocab.model import TokenizerModel, register_tokenizer_model

SPACE = "\u2581"
MERGE_HEAP_THRESHOLD = 48  # longer chunks use the priority queue, shorter ones plain rescans


def byte_token_text(b: int) -> str:
    """llama.cpp's name of a byte token: upper-case hex, "<0x0A>"."""
    return f"<0x{b:02X}>"


def one_byte_text(b: int) -> str:
    """The token text of a single raw byte as the GGUF reader decodes it (surrogateescape)."""
    return chr(b) if b < 0x80 else chr(0xDC00 + b)


def merge_simple(chars: list[str], token_to_id: dict[str, int], scores: list[float]) -> list[str]:
    """Repeatedly merge the adjacent pair that forms the best-scored token (leftmost on ties).

    Pairs that form no token never merge. The scores of adjacent pairs are kept in a list and
    only the two next to a merge are looked up again.
    """
    syms = list(chars)
    lookup = token_to_id.get

    def get(text: str) -> float | None:
        tid = lookup(text)
        return None if tid is None else scores[tid]

    pair = [get(syms[i] + syms[i + 1]) for i in range(len(syms) - 1)]
    while pair:
        best_i = -1
        best = None
        for i, s in enumerate(pair):
            if s is not None and (best is None or s > best):
                best, best_i = s, i
        if best_i < 0:
            break
        syms[best_i:best_i + 2] = [syms[best_i] + syms[best_i + 1]]
        del pair[best_i]
        if best_i > 0:
            pair[best_i - 1] = get(syms[best_i - 1] + syms[best_i])
        if best_i < len(pair):
            pair[best_i] = get(syms[best_i] + syms[best_i + 1])
    return syms


def merge_heap(chars: list[str], token_to_id: dict[str, int], scores: list[float]) -> list[str]:
    """Same result as merge_simple in O(n log n): llama.cpp's bigram priority queue.

    Entries are keyed by -score and carry the size in characters; an entry is stale when
    either side has changed since it was pushed, which shows as an empty side or a different
    total size (symbols only grow), exactly llama.cpp's test.
    """
    lookup = token_to_id.get

    def rank(left: str, right: str) -> tuple[float, int] | None:
        merged = left + right
        tid = lookup(merged)
        return None if tid is None else (-scores[tid], len(merged))

    return merge_bigrams(chars, rank, lambda left, right, size: len(left) + len(right) == size)


@register_tokenizer_model("llama")
class SPMModel(TokenizerModel):
    """SentencePiece with score-based merges and byte fallback (LLaMA 1/2, Gemma, Mistral v1)."""


    def defaults(self) -> tuple[VocabFlags, SpecialIds]:
        flags = VocabFlags(add_bos=True, add_eos=False, add_space_prefix=True, clean_spaces=False,
                           escape_whitespaces=True)
        return flags, SpecialIds(bos=1, eos=2, unk=0)

    def attach(self, vocab: Any) -> None:
        super().attach(vocab)
        self._token_to_id = vocab.token_to_id
        self._scores = vocab.scores.tolist()
        self._byte_ids = [self._byte_to_token(b) for b in range(256)]
        self.__dict__.pop("_splitter", None)

    @cached_property
    def _splitter(self) -> Callable[[str], list[str]]:
        """Built on first use, so that loading a 262k-token vocabulary stays cheap."""
        return _chunk_splitter(self.vocab.tokens)

    # --- tokenize --------------------------------------------------------------------------

    def tokenize_fragments(self, fragments: list[str | int], add_special: bool) -> list[int]:
        """llama.cpp's SPM arrangement: a space before text that starts the input or follows a
        special token (when add_space_prefix), BOS/EOS as the vocabulary asks."""
        vocab = self.vocab
        out: list[int] = []
        if add_special and vocab.add_bos:
            out.append(vocab.require_special("bos"))
        prefix = vocab.flags.add_space_prefix
        prev_special = True
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if prefix and prev_special:
                frag = " " + frag
            out.extend(self.encode(frag.replace(" ", SPACE)))
            prev_special = False
        if add_special and vocab.add_eos:
            out.append(vocab.require_special("eos"))
        return out

    def encode(self, text: str) -> list[int]:
        """Ids of one escaped fragment ("▁" for spaces, no special tokens inside)."""
        return self._cache.encode(self._splitter(text), self.encode_chunk)

    def encode_chunk(self, chunk: str) -> tuple[int, ...]:
        """Ids of one chunk (uncached): merge, then look up or byte-fall-back each symbol.

        (llama.cpp also keeps a map to re-split a final symbol that is no token into the two
        it was merged from; it never fires, since only pairs that form a token are merged.)
        """
        if not chunk:
            return ()
        merge = merge_heap if len(chunk) > MERGE_HEAP_THRESHOLD else merge_simple
        token_to_id = self._token_to_id
        ids: list[int] = []
        for sym in merge(list(chunk), token_to_id, self._scores):
            tid = token_to_id.get(sym)
            if tid is not None:
                ids.append(tid)
            else:
                ids.extend(self._byte_fallback(sym))
        return tuple(ids)

    def _byte_fallback(self, sym: str) -> list[int]:
        """The byte tokens of a symbol that is no token.

        llama.cpp looks each byte up as "<0xNN>", then as a one-byte token, and throws when
        neither exists. We give the unknown token for the symbol instead (what SentencePiece
        does without byte fallback), or a VocabError when there is none.
        """
        ids = [self._byte_ids[b] for b in sym.encode("utf-8")]
        if None not in ids:
            return ids  # type: ignore[return-value]
        unk = self.vocab.unk_id
        if unk is None:
            raise VocabError(f"cannot tokenize {sym!r}: no token, no byte tokens and no unknown "
                             "token in the vocabulary")
        return [unk]

    def _byte_to_token(self, b: int) -> int | None:
        """llama_vocab::byte_to_token for SPM: "<0xNN>", else the one-byte text, else None."""
        tid = self._token_to_id.get(byte_token_text(b))
        if tid is None:
            tid = self._token_to_id.get(one_byte_text(b))
        return tid

    # --- pieces ----------------------------------------------------------------------------

    def normal_piece(self, text: str) -> bytes:
        return text.replace(SPACE, " ").encode("utf-8", "surrogateescape")

    def linefeed_id(self) -> int | None:
        """The byte token of "\\n"; llama.cpp falls back to the pad id, which is still the SPM
        default (none) when it looks."""
        return self._byte_ids[0x0A]


def _chunk_splitter(tokens: list[str]) -> Callable[[str], list[str]]:
    """A function cutting escaped text before each "▁" that no token joins to the character
    in front of it (see the module docstring); for most vocabularies that is every "▁"
    that follows a non-"▁"."""
    # every character that some token has right before a "▁"; the NUL separator only keeps
    # tokens apart (a NUL inside a token can only add characters, which cuts less: still exact)
    joined = set(re.findall(f"([^\0])(?={SPACE})", "\0".join(tokens)))
    if not joined:
        rx = re.compile(f"(?={SPACE})")
    else:
        cls = "".join(re.escape(c) for c in sorted(joined))
        rx = re.compile(f"(?<![{cls}])(?={SPACE})")

    def split(text: str) -> list[str]:
        return rx.split(text)

    return split
