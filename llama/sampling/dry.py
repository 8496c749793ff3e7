"""DRY, "don't repeat yourself" (llama_sampler_init_dry): penalise the tokens that would
extend a sequence already repeated in the last tokens, more the longer the repetition.

A token t gets `multiplier * base ** (n - allowed_length)` taken from its logit when the
last n >= allowed_length tokens, followed by t, already occurred earlier among the last
`penalty_last_n` (n the longest such repetition). Sequence breakers (by default newline,
colon, quote and asterisk) end repetitions: matching never reaches back across one, and a
token that is a breaker on its own is never penalised.

Breakers are strings; `process_breakers` turns them into token sequences as llama.cpp's
`get_overlapping_token_sequences` does: every token whose text contains a breaker is a
breaker by itself (head, no tail), and a token whose text ends with a breaker's beginning is
the head of that breaker's rest, tokenised (at most MAX_TAIL tokens). The search runs over
an index of the vocabulary's texts (`VocabText`) that `Llama` builds once and keeps, with
the result per breaker list. Departure: a breaker cut at MAX_BREAKER_BYTES inside a UTF-8
character leaves a rest that is tokenised with U+FFFD where llama.cpp tokenises the bytes.

Arithmetic as llama.cpp's: the exponent is clamped to 88.7228391f / logf(base) (so the
penalty stays finite), `std::pow(float, int)` is taken in double and the product rounded
to float once, then subtracted from the float logit.
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .candidates import F32, Candidates
from .params import check_float, check_int
from .samplers import Sampler

DEFAULT_BREAKERS = ("\n", ":", "\"", "*")
MAX_BREAKER_BYTES = 40   # llama.cpp truncates a longer breaker
MAX_TAIL = 20            # tokens of a breaker's rest after its head
FLOAT_MAX_LOG = F32(88.7228391)

Breakers = Mapping[int, tuple[tuple[int, ...], ...]]   # head token -> the tails it starts


def process_breakers(breakers: Iterable[str], text: VocabText | Sequence[bytes],
                     tokenize: Callable[[str], list[int]]) -> dict[int, tuple[tuple[int, ...], ...]]:
    """Breaker strings -> head token -> tails. `text`: the vocabulary's `VocabText`, or
    its pieces (pieces[t]: token t's text as llama.cpp's `detokenize({t}, special=true)`
    gives it); `tokenize(text)`: without BOS and without parsing special tokens. An empty
    breaker is an error (llama.cpp skips it with a warning). A breaker costs about the number
    of its occurrences in the vocabulary, not a pass in Python over every token."""
    if not isinstance(text, VocabText):
        text = VocabText(text)
    out: dict[int, list[tuple[int, ...]]] = {}
    seen = set()
    for i, breaker in enumerate(breakers):
        if not isinstance(breaker, str) or not breaker:
            raise ValueError(f"dry_sequence_breakers[{i}] must be a non-empty string, got {breaker!r}")
        s = breaker.encode("utf-8")[:MAX_BREAKER_BYTES]
        if s in seen:
            continue
        seen.add(s)
        whole = text.containing(s)
        for token in whole:
            _add(out, token, ())
        # a token that ends with s[:n] (n < len(s)) and does not hold s: the rest follows it
        for n in range(len(s) - 1, 0, -1):
            heads = [t for t in text.ending_with(s[:n]) if t not in whole]
            if heads:
                tail = tuple(tokenize(s[n:].decode("utf-8", "replace"))[:MAX_TAIL])
                for token in heads:
                    _add(out, token, tail)
    return {head: tuple(tails) for head, tails in out.items()}


class VocabText:
    """A vocabulary's token texts, indexed for the breaker search: all of them back to back
    with where each ends (the tokens holding a string: one `bytes.find` per occurrence), and
    the last MAX_BREAKER_BYTES bytes of each, right-aligned, grouped by last byte (the tokens
    ending with a string: a vectorised compare of the few that end with its last byte).
    Built once per vocabulary (`vocab_text`)."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self.blob = b"".join(pieces)
        self.ends = list(itertools.accumulate(len(p) for p in pieces))
        self.lengths = np.array([len(p) for p in pieces], dtype=np.int64)
        tails = b"".join(p[-MAX_BREAKER_BYTES:].rjust(MAX_BREAKER_BYTES, b"\0") for p in pieces)
        self.tails = np.frombuffer(tails, dtype=np.uint8).reshape(len(pieces), MAX_BREAKER_BYTES)
        last = np.where(self.lengths > 0, self.tails[:, -1].astype(np.int64), -1)
        order = np.argsort(last, kind="stable")
        bounds = np.searchsorted(last[order], np.arange(257))
        self.by_last = [order[bounds[c]:bounds[c + 1]] for c in range(256)]

    def containing(self, s: bytes) -> set[int]:
        """The tokens whose text holds s."""
        found, pos = set(), self.blob.find(s)
        while pos >= 0:
            t = bisect.bisect_right(self.ends, pos)   # the token whose text holds byte pos
            if pos + len(s) <= self.ends[t]:
                found.add(t)
                pos = self.blob.find(s, self.ends[t])   # on from the next token's text
            else:
                pos = self.blob.find(s, pos + 1)
        return found

    def ending_with(self, s: bytes) -> list[int]:
        """The tokens whose text ends with s (len(s) <= MAX_BREAKER_BYTES)."""
        cand = self.by_last[s[-1]]
        want = np.frombuffer(s, dtype=np.uint8)
        hit = (self.lengths[cand] >= len(s)) & (self.tails[cand, MAX_BREAKER_BYTES - len(s):] == want).all(axis=1)
        return cand[hit].tolist()


