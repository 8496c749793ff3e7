"""The memory of hybrid models (KV cache beside recurrent states) against llama.cpp: the
sequence operations' return values and positions recorded by tests/tools/recurrent_vectors.py
on the tiny qwen35 file, the logits after them; state save/load, the all-or-nothing rule of
a failed ubatch and prompt reuse through the Llama API."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import llama
from ggmlpy.testing.models_archs import write_tiny_model
from llama.hparams import HParams
from llama.recurrent import RecurrentMemory
from tests.tools.recurrent_vectors import N_SEQ, OPS, PROMPTS

DATA = json.loads((Path(__file__).parent / "data" / "llama_cpp_recurrent.json").read_text())


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    path = write_tiny_model("qwen35", tmp_path_factory.mktemp("hybrid") / "qwen35-f32.gguf")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == DATA["sha256"], "rerun tests/tools/recurrent_vectors.py"
    return llama.Model.load(str(path))


def test_sequence_operations_match_llama_cpp(qwen35):
    ctx = llama.Context(qwen35, n_ctx=64, n_seq_max=N_SEQ, n_threads=2)
    for seq, tokens in PROMPTS.items():
        batch = llama.Batch(tokens=tokens, pos=list(range(len(tokens))), seq_ids=[[seq]] * len(tokens))
        assert ctx.decode(batch) == 0
    mem = ctx.memory
    for (op, args), want in zip(OPS, DATA["steps"]):
        ret = getattr(mem, op)(*args)
        if op == "seq_rm":
            assert ret is want["ret"], f"{op}{args}"
        pos = [[mem.seq_pos_min(s), mem.seq_pos_max(s)] for s in range(N_SEQ)]
        assert pos == want["pos"], f"after {op}{args}"
    # sequence 2 is a copy of sequence 0, whose first three KV cells were removed above
    assert mem.seq_pos_max(2) + 1 == DATA["next_pos"]
    assert ctx.decode(llama.Batch(tokens=[DATA["next_token"]], pos=[DATA["next_pos"]], seq_ids=[[2]])) == 0
    ours, ref = np.array(ctx.get_logits_ith(-1), np.float64), np.array(DATA["logits"], np.float64)
    assert np.abs(_log_softmax(ours) - _log_softmax(ref)).mean() <= 0.01
    assert int(np.argmax(ours)) == int(np.argmax(ref))


def test_positions_cannot_move_with_multi_section_rope(qwen35):
    """llama.cpp aborts on seq_add/seq_div here; ggmlpy refuses by name and changes nothing."""
    ctx = llama.Context(qwen35, n_ctx=64, n_threads=2)
    assert ctx.decode(llama.Batch.from_tokens([5, 6, 7])) == 0
    assert not ctx.memory.can_shift
    for op, args in (("seq_add", (0, 0, -1, 2)), ("seq_div", (0, 0, -1, 2))):
        with pytest.raises(ValueError, match="multi-section RoPE"):
            getattr(ctx.memory, op)(*args)
    assert ctx.memory.seq_pos_max(0) == 2


def _continue(ctx, tokens: list[int], pos0: int) -> list[np.ndarray]:
    out = []
    for i, tok in enumerate(tokens):
        assert ctx.decode(llama.Batch(tokens=[tok], pos=[pos0 + i], seq_ids=[[0]])) == 0
        out.append(np.array(ctx.get_logits_ith(-1)))
    return out


def test_failed_ubatch_leaves_the_states_as_they_were(qwen35, monkeypatch):
    """The graph writes the new states before the failure is known; they go to spare rows,
    so the next decode starts from the states before the failed one."""
    prompt, more = [5, 17, 200, 33], [41, 9, 8]
    fresh = llama.Context(qwen35, n_ctx=64, n_threads=2)
    assert fresh.decode(llama.Batch.from_tokens(prompt)) == 0
    want = _continue(fresh, more, len(prompt))

    ctx = llama.Context(qwen35, n_ctx=64, n_threads=2)
    assert ctx.decode(llama.Batch.from_tokens(prompt)) == 0
    real = ctx._process_ubatch

    def computes_then_fails(ub, slot):
        real(ub, slot)
        raise RuntimeError("simulated failure after the compute")

    monkeypatch.setattr(ctx, "_process_ubatch", computes_then_fails)
    assert ctx.decode(llama.Batch(tokens=[100, 101], pos=[4, 5], seq_ids=[[0], [0]])) < -1
    monkeypatch.undo()
    assert ctx.memory.seq_pos_max(0) == len(prompt) - 1
    got = _continue(ctx, more, len(prompt))
    for a, b in zip(got, want):
        assert np.abs(a - b).max() <= 1e-5


def test_state_save_and_load_resume_exactly(tmp_path):
    path = write_tiny_model("qwen35", tmp_path / "q.gguf")
    llm = llama.Llama(str(path), n_ctx=64, n_threads=2, verbose=False)
    llm.eval([5, 17, 200, 33, 41])
    state = llm.save_state()
    first = [int(np.argmax(llm.scores[llm.n_tokens - 1]))]
    for _ in range(4):
        llm.eval([first[-1]])
        first.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
    llm.load_state(state)
    again = [int(np.argmax(llm.scores[llm.n_tokens - 1]))]
    for _ in range(4):
        llm.eval([again[-1]])
        again.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
    assert again == first


def test_a_prompt_that_rewinds_the_state_is_decoded_again(tmp_path):
    """A recurrent state cannot drop its last tokens: a second prompt that shares only part
    of the first is decoded from the start (as llama-cpp-python does) and gives what a fresh
    context gives."""
    path = str(write_tiny_model("qwen35", tmp_path / "q.gguf"))
    llm = llama.Llama(path, n_ctx=64, n_threads=2, verbose=False)
    fresh = llama.Llama(path, n_ctx=64, n_threads=2, verbose=False)
    a, b = [5, 17, 200, 33, 41, 9], [5, 17, 200, 7, 8]
    llm.create_completion(a, max_tokens=3, temperature=0.0)
    out = llm.create_completion(b, max_tokens=5, temperature=0.0)["choices"][0]["text"]
    assert out == fresh.create_completion(b, max_tokens=5, temperature=0.0)["choices"][0]["text"]
    assert llm.engine.cached[0][:len(b)] == b


def _recurrent(n_seq: int = 2) -> RecurrentMemory:
    hp = HParams(arch="test", n_ctx_train=64, n_embd=8, n_layer=1, n_ff=[8], n_head=[1], n_head_kv=[1],
                 n_embd_head_k=8, n_embd_head_v=8, n_rot=8, n_vocab=10, ssm_d_conv=4, ssm_d_inner=8,
                 ssm_d_state=4, ssm_dt_rank=2, ssm_n_group=1, recurrent_layers=[True])
    return RecurrentMemory(hp, n_seq)


def test_recurrent_positions_move_only_inside_the_range():
    """llama_memory_recurrent's seq_add and seq_div: only the last position, and only when
    it lies in [p0, p1)."""
    mem = _recurrent()
    mem.pos = [7, 3]
    mem.seq_add(0, 0, 5, 10)
    assert mem.pos == [7, 3]
    mem.seq_add(0, 5, -1, 10)
    assert mem.pos == [17, 3]
    mem.seq_div(1, 0, -1, 2)
    assert mem.pos == [17, 1]
    assert mem.seq_rm(0, 0, -1) and mem.pos == [-1, 1]
    assert not mem.seq_rm(5, 0, -1)   # a sequence id past n_seq_max


def test_seq_cp_gives_the_destination_its_own_copy():
    mem = _recurrent()
    mem.pos = [4, -1]
    mem.s[0][mem.row[0]] = 1.5
    mem.seq_cp(0, 1)
    assert mem.pos == [4, 4]
    assert mem.row[1] in (1, 3) and (mem.s[0][mem.row[1]] == 1.5).all()
    mem.s[0][mem.row[0]] = 2.0   # changing the source leaves the copy alone
    assert (mem.s[0][mem.row[1]] == 1.5).all()


def test_a_follow_up_prompt_resumes_from_a_context_checkpoint(tmp_path):
    """The Llama API keeps llama-server's checkpoint 4 tokens before a prompt's end: a
    follow-up that shares the prompt but not the reply decodes only what follows it."""
    path = str(write_tiny_model("qwen35", tmp_path / "q.gguf"))
    llm = llama.Llama(path, n_ctx=128, n_threads=2, verbose=False)
    fresh = llama.Llama(path, n_ctx=128, n_threads=2, verbose=False)
    first = [(7 * i + 3) % 300 + 10 for i in range(30)]
    follow = first + [200, 201, 202]
    llm.create_completion(first, max_tokens=4, temperature=0.0)
    assert [c.n_tokens for c in llm.engine.checkpoints.by_seq[0]] == [len(first) - 4]
    before = llm.engine.n_prompt_decoded
    out = llm.create_completion(follow, max_tokens=4, temperature=0.0)["choices"][0]["text"]
    assert llm.engine.n_prompt_decoded - before == len(follow) - (len(first) - 4)
    assert out == fresh.create_completion(follow, max_tokens=4, temperature=0.0)["choices"][0]["text"]
