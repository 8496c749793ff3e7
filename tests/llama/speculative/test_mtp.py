"""Gemma 4's assistant as a drafter (llama.cpp's draft-mtp): the target's hidden states as a
second output, the assistant's drafts against llama.cpp's on the same tiny files, and the
refusals."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from ggmlpy.testing.models_archs import write_tiny_model
from ggmlpy.testing.models_gemma4 import write_tiny_gemma4_assistant
from llama import Batch, Context, Llama, Model
from llama.speculative.mtp import MtpDraft, MtpDrafter

DATA = Path(__file__).parent / "data" / "mtp_gemma4_tiny.json"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtp")
    target = write_tiny_model("gemma4", folder / "target.gguf")
    return target, write_tiny_gemma4_assistant(folder / "assistant.gguf", target)


def test_the_hidden_states_are_what_the_logits_come_from(pair):
    """set_embeddings_nextn: each output row's final normed hidden state, the input of the
    output projection (untied here) and of the soft-cap, so logits = cap * tanh(W h / cap)."""
    target, _ = pair
    model = Model.load(str(target))
    ctx = Context(model, n_ctx=256, n_threads=2)
    ctx.set_embeddings_nextn(True)
    tokens = model.tokenize("hello world, hello")
    assert ctx.decode(Batch(tokens=tokens, pos=list(range(len(tokens))), seq_ids=[[0]] * len(tokens),
                            logits=[True] * len(tokens))) == 0
    hidden, logits = ctx.get_embeddings_nextn(), ctx.get_logits()
    assert hidden.shape == (len(tokens), model.hparams.n_embd)
    w = model.gguf.tensors["output.weight"].data.view(np.float32).reshape(model.hparams.n_vocab, -1)
    cap = model.hparams.f_final_logit_softcapping
    np.testing.assert_allclose(cap * np.tanh(hidden @ w.T / cap), logits, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("case", range(3))
def test_the_drafts_are_llama_cpps(case, tmp_path):
    """llama.cpp's drafts on these files (tests/tools/mtp_vectors.py, greedy, n_max 3): after
    the same pending token at the same position, the same tokens drafted at every step,
    the assistant's first logits as llama.cpp's, and the same tokens out."""
    want = json.loads(DATA.read_text())
    target = write_tiny_model("gemma4", tmp_path / "target.gguf", **want["target"]["settings"])
    assistant = write_tiny_gemma4_assistant(tmp_path / "assistant.gguf", target, **want["assistant"]["settings"])
    for path, key in ((target, "target"), (assistant, "assistant")):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == want[key]["sha256"], f"the {key} writer changed"
    expected = want["cases"][case]
    llm = Llama(str(target), n_ctx=256, verbose=False, draft_model=MtpDraft(str(assistant), n_max=want["n_max"]))
    seen, draft, step = [], llm.drafter.draft, llm.drafter.step
    first_logits = []

    def recording(seq_id, history, n_max):
        out = draft(seq_id, history, n_max)
        seen.append({"pending": int(history[-1]), "pos": len(history) - 1, "drafted": out})
        return out

    def first_steps(seq_id, token, h, pos):
        logits, h_next = step(seq_id, token, h, pos)
        if len(seen) == 0:
            first_logits.append(logits)
        return logits, h_next
    llm.drafter.draft, llm.drafter.step = recording, first_steps
    out = llm.create_completion(expected["prompt"], max_tokens=want["n_predict"], temperature=0)
    got = llm.engine.cached[0][len(expected["prompt"]):]
    assert got == expected["tokens"][:len(got)] and out["usage"]["completion_tokens"] == len(expected["tokens"])
    steps = [{k: s[k] for k in ("pending", "pos", "drafted")} for s in expected["steps"]]
    drafted = [s for s in seen if s["drafted"]]
    assert drafted == steps[:len(drafted)] and len(drafted) >= len(steps) - 1
    # the first draft's three steps: within the tolerance of every logits test against llama.cpp
    # (its f16 cache and rounding), mean |d log-softmax| <= 0.01
    ours, theirs = np.array(first_logits, np.float64), np.array(expected["first_draft_logits"], np.float64)
    assert ours.shape == theirs.shape == (want["n_max"], 320)
    assert np.abs(_log_softmax(ours) - _log_softmax(theirs)).mean() <= 0.01


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_mismatched_pairs_are_refused(pair, tmp_path):
    target, assistant = pair
    with pytest.raises(ValueError, match="gemma4-assistant is a drafter"):
        Llama(str(assistant), n_ctx=128, verbose=False)
    llama_file = write_tiny_model("llama", tmp_path / "llama.gguf", n_layer=1)
    other = Llama(str(llama_file), n_ctx=128, verbose=False)
    with pytest.raises(ValueError, match="drafts for gemma4 models, not llama"):
        MtpDrafter(other.engine, Model.load(str(assistant)))
    wide = write_tiny_model("gemma4", tmp_path / "wide.gguf", n_embd=96)
    with pytest.raises(ValueError, match="made for a target 64 wide; this gemma4 is 96"):
        MtpDrafter(Llama(str(wide), n_ctx=128, verbose=False).engine, Model.load(str(assistant)))
    with pytest.raises(ValueError, match="needs a gemma4-assistant model, got gemma4"):
        MtpDrafter(Llama(str(target), n_ctx=128, verbose=False).engine, Model.load(str(target)))


def test_the_server_drafts_as_llama_server(tmp_path):
    """`ggmlpy serve -m target -md assistant` (draft-mtp, implied by the file) answers each
    of the oracle's requests with llama-server's tokens and its draft counts."""
    import httpx

    from tests.llama.server.conftest import running

    want = json.loads(DATA.read_text())
    target = write_tiny_model("gemma4", tmp_path / "target.gguf", **want["target"]["settings"])
    assistant = write_tiny_gemma4_assistant(tmp_path / "assistant.gguf", target, **want["assistant"]["settings"])
    with running(target, ctx_size=256, model_draft=str(assistant), spec_draft_n_max=want["n_max"]) as s:
        for case in want["cases"]:
            body = {**want["request"], "prompt": case["prompt"], "return_tokens": True}
            r = httpx.post(s.url + "/completion", json=body, timeout=120).json()
            assert r["tokens"] == case["tokens"]
            assert (r["timings"]["draft_n"], r["timings"]["draft_n_accepted"]) == (case["draft_n"],
                                                                                  case["draft_n_accepted"])
        assert httpx.get(s.url + "/slots").json()[0]["speculative"] is True
