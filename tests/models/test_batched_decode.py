"""Batched decode (the server's step: one token of each of N sequences in one ubatch): each
sequence's logits equal the same sequence decoded alone, on the real model, for N whose
tokens fall in every register tile of the repacked products (4, 2, 1)."""
import numpy as np
import pytest

import llama


@pytest.fixture(scope="module")
def smol(smollm2_path):
    return llama.Model.load(smollm2_path)


def _alone(model, prompt: list[int], steps: list[int]) -> list[np.ndarray]:
    ctx = llama.Context(model, n_ctx=256, n_threads=2)
    assert ctx.decode(llama.Batch.from_tokens(prompt)) == 0
    out = [np.array(ctx.get_logits_ith(-1))]
    for tok in steps:
        assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
        out.append(np.array(ctx.get_logits_ith(-1)))
    return out


@pytest.mark.parametrize("n_seqs", [2, 5, 7])
def test_each_sequence_of_a_batched_step_equals_it_alone(smol, n_seqs):
    rng = np.random.default_rng(n_seqs)
    prompts = [[int(t) for t in rng.integers(100, 40000, 3 + s)] for s in range(n_seqs)]
    steps = [[int(t) for t in rng.integers(100, 40000, 3)] for _ in range(n_seqs)]
    ctx = llama.Context(smol, n_ctx=512, n_seq_max=n_seqs, n_threads=2)
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
        for step, (a, b) in enumerate(zip(got[s], _alone(smol, prompts[s], steps[s]))):
            assert np.abs(a - b).max() <= 1e-4, f"sequence {s}, step {step}"
