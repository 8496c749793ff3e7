"""The engine under Llama (and the server): several sequences in one decode, prefix reuse
with a sliding-window cache, and failures that record nothing."""
import numpy as np
import pytest

import llama
from llama.api.engine import DecodeError, Engine


@pytest.fixture(scope="module")
def smol_model(smollm2_path):
    return llama.Model.load(smollm2_path)


def _alone(model, tokens_steps):
    """Logits of each step of one sequence decoded by itself in a fresh context."""
    ctx = llama.Context(model, n_ctx=512, n_threads=2)
    out = []
    for toks in tokens_steps:
        assert ctx.decode(llama.Batch.from_tokens(toks)) == 0
        out.append(np.array(ctx.get_logits_ith(-1)))
    return out


def test_a_mixed_step_equals_each_sequence_alone(smol_model):
    m = smol_model
    ctx = llama.Context(m, n_ctx=1024, n_seq_max=4, n_threads=2)
    engine = Engine(ctx)
    prompts = [m.tokenize(t) for t in ("Hello there", "The capital of France is", "1 2 3 4")]
    first = engine.decode_mixed([(i, p, True) for i, p in enumerate(prompts)])
    picks = [int(np.argmax(r)) for r in first]
    # a step mixing two generated tokens with a new sequence's prompt chunk
    late = m.tokenize("Once upon a time")
    step = engine.decode_mixed([(0, [picks[0]], True), (1, [picks[1]], True), (3, late, True),
                                (2, [picks[2]], False)])
    assert step[3] is None
    for i, p in enumerate(prompts[:2]):
        ref = _alone(m, [p, [picks[i]]])
        assert np.abs(ref[0] - first[i]).max() <= 1e-4
        assert np.abs(ref[1] - step[i]).max() <= 1e-4
    assert np.abs(_alone(m, [late])[0] - step[2]).max() <= 1e-4
    assert engine.cached[2] == prompts[2] + [picks[2]]


def test_failed_steps_record_nothing(smol_model):
    ctx = llama.Context(smol_model, n_ctx=512, n_batch=64, n_ubatch=64, n_seq_max=2, n_threads=2)
    engine = Engine(ctx)
    engine.prefill(0, [1, 2, 3])
    with pytest.raises(ValueError, match="exceeds n_batch"):
        engine.decode_mixed([(0, list(range(10, 80)), True)])
    with pytest.raises(DecodeError, match="invalid batch"):
        engine.decode_mixed([(0, [5], True), (1, [10**6], True)])
    assert engine.cached == [[1, 2, 3], []]
    assert ctx.memory.seq_pos_max(0) == 2 and ctx.memory.seq_pos_max(1) == -1


def test_prefix_reuse_respects_the_sliding_window(gemma3_path):
    """Gemma 3's windowed layers keep only recent cells: a prefix is reused only while they
    still hold what the next token attends to; either way the logits equal a fresh decode."""
    m = llama.Model.load(gemma3_path)
    ctx = llama.Context(m, n_ctx=2048, n_threads=2)
    engine = Engine(ctx)
    rng = np.random.default_rng(0)
    long = [2] + [int(x) for x in rng.integers(100, 20000, 1299)]
    engine.prefill(0, long)
    assert ctx.memory.seq_pos_min(0) > 0  # the window cache has dropped the oldest cells
    extended = long + [int(x) for x in rng.integers(100, 20000, 12)]
    before = engine.n_prompt_decoded
    got_ext = engine.prefill(0, extended)
    assert engine.n_prompt_decoded - before == 12
    short = long[:300] + [7, 8, 9]
    before = engine.n_prompt_decoded
    got_short = engine.prefill(0, short)
    assert engine.n_prompt_decoded - before == len(short)  # the window lost positions < 300
    fresh = llama.Context(m, n_ctx=2048, n_threads=2)
    for toks, got in ((extended, got_ext), (short, got_short)):
        fresh.memory.clear()
        for i in range(0, len(toks), 512):
            assert fresh.decode(llama.Batch.from_tokens(toks[i:i + 512])) == 0
        assert np.abs(fresh.get_logits_ith(-1) - got).max() <= 1e-3


