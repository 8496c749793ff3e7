"""Batched decode against decoding alone: the check the batched-decode tests of every model
family share."""
from __future__ import annotations

import numpy as np

import llama


def alone(model, prompt: list[int], steps: list[int], n_threads: int = 2, **ctx_options) -> list[np.ndarray]:
    """The logits after the prompt and after each one-token step, in a context of its own
    (ctx_options: more Context keywords, e.g. the KV cache's types)."""
    ctx = llama.Context(model, n_ctx=256, n_threads=n_threads, **ctx_options)
    assert ctx.decode(llama.Batch.from_tokens(prompt)) == 0
    out = [np.array(ctx.get_logits_ith(-1))]
    for tok in steps:
        assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
        out.append(np.array(ctx.get_logits_ith(-1)))
    return out


def check_batched_equals_alone(model, n_seqs: int, n_vocab: int, n_threads: int = 2, **ctx_options) -> None:
    """n_seqs sequences (prompts of 3.. tokens, then 3 one-token steps of all of them in one
    ubatch): each sequence's logits within 1e-4 of the same sequence decoded alone."""
    rng = np.random.default_rng(n_seqs)
    prompts = [[int(t) for t in rng.integers(100, n_vocab, 3 + s)] for s in range(n_seqs)]
    steps = [[int(t) for t in rng.integers(100, n_vocab, 3)] for _ in range(n_seqs)]
    ctx = llama.Context(model, n_ctx=512, n_seq_max=n_seqs, n_threads=n_threads, **ctx_options)
    first = llama.Batch(tokens=[t for p in prompts for t in p],
                        seq_ids=[[s] for s, p in enumerate(prompts) for _ in p],
                        logits=[i == len(p) - 1 for p in prompts for i in range(len(p))])
    assert ctx.decode(first) == 0
    ends = np.cumsum([len(p) for p in prompts]) - 1
    got = [[np.array(ctx.get_logits_ith(int(i)))] for i in ends]
    for k in range(3):
        batch = llama.Batch(tokens=[steps[s][k] for s in range(n_seqs)], seq_ids=[[s] for s in range(n_seqs)],
                            logits=[True] * n_seqs)
        assert ctx.decode(batch) == 0
        for s in range(n_seqs):
            got[s].append(np.array(ctx.get_logits_ith(s)))
    for s in range(n_seqs):
        for step, (a, b) in enumerate(zip(got[s], alone(model, prompts[s], steps[s], n_threads, **ctx_options))):
            assert np.abs(a - b).max() <= 1e-4, f"sequence {s}, step {step}"
