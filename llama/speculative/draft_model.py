"""llama.cpp's `draft-simple`: a smaller model of the same vocabulary guesses the next tokens.

The draft model has its own context, one sequence per target sequence. Each draft first
brings the draft context's cache to the target's history (the engine's prefix reuse: the
tokens both already agree on stay, a rejected guess is dropped), then picks greedily: the
most likely of the draft's top 10 tokens, until `n_max` are drafted or that token's share
of the top 10's probability falls below `p_min` (llama.cpp's common/speculative.cpp). A
draft shorter than `n_min` is not used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence as Seq

import numpy as np

from llama.api.engine import Engine
from llama.context import Context
from llama.model import Model
from llama.speculative.drafters import Drafter, TargetDraft
from llama.vocab.vocab import Vocab

TOP_K = 10               # llama.cpp's draft sampler: top-k 10, then the best of those
MAX_VOCAB_DIFFERENCE = 128


@dataclass(frozen=True)
class DraftLimits:
    """llama.cpp's limits of a model's draft (`--spec-draft-n-max/-n-min/-p-min`), which
    draft-simple and draft-mtp share."""

    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0

    def __post_init__(self) -> None:
        if self.n_max < 0 or self.n_min < 0 or not 0.0 <= self.p_min <= 1.0:
            raise ValueError(f"draft n_max and n_min must be >= 0 and p_min in [0, 1], "
                             f"got {self.n_max}, {self.n_min}, {self.p_min}")

    def greedy(self, n_max: int, logits: np.ndarray, advance: Callable[[int, int], np.ndarray | None],
               n_vocab: int | None = None) -> list[int]:
        """Up to min(n_max, self.n_max) tokens, each the best of the top 10 of `logits`
        (among the first n_vocab) while its share is at least p_min; `advance(token,
        n_drafted)` gives the logits after it (None: no room for more). A draft shorter than
        n_min is dropped."""
        n_max = min(n_max, self.n_max)
        out: list[int] = []
        while logits is not None and len(out) < n_max:
            token, p = best_of_top_k(logits[:n_vocab])
            if p < self.p_min:
                break
            out.append(token)
            if len(out) < n_max:
                logits = advance(token, len(out))
        return out if len(out) >= self.n_min else []


class DraftModel(Drafter):
    def __init__(self, ctx: Context, *, n_max: int = 3, n_min: int = 0, p_min: float = 0.0,
                 n_vocab: int | None = None):
        """`n_vocab`: the target's vocabulary size; a draft model with more tokens (up to 128
        more pass the vocabulary check) picks among the target's only, as a token the target
        lacks would fail its decode (None: all of the draft's)."""
        self.limits = DraftLimits(n_max, n_min, p_min)
        self.ctx = ctx
        self.n_vocab = n_vocab
        self.engine = Engine(ctx)

    @classmethod
    def load(cls, path: str, target: Model, *, n_ctx: int, n_seq_max: int, n_threads: int,
             **options) -> "DraftModel":
        """The draft model at `path`, with a context as large as the target's; refused when
        its vocabulary differs from the target's (`check_compatible`)."""
        model = Model.load(path)
        check_compatible(target.vocab, model.vocab, path)
        ctx = Context(model, n_ctx=n_ctx, n_seq_max=n_seq_max, n_threads=n_threads,
                      n_threads_batch=n_threads)
        drafter = cls(ctx, n_vocab=target.vocab.n_vocab, **options)
        drafter.engine.warmup()
        return drafter

    def draft(self, seq_id: int, history: Seq[int], n_max: int) -> list[int]:
        if min(n_max, self.limits.n_max) <= 0 or len(history) >= self.ctx.n_ctx:
            return []

        def advance(token: int, n_drafted: int) -> np.ndarray | None:
            if len(history) + n_drafted >= self.ctx.n_ctx:
                return None
            return self.engine.decode_step([(seq_id, token)])[0]
        return self.limits.greedy(n_max, self.engine.prefill(seq_id, list(history)), advance, self.n_vocab)


class DraftFile(TargetDraft):
    """`Llama(draft_model=DraftFile(path, n_max=...))`: a draft model (draft-simple) with a
    context like the target's (its size, sequences and threads)."""

    def __init__(self, path: str, *, n_max: int = 3, n_min: int = 0, p_min: float = 0.0):
        self.path, self.options = str(path), dict(n_max=n_max, n_min=n_min, p_min=p_min)

    def bind(self, target: Engine) -> DraftModel:
        ctx = target.ctx
        return DraftModel.load(self.path, ctx.model, n_ctx=ctx.n_ctx, n_seq_max=ctx.n_seq_max,
                               n_threads=ctx.n_threads, **self.options)


def best_of_top_k(logits: np.ndarray, k: int = TOP_K) -> tuple[int, float]:
    """The most likely token and its probability among the k most likely (llama.cpp's draft
    sampler normalises over its top k only)."""
    top = np.argpartition(logits, -k)[-k:] if len(logits) > k else np.arange(len(logits))
    values = logits[top].astype(np.float64)
    best = int(np.argmax(values))
    p = np.exp(values - values[best])
    return int(top[best]), float(1.0 / p.sum())


def check_compatible(target: Vocab, draft: Vocab, path: str) -> None:
    """llama.cpp's rule for a draft model: the same tokenizer model, BOS/EOS handling and
    ids, vocabulary sizes within 128 of each other, and the same text for every token from
    id 5 on."""
    problems = []
    if target.model_name != draft.model_name:
        problems.append(f"tokenizer {draft.model_name!r}, the target's {target.model_name!r}")
    for name, add_t, add_d, id_t, id_d in (
            ("bos", target.add_bos, draft.add_bos, target.special.bos, draft.special.bos),
            ("eos", target.add_eos, draft.add_eos, target.special.eos, draft.special.eos)):
        if add_t != add_d or (add_t and id_t != id_d):
            problems.append(f"add_{name} {add_d} with {name} {id_d}, the target's {add_t} with {id_t}")
    if abs(target.n_vocab - draft.n_vocab) > MAX_VOCAB_DIFFERENCE:
        problems.append(f"{draft.n_vocab} tokens, the target's {target.n_vocab}")
    else:
        n = min(target.n_vocab, draft.n_vocab)
        differ = next((i for i in range(5, n) if target.tokens[i] != draft.tokens[i]), None)
        if differ is not None:
            problems.append(f"token {differ} is {draft.tokens[differ]!r}, the target's {target.tokens[differ]!r}")
    if problems:
        raise ValueError(f"draft model {path}: its vocabulary does not match the target's ("
                         + "; ".join(problems) + ")")
