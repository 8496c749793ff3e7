"""Speculative decoding through `Llama(draft_model=...)`: the same tokens as without a draft
(greedy, seeded sampling, a grammar), fewer decodes where the draft holds, a cache that holds
exactly the kept tokens after rejections, and the draft model's guesses equal to its own
greedy decoding."""
import numpy as np
import pytest

from llama import Llama
from llama.speculative import LlamaPromptLookupDecoding
from llama.speculative.draft_model import DraftModel
from ggmlpy.testing.models_archs import write_tiny_model

LIST = ("Copy the list: red, orange, yellow, green, blue, indigo, violet, black, white, grey.\n"
        "Copy: red, orange, yellow,")


class Recording:
    """A llama-cpp-python draft model that records each call and what it proposed."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, input_ids, /, **kwargs):
        out = self.inner(input_ids)
        self.calls.append((len(input_ids), list(out)))
        return out


@pytest.fixture(scope="module")
def plain(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=512, verbose=False)


def _text(llm, prompt=LIST, **kw):
    out = llm(prompt, max_tokens=kw.pop("max_tokens", 40), **kw)
    return out["choices"][0]["text"]


def test_prompt_lookup_gives_the_same_tokens_in_fewer_decodes(plain, smollm2_path):
    drafter = Recording(LlamaPromptLookupDecoding(num_pred_tokens=8))
    llm = Llama(str(smollm2_path), n_ctx=512, verbose=False, draft_model=drafter)
    want = _text(plain, temperature=0)
    assert _text(llm, temperature=0) == want
    n_tokens = len(llm.tokenize(want.encode(), add_bos=False))
    # one draft call per decode after the first token: far fewer than the tokens generated
    assert sum(len(d) for _, d in drafter.calls) > 0 and len(drafter.calls) < n_tokens * 0.6
    for seed in (3, 4):
        assert _text(llm, temperature=0.9, seed=seed) == _text(plain, temperature=0.9, seed=seed)
    grammar = 'root ::= ("red" | "blue" | ", " | " ")+'
    from llama.grammar import LlamaGrammar
    g = LlamaGrammar.from_string(grammar)
    assert _text(llm, temperature=0, grammar=g, max_tokens=20) == _text(plain, temperature=0, grammar=g, max_tokens=20)


def test_rejected_drafts_leave_the_cache_as_without_them(plain, smollm2_path):
    wrong = Recording(lambda ids: np.array([0, 0, 0, 0], np.intc))   # never what SmolLM2 picks
    llm = Llama(str(smollm2_path), n_ctx=512, verbose=False, draft_model=wrong)
    out = llm(LIST, max_tokens=12, temperature=0)
    assert out["choices"][0]["text"] == _text(plain, temperature=0, max_tokens=12)
    # 11 decodes after the first token; before the last, one token remains: no room for a draft
    assert len(wrong.calls) == 10 and all(d == [0, 0, 0, 0] for _, d in wrong.calls)
    prompt = llm.tokenize(LIST.encode())
    generated = llm.tokenize(out["choices"][0]["text"].encode(), add_bos=False)
    cached = llm.engine.cached[0]
    assert cached[:len(prompt)] == prompt and len(cached) == len(prompt) + 11   # the last token is not decoded
    assert llm.ctx.memory.seq_pos_max(0) == len(cached) - 1
    assert generated[:3] == cached[len(prompt):len(prompt) + 3]


def test_a_perfect_draft_stops_at_the_context_end(smollm2_path):
    """A draft of the right 40 tokens each time: whole runs accepted, truncated to the room
    left in the context near its end (the cache never holds more than n_ctx)."""
    plain = Llama(str(smollm2_path), n_ctx=256, verbose=False)
    prompt = plain.tokenize(b"Once upon a time")
    truth = prompt + list(plain.generate(prompt, temp=0.0, top_k=1))[:256 - len(prompt)]

    def oracle(ids):
        return np.array(truth[len(ids):len(ids) + 40], np.intc)

    drafter = Recording(oracle)
    llm = Llama(str(smollm2_path), n_ctx=256, verbose=False, draft_model=drafter)
    out = llm(prompt, max_tokens=0, temperature=0)
    generated = llm.tokenize(out["choices"][0]["text"].encode(), add_bos=False)
    assert out["usage"]["completion_tokens"] == 256 - len(prompt) and out["choices"][0]["finish_reason"] == "length"
    assert generated[:100] == truth[len(prompt):len(prompt) + 100]
    assert len(drafter.calls) <= 8 and llm.engine.n_past(0) <= 256


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spec")
    target = write_tiny_model("llama", folder / "target.gguf", n_layer=2, seed=7)
    draft = write_tiny_model("llama", folder / "draft.gguf", n_layer=1, seed=7)
    return target, draft


def test_the_draft_model_guesses_its_own_greedy_tokens(tiny_pair):
    target_path, draft_path = tiny_pair
    target = Llama(str(target_path), n_ctx=256, verbose=False)
    alone = Llama(str(draft_path), n_ctx=256, verbose=False)
    drafter = DraftModel.load(str(draft_path), target.model, n_ctx=256, n_seq_max=1, n_threads=2, n_max=5)
    history = target.tokenize(b"hello world")
    for extra in ([], [17, 30], [17, 30, 41, 8]):   # a longer history reuses the draft's cache
        h = history + extra
        want = [int(t) for t in _greedy(alone, h, 5)]
        assert drafter.draft(0, h, 5) == want
        assert drafter.draft(0, h, 2) == want[:2]
    assert DraftModel(drafter.ctx, n_max=5, n_min=6).draft(0, history, 5) == []


def _greedy(llm, history, n):
    out = []
    for tok in llm.generate(history, temp=0.0, top_k=1):
        out.append(tok)
        if len(out) == n:
            return out
    return out


def test_a_draft_model_gives_the_target_tokens(tiny_pair):
    target_path, draft_path = tiny_pair
    plain = Llama(str(target_path), n_ctx=256, verbose=False)
    target = Llama(str(target_path), n_ctx=256, verbose=False)
    drafter = DraftModel.load(str(draft_path), target.model, n_ctx=256, n_seq_max=1, n_threads=2, n_max=4)
    spec = Llama(str(target_path), n_ctx=256, verbose=False, draft_model=drafter)
    for prompt in ("hello world", "the cat sat"):
        a = plain(prompt, max_tokens=30, temperature=0)["choices"][0]["text"]
        assert spec(prompt, max_tokens=30, temperature=0)["choices"][0]["text"] == a


def test_a_mismatched_draft_model_is_refused(tiny_pair, tmp_path):
    target_path, _ = tiny_pair
    other = write_tiny_model("llama", tmp_path / "other.gguf", n_layer=1, n_vocab=600)
    target = Llama(str(target_path), n_ctx=128, verbose=False)
    with pytest.raises(ValueError, match="600 tokens, the target's 320"):
        DraftModel.load(str(other), target.model, n_ctx=128, n_seq_max=1, n_threads=2)


def test_a_hybrid_model_replays_the_kept_tokens(tmp_path):
    """Qwen3.5's recurrent states cannot drop rejected guesses: the state goes back to its
    copy from before the draft and the kept tokens are decoded again; the tokens and the
    final state are those of a run without drafts."""
    path = write_tiny_model("qwen35", tmp_path / "hybrid.gguf", n_layer=4)
    plain = Llama(str(path), n_ctx=256, verbose=False)
    truth = list(plain.generate(plain.tokenize(b"hello world"), temp=0.0, top_k=1))
    prompt = plain.tokenize(b"hello world")
    half_right = Recording(lambda ids: np.array(truth[len(ids) - len(prompt):][:2] + [0, 0], np.intc))
    spec = Llama(str(path), n_ctx=256, verbose=False, draft_model=half_right)
    for llm in (plain, spec):
        llm.reset()
    a = plain(prompt, max_tokens=24, temperature=0)
    b = spec(prompt, max_tokens=24, temperature=0)
    assert b["choices"][0]["text"] == a["choices"][0]["text"]
    assert 0 < len(half_right.calls) < 20     # two of each four guesses hold
    assert spec.engine.cached[0] == plain.engine.cached[0]
    state_a, state_b = plain.ctx.memory.seq_state(0), spec.ctx.memory.seq_state(0)
    assert state_a.pos == state_b.pos and state_a.rows.keys() == state_b.rows.keys()
    for name, rows in state_a.rows.items():   # the same states, up to the batch's rounding
        np.testing.assert_allclose(state_b.rows[name], rows, rtol=1e-4, atol=1e-5)
