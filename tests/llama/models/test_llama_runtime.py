"""decode semantics on a tiny random llama GGUF (reference backend): batches of several
sequences, ubatch splitting, KV cache operations, return codes, graph reuse."""
from __future__ import annotations

import numpy as np
import pytest

import llama
from ggmlpy.testing.models import write_tiny_llama
from llama.graph_inputs import GraphParams


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")
    return llama.Model.load(path)


def make_ctx(model, **kw):
    kw.setdefault("n_ctx", 256)
    kw.setdefault("backend", "ref")
    return llama.Context(model, **kw)


def last_logits(model, ids, **kw):
    ctx = make_ctx(model, **kw)
    assert ctx.decode(llama.Batch.from_tokens(ids)) == 0
    return ctx.get_logits_ith(-1).copy()


PROMPTS = [[5, 17, 200, 33, 41], [300, 2, 9], [77, 78, 79, 80, 81, 82, 83, 84]]


def test_three_sequences_in_one_batch_equal_each_alone(tiny_model):
    alone = [last_logits(tiny_model, p) for p in PROMPTS]
    tokens, pos, seqs, flags = [], [], [], []
    for s, p in enumerate(PROMPTS):
        tokens += p
        pos += list(range(len(p)))
        seqs += [s] * len(p)
        flags += [False] * (len(p) - 1) + [True]
    ctx = make_ctx(tiny_model, n_seq_max=3)
    assert ctx.decode(llama.Batch(tokens=tokens, pos=pos, seq_ids=seqs, logits=flags)) == 0
    ends = np.cumsum([len(p) for p in PROMPTS]) - 1
    for s in range(3):
        np.testing.assert_allclose(ctx.get_logits_ith(int(ends[s])), alone[s], atol=1e-4, rtol=0)
    # negative indices count outputs from the end
    np.testing.assert_array_equal(ctx.get_logits_ith(-1), ctx.get_logits_ith(int(ends[2])))
    np.testing.assert_array_equal(ctx.get_logits_ith(-3), ctx.get_logits_ith(int(ends[0])))


def test_interleaved_sequences_use_split_equal(tiny_model):
    """Tokens of two sequences interleaved in batch order still give each sequence's logits."""
    a, b = PROMPTS[0][:3], PROMPTS[1]
    tokens = [a[0], b[0], a[1], b[1], a[2], b[2]]
    seqs = [0, 1, 0, 1, 0, 1]
    pos = [0, 0, 1, 1, 2, 2]
    ctx = make_ctx(tiny_model, n_seq_max=2)
    assert ctx.decode(llama.Batch(tokens=tokens, pos=pos, seq_ids=seqs, logits=[True] * 6)) == 0
    np.testing.assert_allclose(ctx.get_logits_ith(4), last_logits(tiny_model, a), atol=1e-4, rtol=0)
    np.testing.assert_allclose(ctx.get_logits_ith(5), last_logits(tiny_model, b), atol=1e-4, rtol=0)


def test_ubatch_32_equals_ubatch_512(tiny_model):
    ids = [int(t) for t in np.random.default_rng(1).integers(1, 300, 100)]
    outs = []
    for n_ubatch in (32, 512):
        ctx = make_ctx(tiny_model, n_ctx=512, n_batch=512, n_ubatch=n_ubatch)
        assert ctx.decode(llama.Batch.from_tokens(ids, logits_all=True)) == 0
        outs.append(ctx.get_logits().copy())
    assert outs[0].shape == (100, tiny_model.n_vocab)
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-4, rtol=0)


def test_seq_rm_then_redecode_equals_fresh(tiny_model):
    ids = [11, 22, 33, 44, 55, 66]
    fresh = last_logits(tiny_model, ids)
    ctx = make_ctx(tiny_model)
    assert ctx.decode(llama.Batch.from_tokens([11, 22, 33, 99, 98, 97, 96])) == 0
    assert ctx.memory.seq_rm(0, 3, -1)
    assert ctx.memory.seq_pos_max(0) == 2
    assert ctx.decode(llama.Batch.from_tokens([44, 55, 66])) == 0  # positions continue at 3
    np.testing.assert_allclose(ctx.get_logits_ith(-1), fresh, atol=1e-4, rtol=0)


def test_seq_add_shifts_keys(tiny_model):
    """Moving every position by the same delta leaves attention unchanged (RoPE is relative),
    which only holds if the cached keys are re-rotated (K-shift)."""
    prompt, nxt = [3, 14, 15, 92, 65, 35], 89
    ctx = make_ctx(tiny_model)
    assert ctx.decode(llama.Batch.from_tokens(prompt)) == 0
    ctx.memory.seq_add(0, 0, -1, 7)
    assert ctx.memory.seq_pos_min(0) == 7 and ctx.memory.seq_pos_max(0) == 12
    assert ctx.decode(llama.Batch.from_tokens([nxt])) == 0
    ref = make_ctx(tiny_model)
    assert ref.decode(llama.Batch(tokens=prompt + [nxt], pos=list(range(7, 14)), seq_ids=[0] * 7)) == 0
    np.testing.assert_allclose(ctx.get_logits_ith(-1), ref.get_logits_ith(-1), atol=2e-2, rtol=0)
    # moving the positions without re-rotating the keys gives clearly different logits
    no_shift = make_ctx(tiny_model)
    assert no_shift.decode(llama.Batch.from_tokens(prompt)) == 0
    no_shift.memory.seq_add(0, 0, -1, 7)
    no_shift.memory.cells.reset_shift()
    assert no_shift.decode(llama.Batch.from_tokens([nxt])) == 0
    assert np.abs(no_shift.get_logits_ith(-1) - ref.get_logits_ith(-1)).max() > 5e-2


