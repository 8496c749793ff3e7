"""The llguidance tokenizer of a `Vocab`, built from its token bytes (no Hugging Face files).

llguidance needs, per token id, the bytes the token stands for, which tokens are special
(they must never be produced as text), the end-of-generation ids, and a tokenize function
(it re-tokenizes bytes the grammar forces, to pick their canonical tokens).

Special tokens follow llama.cpp's `common/llguidance.cpp`: a token is special when its piece
is empty without `special` and non-empty with it (control and unknown tokens). User-defined
tokens (Gemma's "<table>", newline runs) are ordinary text, as in llama.cpp's tokenizer.

Building the tokenizer renders every token and builds llguidance's token trie: about 0.8 s
for SmolLM2's 49k tokens and 3-5 s for Gemma 3's 262k (most of it `token_to_piece`), so it
is built once per vocabulary and kept on the `Vocab` object (`tokenizer_for`).
"""
from __future__ import annotations

import functools
import weakref

import llguidance

from llama.vocab import TokenAttr, Vocab

from .errors import GrammarError

# attribute of a Vocab that holds its llguidance tokenizer once built
_CACHE_ATTR = "_llguidance_tokenizer"
# distinct texts whose tokenization is remembered (JSON forces the same few strings often)
_TOKENIZE_MEMO = 4096


def token_bytes(vocab: Vocab) -> list[bytes]:
    """The bytes of every token, specials included (`token_to_piece(special=True)`)."""
    return [vocab.token_to_piece(tid, special=True) for tid in range(vocab.n_vocab)]


def special_token_ids(vocab: Vocab, pieces: list[bytes]) -> list[int]:
    """Tokens that stand for text only when specials are rendered.

    These are the control and unknown tokens: `token_to_piece` gives them b"" unless
    `special` is set. The attributes are read directly (as plain ints) because asking
    `token_to_piece` twice more per token would double the build time on 262k tokens.
    """
    hidden = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)
    return [tid for tid, piece in enumerate(pieces) if piece and int(vocab.attrs[tid]) & hidden]


def eos_token_ids(vocab: Vocab) -> list[int]:
    """End-of-generation ids, the primary one (EOT, else EOS) first as llama.cpp picks it."""
    primary = vocab.eot_id if vocab.eot_id is not None else vocab.eos_id
    rest = sorted(vocab.eog_ids - {primary})
    ids = ([primary] if primary is not None else []) + rest
    if not ids:
        raise GrammarError(f"{vocab!r} has no end-of-generation token; a grammar cannot end")
    return ids


class VocabTokenizerWrapper:
    """What `llguidance.LLTokenizer` reads from a `TokenizerWrapper`, taken from a Vocab.

    Calling it tokenizes text without BOS/EOS and without parsing special-token text, the
    way llguidance expects. Results are memoised per text: llguidance calls this from the
    mask computation for forced bytes, and a Gemma tokenize call costs milliseconds.
    """

    is_tokenizer_wrapper = True

    def __init__(self, vocab: Vocab) -> None:
        self.tokens = token_bytes(vocab)
        self.special_token_ids = special_token_ids(vocab, self.tokens)
        self.eos_token_id = eos_token_ids(vocab)[0]
        self.bos_token_id = vocab.bos_id
        # weak: the vocab keeps the LLTokenizer, which keeps this wrapper from native code
        # where the garbage collector cannot see a cycle back to the vocab
        self._vocab = weakref.ref(vocab)
        self._tokenize = functools.lru_cache(maxsize=_TOKENIZE_MEMO)(self._tokenize_text)

    def _tokenize_text(self, text: str) -> tuple[int, ...]:
        vocab = self._vocab()
        if vocab is None:
            raise GrammarError("the vocabulary of this llguidance tokenizer was freed")
        return tuple(vocab.tokenize(text, add_special=False, parse_special=False))

    def __call__(self, text: str) -> list[int]:
        return list(self._tokenize(text))


def build_tokenizer(vocab: Vocab) -> llguidance.LLTokenizer:
    """A new llguidance tokenizer for `vocab` (costly: use `tokenizer_for`)."""
    wrapper = VocabTokenizerWrapper(vocab)
    return llguidance.LLTokenizer(wrapper, n_vocab=vocab.n_vocab, eos_token=eos_token_ids(vocab))


def tokenizer_for(vocab: Vocab) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of `vocab`, built on first use and kept on the vocab.

    It lives on the Vocab object (not in a module-level cache), so it is freed with the
    vocabulary. Two threads asking at once may both build it; either result is the same.
    """
    cached = vars(vocab).get(_CACHE_ATTR)
    if cached is None:
        cached = build_tokenizer(vocab)
        setattr(vocab, _CACHE_ATTR, cached)
    return cached
