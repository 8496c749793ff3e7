"""`GrammarSampler`: llguidance's matcher as the first stage of a sampler chain.

Like llama.cpp's grammar sampler (`llama_sampler_init_llg`), `apply` sets the logits of
forbidden tokens to -inf and `accept` advances the matcher. It runs first in the chain
(docs/architecture.md, decision 12), so every later stage (penalties, top-k, temperature, dist or greedy)
only ever sees tokens the grammar allows; this is llama.cpp's `grammar_first` order, without
its sample-then-check shortcut.

Prompt tokens. The generation loop feeds the prompt to the chain's `accept` (for the
repetition penalties), but the prompt is not output and must not reach the matcher.
llama.cpp's common sampler solves this with `common_sampler_accept(..., accept_grammar)`,
false for prompt tokens. Here the rule is structural instead: the matcher consumes a token
only when `apply` ran since the previous accepted token, i.e. when the token was sampled
under the grammar's mask. Tokens accepted without a sampling step in between (a prompt, a
chat history) are context and are ignored. No caller has to pass a flag, and a chain built
by `make_sampler(grammar=...)` works with the existing `generate()` loop unchanged.

Prefetch. With `prefetch=True` (the default) the mask of the next step starts computing in
a worker thread as soon as a token is accepted (and when the sampler is built or reset), so
it overlaps the decode of that token; `apply` then only waits for what is left.
"""
from __future__ import annotations

import llguidance
import numpy as np

from llama.sampling import Candidates, Sampler
from llama.vocab import Vocab

from .errors import GrammarError
from .mask import MaskComputer, MaskStats, TokenMask
from .spec import Grammar
from .tokenizer import tokenizer_for

_NEG_INF = np.float32(-np.inf)
_SPARSE = 8  # at most 1/8 of the candidates allowed: mask by the allowed ids


class GrammarSampler(Sampler):
    """Masks the candidates to the tokens `grammar` allows next.

    vocab: the model's vocabulary (its llguidance tokenizer is built once and kept on it).
    grammar: a `Grammar` (a `LlamaGrammar` is one). A grammar the tokenizer cannot use
    raises `GrammarError` here, before any generation.
    prefetch: compute the next mask in the background after each accepted token.
    """

    name = "grammar"

    def __init__(self, vocab: Vocab, grammar: Grammar, *, prefetch: bool = True) -> None:
        if not isinstance(grammar, Grammar):
            raise GrammarError(f"grammar must be a Grammar or LlamaGrammar, got "
                               f"{type(grammar).__name__}")
        self.grammar = grammar
        self.prefetch_enabled = prefetch
        self._vocab = vocab
        self._matcher = llguidance.LLMatcher(tokenizer_for(vocab), grammar.definition, log_level=0)
        if self._matcher.is_error():
            raise GrammarError(f"invalid {grammar.kind} grammar for this vocabulary: "
                               f"{self._matcher.get_error()}")
        eog = np.array(sorted(vocab.eog_ids), dtype=np.int64)
        self._masks = MaskComputer(self._matcher, vocab.n_vocab, eog)
        self._sampled = False  # apply() ran since the last accepted token
        self._n_consumed = 0
        if prefetch:
            self.prefetch()

    # --- the Sampler interface ---------------------------------------------------------------

    def apply(self, cur: Candidates) -> None:
        """Set the logits of tokens the grammar forbids here to -inf."""
        mask = self._masks.get()
        if len(mask.ids) * _SPARSE <= len(cur):
            # few tokens allowed (most JSON steps): find them instead of testing every
            # candidate, which costs a gather over 262k ids for Gemma
            pos = cur.positions(mask.ids)
            pos = pos[pos >= 0]
            if len(pos) == 0:
                raise GrammarError(self._no_token_message(mask))
            logits = np.full(len(cur), _NEG_INF, dtype=np.float32)
            logits[pos] = cur.logits[pos]
        else:
            keep = np.take(mask.allowed, cur.ids)
            if not keep.any():
                raise GrammarError(self._no_token_message(mask))
            logits = np.where(keep, cur.logits, _NEG_INF)
        cur.logits = logits
        cur.sorted = False  # -inf entries may now sit between finite ones
        self._sampled = True

    def accept(self, token: int) -> None:
        """Consume a sampled token; tokens accepted without a sampling step are ignored.

        Raises GrammarError (and leaves the matcher as it was) if the grammar forbids the
        token here.
        """
        if not self._sampled:
            return  # prompt/context token: see the module docstring
        allowed = self._masks.get().allowed
        if not 0 <= token < len(allowed) or not allowed[token]:
            raise GrammarError(f"token {token} is not allowed by the {self.grammar.kind} grammar "
                               f"after {self._n_consumed} generated tokens"
                               f"{self._piece_note(token)}")
        self._masks.invalidate()
        if not self._matcher.consume_token(token):
            raise GrammarError(f"the grammar matcher rejected token {token}: "
                               f"{self._matcher.get_error()}")
        self._sampled = False
        self._n_consumed += 1
        if self.prefetch_enabled:
            self.prefetch()

    def reset(self) -> None:
        """Back to the start of the grammar (a new generation)."""
        self._masks.invalidate()
        self._matcher.reset()
        self._sampled = False
        self._n_consumed = 0
        if self.prefetch_enabled:
            self.prefetch()

    # --- grammar state -----------------------------------------------------------------------

    def prefetch(self) -> None:
        """Start computing the mask of the current state in a background thread.

        Call it right after `accept` (done automatically when `prefetch_enabled`) so the
        computation overlaps the next decode; `apply` waits for it.
        """
        self._masks.start()

    def is_finished(self) -> bool:
        """True when nothing more can follow: only an end-of-generation token is allowed."""
        self._masks.settle()
        return self._matcher.is_stopped()

    def is_accepting(self) -> bool:
        """True when the output so far is a complete match (generation may end here)."""
        self._masks.settle()
        return self._matcher.is_accepting()

    def allowed_tokens(self) -> np.ndarray:
        """A copy of the current mask: bool per token id (end-of-generation ids included)."""
        return self._masks.get().allowed.copy()

    @property
    def n_consumed(self) -> int:
        """Generated tokens the matcher has consumed since the start or the last reset."""
        return self._n_consumed

    @property
    def stats(self) -> MaskStats:
        """Mask timings since the sampler was built."""
        return self._masks.stats

    def close(self) -> None:
        """Stop the prefetch thread (it is also stopped when the sampler is collected)."""
        self._masks.close()

    # --- messages ----------------------------------------------------------------------------

    def _piece_note(self, token: int) -> str:
        if not 0 <= token < self._vocab.n_vocab:
            return f" (outside the vocabulary of {self._vocab.n_vocab})"
        note = f" ({self._vocab.token_to_piece(token, special=True)!r})"
        if self._vocab.is_eog(token):
            note += ": the output is not complete yet, it cannot end here"
        return note

    def _no_token_message(self, mask: TokenMask) -> str:
        error = self._matcher.get_error()
        if error:
            return f"the grammar matcher is in an error state: {error}"
        if len(mask.ids) == 0:
            return "the grammar allows no token here"
        return "the grammar allows none of the remaining candidates (is the grammar sampler " \
               "first in the chain?)"

    def __repr__(self) -> str:
        return f"GrammarSampler({self.grammar!r}, consumed={self._n_consumed})"
