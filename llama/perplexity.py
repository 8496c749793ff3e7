"""Perplexity as llama.cpp's `llama-perplexity` computes it (the protocol of
tests/golden/*/ppl.json): fixed-size chunks, BOS prepended when the model adds one, and
only the second half of every chunk scored, so each scored token has context behind it."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llama.batch import Batch
from llama.context import Context


@dataclass
class PerplexityResult:
    ppl: float
    ppl_per_chunk: list[float]
    n_scored: int


def perplexity(ctx: Context, text: str, n_ctx: int | None = None, n_chunks: int | None = None
               ) -> PerplexityResult:
    model = ctx.model
    n_ctx = n_ctx or ctx.n_ctx
    if n_ctx > ctx.n_ctx or n_ctx > ctx.n_batch:
        raise ValueError(f"chunks of {n_ctx} tokens need n_ctx and n_batch >= {n_ctx}")
    tokens = model.tokenize(text, add_special=False, parse_special=False)
    add_bos = model.vocab.flags.add_bos
    block = n_ctx - (1 if add_bos else 0)
    available = len(tokens) // block
    n_chunks = available if n_chunks is None else min(n_chunks, available)
    if n_chunks < 1:
        raise ValueError(f"the text has {len(tokens)} tokens, fewer than one chunk of {block}")
    first = n_ctx // 2
    total_nll, total_n, per_chunk = 0.0, 0, []
    for i in range(n_chunks):
        chunk = tokens[i * block:(i + 1) * block]
        if add_bos:
            chunk = [model.vocab.special.bos] + chunk
        ctx.memory.clear()
        logits_flags = [first <= t < n_ctx - 1 for t in range(n_ctx)]
        rc = ctx.decode(Batch(tokens=chunk, pos=list(range(n_ctx)), seq_ids=[0] * n_ctx, logits=logits_flags))
        if rc != 0:
            raise RuntimeError(f"decode failed with {rc} on chunk {i}")
        logits = ctx.get_logits().astype(np.float64)
        targets = np.array(chunk[first + 1:n_ctx])
        mx = logits.max(axis=1)
        lse = mx + np.log(np.exp(logits - mx[:, None]).sum(axis=1))
        nll = lse - logits[np.arange(len(targets)), targets]
        total_nll += float(nll.sum())
        total_n += len(nll)
        per_chunk.append(math.exp(float(nll.mean())))
    return PerplexityResult(math.exp(total_nll / total_n), per_chunk, total_n)