def test_shift_context_moves_only_cells_of_its_own(smollm2_path):
    """Engine.shift_context drops [n_keep, n_keep + n_discard) and moves the rest down; it
    refuses (changing nothing) where a moved cell is shared with another sequence."""
    import llama
    from llama.api.engine import Engine

    model = llama.Model.load(str(smollm2_path))
    engine = Engine(llama.Context(model, n_ctx=256, n_seq_max=2))
    tokens = model.tokenize("One two three four five six seven eight nine ten", add_special=True)
    engine.prefill(0, tokens)
    engine.ctx.memory.seq_cp(0, 1, 0, len(tokens))   # sequence 1 shares every cell
    assert not engine.shift_context(0, 2, 3)
    assert engine.cached[0] == tokens and engine.ctx.memory.seq_pos_max(0) == len(tokens) - 1
    engine.ctx.memory.seq_rm(1, -1, -1)
    assert engine.shift_context(0, 2, 3)
    assert engine.cached[0] == tokens[:2] + tokens[5:]
    assert engine.ctx.memory.seq_pos_max(0) == len(tokens) - 4


def test_reuse_chunks_moves_cached_runs_as_llama_server(smol_model):
    """Engine.reuse_chunks (llama-server's n_cache_reuse): the cache of A+M+B asked for A+B
    keeps A, drops M and moves B's run (all but the last token) into place; the next logits
    equal those of llama-server's own calls (seq_rm, seq_add) made by hand on a second
    context. As in llama-server, a run must continue the prompt where the cache stopped
    matching (A+X+B moves nothing); a run shorter than the minimum, or shared with another
    sequence, stays out."""
    tok = lambda text: smol_model.tokenize(text, add_special=False)  # noqa: E731
    a = tok("Bridges in Europe began with the Romans.")
    m = tok(" Pasta needs flour, eggs and salt.")
    x = tok(" Also")
    b = tok(" Medieval builders added pointed arches, and iron came later in the end")
    full, short = a + m + b, a + x + b
    engine = Engine(llama.Context(smol_model, n_ctx=256, n_seq_max=2))
    engine.prefill(0, full)
    n_past = engine.reusable_prefix(0, short)
    assert n_past == len(a)
    assert engine.reuse_chunks(0, short, n_past, min_chunk=len(b)) == n_past   # too short a run
    n = engine.reuse_chunks(0, short, n_past, min_chunk=4)
    assert n == len(a)   # X breaks the match at the prompt's next position: nothing moves
    # the prompt continues exactly where the cache moves on: A + B
    engine.prefill(0, full)
    short = a + b
    n = engine.reuse_chunks(0, short, len(a), min_chunk=4)
    assert n == len(short) - 1 and engine.cached[0][:n] == short[:n]
    engine.forget(0, n)
    got = engine.prefill(0, short)     # decodes the last token only
    assert engine.n_past(0) == len(short)

    by_hand = llama.Context(smol_model, n_ctx=256, n_seq_max=2)
    assert by_hand.decode(llama.Batch.from_tokens(full)) == 0
    mem, p_c = by_hand.memory, len(a) + len(m)
    mem.seq_rm(0, len(a), p_c)
    mem.seq_add(0, p_c, p_c + len(b) - 1, len(a) - p_c)
    mem.seq_rm(0, len(short) - 1, -1)
    assert by_hand.decode(llama.Batch.from_tokens(short[-1:], pos0=len(short) - 1)) == 0
    np.testing.assert_array_equal(got, by_hand.get_logits_ith(-1))

    # a run whose cells sequence 1 shares is not moved (it would move for both)
    engine.reset()
    engine.prefill(0, full)
    engine.ctx.memory.seq_cp(0, 1, 0, len(full))
    assert engine.reuse_chunks(0, short, len(a), min_chunk=4) == len(a)