def test_full_kv_cache_returns_1_and_changes_nothing(tiny_model):
    ctx = make_ctx(tiny_model, n_ctx=256, n_batch=256, n_ubatch=64)
    assert ctx.decode(llama.Batch.from_tokens(list(range(1, 201)))) == 0
    assert ctx.memory.seq_pos_max(0) == 199
    assert ctx.decode(llama.Batch.from_tokens(list(range(1, 101)))) == 1  # 300 > 256 cells
    assert ctx.memory.seq_pos_max(0) == 199
    assert ctx.memory.cells.used == 200


def test_invalid_batches_return_minus_one(tiny_model):
    ctx = make_ctx(tiny_model, n_seq_max=2)
    assert ctx.decode(llama.Batch.from_tokens([1, tiny_model.n_vocab])) == -1
    assert ctx.decode(llama.Batch.from_tokens([-1])) == -1
    assert ctx.decode(llama.Batch(tokens=[1, 2], seq_ids=[0, 2])) == -1
    assert ctx.decode(llama.Batch(tokens=[])) == -1
    assert ctx.memory.seq_pos_max(0) == -1  # nothing was written


def test_reuse_counter_grows_on_single_token_decodes(tiny_model):
    ctx = make_ctx(tiny_model)
    assert ctx.decode(llama.Batch.from_tokens([1, 2, 3])) == 0
    assert ctx.decode(llama.Batch.from_tokens([4])) == 0
    first = ctx.n_reused
    for i in range(5):
        assert ctx.decode(llama.Batch.from_tokens([5 + i])) == 0
        assert ctx.n_reused == first + i + 1


def test_signature_shared_by_every_ubatch_size(tiny_model):
    """One compiled graph serves every prompt length: the graph does not depend on the token
    count. Only the tokens class (single-token decode vs prompt) splits signatures."""
    ctx = make_ctx(tiny_model, n_ctx=512)
    multi = ctx.build_graph(GraphParams("multi", False, ctx.n_ctx)).graph.signature()
    single = ctx.build_graph(GraphParams("single", False, ctx.n_ctx)).graph.signature()
    assert multi != single
    for ids in ([7], [1, 2, 3, 4, 5], list(range(1, 301))):
        c = make_ctx(tiny_model, n_ctx=512)
        n_before = c.graph_cache.misses
        assert c.decode(llama.Batch.from_tokens(ids)) == 0
        assert c.graph_cache.misses == n_before  # served by the graphs reserved at creation
        sig = c._prev.graph.signature()
        assert sig == (single if len(ids) == 1 else multi)


def test_get_logits_ith_errors(tiny_model):
    ctx = make_ctx(tiny_model)
    assert ctx.decode(llama.Batch.from_tokens([1, 2, 3])) == 0
    with pytest.raises(IndexError, match="not flagged"):
        ctx.get_logits_ith(0)
    with pytest.raises(IndexError):
        ctx.get_logits_ith(-2)
    assert ctx.get_logits_ith(2).shape == (tiny_model.n_vocab,)


def test_context_parameter_errors(tiny_model):
    with pytest.raises(ValueError, match="n_ubatch"):
        make_ctx(tiny_model, n_batch=64, n_ubatch=128)
    with pytest.raises(ValueError, match="n_seq_max"):
        make_ctx(tiny_model, n_seq_max=0)
    with pytest.raises(ValueError, match="unknown backend"):
        make_ctx(tiny_model, backend="tpu")
    assert make_ctx(tiny_model, n_ctx=300).n_ctx == 512  # rounded up to a multiple of 256


def test_failed_ubatch_leaves_cache_consistent(tiny_model, monkeypatch):
    ctx = make_ctx(tiny_model, n_ubatch=4, n_batch=64)
    assert ctx.decode(llama.Batch.from_tokens([1, 2, 3])) == 0
    calls = {"n": 0}
    real = ctx._process_ubatch

    def failing(ub, slot):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("simulated compute failure")
        return real(ub, slot)

    monkeypatch.setattr(ctx, "_process_ubatch", failing)
    assert ctx.decode(llama.Batch.from_tokens(list(range(10, 20)))) < -1
    # the first ubatch (4 tokens) stays, the failed one left nothing behind
    assert ctx.memory.seq_pos_max(0) == 2 + 4
    assert ctx.memory.cells.used == 7


def test_abort_callback_returns_2(tiny_model):
    ctx = make_ctx(tiny_model, n_ubatch=4, n_batch=64, abort_callback=lambda: True)
    assert ctx.decode(llama.Batch.from_tokens([1, 2, 3, 4, 5, 6])) == 2
    assert ctx.memory.seq_pos_max(0) == -1
