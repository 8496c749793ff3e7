"""Batched decode (the server's step: one token of each of N sequences in one ubatch): each
sequence's logits equal the same sequence decoded alone, on the real model, for N whose
tokens fall in every register tile of the repacked products (4, 2, 1)."""
import numpy as np
import pytest

import llama
from ggmlpy.ir.types import GGMLType
from ggmlpy.testing.models import write_tiny_llama
from tests.llama.models.batched import check_batched_equals_alone


@pytest.fixture(scope="module")
def smol(smollm2_path):
    return llama.Model.load(smollm2_path)


@pytest.mark.parametrize("n_seqs", [2, 5, 7])
def test_each_sequence_of_a_batched_step_equals_it_alone(smol, n_seqs):
    check_batched_equals_alone(smol, n_seqs, n_vocab=40000)


@pytest.mark.parametrize("wtype", [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K],
                         ids=lambda t: t.name)
def test_k_quant_sequences_of_a_batched_step_equal_each_alone(tmp_path, wtype):
    """The same on a small K-quant model (every product over repacked K-quant weights,
    their groups claimed by 3 threads in chunks): 5 sequences a step, tiles of 4 and 1."""
    path = write_tiny_llama(tmp_path / "k.gguf", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                            weight_type=wtype, seed=3)
    check_batched_equals_alone(llama.Model.load(str(path)), 5, n_vocab=320, n_threads=3)


def _blocked_run(model, prompts, steps):
    """Prompts one sequence at a time, then one-token steps of all of them together."""
    n = len(prompts)
    ctx = llama.Context(model, n_ctx=1024, n_seq_max=n, n_threads=2)
    for s, p in enumerate(prompts):
        assert ctx.decode(llama.Batch(tokens=p, seq_ids=[[s]] * len(p))) == 0
    got = [[] for _ in range(n)]
    for k in range(len(steps[0])):
        batch = llama.Batch(tokens=[steps[s][k] for s in range(n)], seq_ids=[[s] for s in range(n)],
                            logits=[True] * n)
        assert ctx.decode(batch) == 0
        for s in range(n):
            got[s].append(np.array(ctx.get_logits_ith(s)))
    return ctx, got


def test_sequences_in_blocks_of_their_own_equal_each_alone(smol, monkeypatch):
    """Prompts of 70-150 tokens, then batched steps: each sequence's cells sit in blocks of
    its own (llama/kv_cells.py, seq_block), the attention kernels compute each token on its
    own sequence's blocks only, and every sequence's logits equal it decoded alone; forcing
    the kernels' tiles together (kernels/extent.py TILES_APART) gives the same bits."""
    from ggmlpy.codegen_cpu.kernels import extent
    from llama.kv_cells import SEQ_BLOCK

    rng = np.random.default_rng(11)
    prompts = [[int(t) for t in rng.integers(100, 40000, n)] for n in (150, 70, 120, 95)]
    steps = [[int(t) for t in rng.integers(100, 40000, 3)] for _ in prompts]
    ctx, got = _blocked_run(smol, prompts, steps)
    cells = ctx.memory.cells
    assert cells.seq_block == SEQ_BLOCK
    for b0 in range(0, cells.size, SEQ_BLOCK):
        assert cells.seq[b0:b0 + SEQ_BLOCK].any(axis=0).sum() <= 1, f"block at cell {b0}"
    for s in range(len(prompts)):
        alone = _alone_long(smol, prompts[s], steps[s])
        for step, (a, b) in enumerate(zip(got[s], alone)):
            assert np.abs(a - b).max() <= 1e-4, f"sequence {s}, step {step}"
    monkeypatch.setattr(extent, "TILES_APART", False)
    _, together = _blocked_run(smol, prompts, steps)
    for a, b in zip(got, together):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def _alone_long(model, prompt, steps):
    ctx = llama.Context(model, n_ctx=512, n_threads=2)
    assert ctx.decode(llama.Batch.from_tokens(prompt)) == 0
    out = []
    for tok in steps:
        assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
        out.append(np.array(ctx.get_logits_ith(-1)))
    return out
