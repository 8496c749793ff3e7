"""Log-probabilities of generated tokens, in OpenAI's two response shapes.

A token's logprob is taken from the model's raw logits for that step (log_softmax over the
whole vocabulary, before any sampler reshapes them), as llama-cpp-python and OpenAI report
it: the model's own belief, not the sampler's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llama.api.text_stream import complete_utf8_end


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log_softmax of one row (a float32 sum over 262k tokens loses digits)."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


@dataclass
class TokenLogprob:
    """One generated token: its id, bytes, logprob and the `top` best alternatives."""
    token: int
    piece: bytes
    logprob: float
    top: list[tuple[int, bytes, float]]


def token_logprob(logits: np.ndarray, token: int, n_top: int, piece_of) -> TokenLogprob:
    """`piece_of(id) -> bytes`; the top list is sorted best first, ties by id."""
    lp = log_softmax(logits)
    top: list[tuple[int, bytes, float]] = []
    if n_top > 0:
        n_top = min(n_top, len(lp))
        best = np.argpartition(-lp, n_top - 1)[:n_top]
        best = best[np.lexsort((best, -lp[best]))]
        top = [(int(i), piece_of(int(i)), float(lp[i])) for i in best]
    return TokenLogprob(int(token), piece_of(int(token)), float(lp[token]), top)


def sampled_logprob(probs: np.ndarray, ids: np.ndarray, selected: int, n_top: int,
                    piece_of) -> TokenLogprob:
    """The chosen token and the `n_top` most probable candidates by the probabilities the
    sampler chain ended with (llama-server's post_sampling_probs), as log-probabilities.
    A chain that computed none (greedy) gives the chosen token probability 1, alone."""
    token = int(ids[selected])
    if not probs.any():
        return TokenLogprob(token, piece_of(token), 0.0, [(token, piece_of(token), 0.0)][:n_top])
    with np.errstate(divide="ignore"):
        lp = np.log(np.asarray(probs, dtype=np.float64))
    order = np.argsort(-lp, kind="stable")[:n_top]
    top = [(int(ids[i]), piece_of(int(ids[i])), float(lp[i])) for i in order]
    return TokenLogprob(token, piece_of(token), float(lp[selected]), top)


def _text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


class CharOffsets:
    """Where each of a run of consecutive pieces starts, in characters of their joined text
    as the completion returns it (invalid bytes as U+FFFD), from `start`. A piece that starts
    inside a character split across pieces starts where that character does, so every
    offset indexes into the text (llama-cpp-python's offsets, the length of the text before
    the token). Only the bytes of an unfinished character are kept between pieces."""

    def __init__(self, start: int = 0):
        self.chars = start
        self.tail = bytearray()   # bytes not yet counted: at most an unfinished character

    def add(self, piece: bytes) -> int:
        """The offset where `piece` starts; `piece` then follows it."""
        cut = complete_utf8_end(self.tail, len(self.tail))
        self.chars += len(self.tail[:cut].decode("utf-8", errors="replace"))
        del self.tail[:cut]
        self.tail += piece
        return self.chars


def completion_logprobs(entries: list[TokenLogprob], offsets: CharOffsets) -> dict:
    """The `text_completion` shape: parallel lists, top alternatives as {token: logprob}
    (the chosen token always among them, as llama-cpp-python and OpenAI do). `offsets`
    places the entries' pieces, which follow the ones it has seen. A token's text is its
    piece's, the bytes of a character split across tokens left out (llama-cpp-python
    decodes each token with errors="ignore")."""
    tokens, text_offsets, lps, tops = [], [], [], []
    for e in entries:
        text = e.piece.decode("utf-8", errors="ignore")
        tokens.append(text)
        text_offsets.append(offsets.add(e.piece))
        lps.append(e.logprob)
        top = {p.decode("utf-8", errors="ignore"): lp for _, p, lp in e.top}
        top[text] = e.logprob
        tops.append(top)
    return {"tokens": tokens, "text_offset": text_offsets, "token_logprobs": lps, "top_logprobs": tops}


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    """The `chat.completion` shape: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    def item(piece: bytes, lp: float) -> dict:
        return {"token": _text(piece), "logprob": lp, "bytes": list(piece)}
    content = [dict(item(e.piece, e.logprob), top_logprobs=[item(p, lp) for _, p, lp in e.top])
               for e in entries]
    return {"content": content, "refusal": None}