def vocab_text(vocab: Any) -> VocabText:
    """A `llama.vocab.Vocab`'s token texts as llama.cpp's `detokenize({t}, special=true)`
    gives them, indexed: what `process_breakers` searches."""
    return VocabText([vocab.detokenize_bytes([t], unparse_special=True) for t in range(vocab.n_vocab)])


def model_breakers(model: Any, breakers: Iterable[str],
                   text: VocabText | None = None) -> dict[int, tuple[tuple[int, ...], ...]]:
    """`process_breakers` over a `llama.model.Model`'s vocabulary (`text`: its
    `vocab_text`, when the caller keeps it)."""
    return process_breakers(breakers, vocab_text(model.vocab) if text is None else text,
                            lambda s: model.tokenize(s, add_special=False, parse_special=False))


def _add(out: dict[int, list[tuple[int, ...]]], head: int, tail: tuple[int, ...]) -> None:
    tails = out.setdefault(head, [])
    if tail not in tails:
        tails.append(tail)


class DRY(Sampler):
    """llama_sampler_init_dry(multiplier, base, allowed_length, penalty_last_n, breakers).
    Off (no history kept) when multiplier is 0, base < 1 or penalty_last_n is 0, as in
    llama.cpp; `breakers` as `process_breakers` gives them. Leaves the candidates unsorted."""

    name = "dry"

    def __init__(self, multiplier: float, base: float = 1.75, allowed_length: int = 2,
                 penalty_last_n: int = 64, breakers: Breakers | None = None) -> None:
        self.multiplier = check_float("dry_multiplier", multiplier)
        self.base = check_float("dry_base", base)
        self.allowed_length = check_int("dry_allowed_length", allowed_length, 0)
        self.penalty_last_n = check_int("dry_penalty_last_n", penalty_last_n, 0)
        self.breakers = dict(breakers or {})
        self._last: deque[int] = deque(maxlen=max(self.penalty_last_n, 1))

    @property
    def enabled(self) -> bool:
        return F32(self.multiplier) != 0.0 and F32(self.base) >= 1.0 and self.penalty_last_n != 0

    def accept(self, token: int) -> None:
        if self.enabled:
            self._last.append(token)

    def reset(self) -> None:
        self._last.clear()

    def apply(self, cur: Candidates) -> None:
        if not self.enabled:
            return
        longest = self.repeat_lengths()
        if not longest:
            return
        tokens = np.fromiter(longest.keys(), dtype=np.int64, count=len(longest))
        pos = cur.positions(tokens)
        found = pos >= 0
        if not found.any():
            return
        penalties = np.array([self.penalty(n) for n in longest.values()], dtype=F32)
        logits = cur.logits.copy()
        logits[pos[found]] = logits[pos[found]] - penalties[found]
        cur.logits = logits
        cur.sorted = False

    def penalty(self, repeat_len: int) -> np.float32:
        """multiplier * base ^ (repeat_len - allowed_length), the exponent clamped."""
        exponent = repeat_len - self.allowed_length
        base = F32(self.base)
        if base > F32(1.000001):
            max_exponent = int(FLOAT_MAX_LOG / F32(math.log(float(base))))
            if max_exponent > 0:
                exponent = min(exponent, max_exponent)
        with np.errstate(over="ignore"):   # past FLT_MAX the penalty is inf, as in C
            return F32(float(F32(self.multiplier)) * math.pow(float(base), exponent))

    def repeat_lengths(self) -> dict[int, int]:
        """Token -> the longest repetition (>= allowed_length) it would extend; breakers
        that stand alone are left out (llama.cpp's steps 1 to 3)."""
        last = list(self._last)[-self.penalty_last_n:]
        n = len(last)
        if n <= self.allowed_length:
            return {}
        rat = last[::-1]   # rat[i]: the i-th token from the end, as llama.cpp's ring_buffer
        rep_limit = self._rep_limit(rat)
        if rep_limit < self.allowed_length:
            return {}
        counts = _suffix_repeats(rat, rep_limit)
        longest: dict[int, int] = {}
        for i in range(n - 1):
            length = counts[i]
            if length >= self.allowed_length:
                token = rat[n - 2 - i]
                if longest.get(token, -1) < length:
                    longest[token] = length
        return {t: length for t, length in longest.items() if () not in self.breakers.get(t, ())}

    def _rep_limit(self, rat: list[int]) -> int:
        """How far back a repetition may reach: up to the newest breaker (its whole token
        sequence must match, the longest tail of its head winning)."""
        for i, token in enumerate(rat):
            tails = self.breakers.get(token)
            if tails is None:
                continue
            longest_match = -1
            for tail in tails:
                if longest_match < len(tail) <= i and all(
                        tail[k] == rat[i - k - 1] for k in range(len(tail))):
                    longest_match = len(tail)
            if longest_match >= 0:
                return i - longest_match
        return len(rat)


def _suffix_repeats(rat: list[int], rep_limit: int) -> list[int]:
    """counts[last - k] = how many of the newest tokens also occur ending k tokens earlier
    (capped at rep_limit): the Z-algorithm over the reversed history, llama.cpp's step 2."""
    n = len(rat)
    last = n - 1
    counts = [0] * n
    lt = rt = 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and rat[m] == rat[m + k]:
                m += 1
            counts[last - k] = min(m, rep_limit)
            if m > 0:
                lt, rt = k, k + m - 1
        else:
            p = k - lt
            right_part_len = rt - k + 1
            if counts[last - p] < right_part_len:
                counts[last - k] = min(counts[last - p], rep_limit)
            else:
                i = rt + 1
                while i < n and rat[i] == rat[i - k]:
                    i += 1
                counts[last - k] = min(i - k, rep_limit)
                lt, rt = k, i - 1
    return counts
