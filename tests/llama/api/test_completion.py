"""create_completion against the runtime it is built on (llama.generate, a fresh Context),
numpy's log_softmax, and its own streaming."""
import numpy as np
import pytest

from llama import Batch, Context
from llama.api.logprobs import log_softmax, sampled_logprob
from llama.generate import generate
from llama.sampling import make_sampler

PROMPT = "The capital of France is"


def _text(out: dict) -> str:
    return out["choices"][0]["text"]


def _stream_text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["text"] for c in chunks)


def test_greedy_completion_is_llama_generate(smol):
    ctx = Context(smol.model, n_ctx=512, n_threads=2)
    ref = generate(ctx, PROMPT, max_tokens=24, sampler=make_sampler(n_vocab=smol.n_vocab(), temp=0))
    out = smol(PROMPT, max_tokens=24, temperature=0)
    assert _text(out) == ref.text
    assert out["usage"] == {"prompt_tokens": len(ref.prompt_tokens), "completion_tokens": len(ref.tokens),
                            "total_tokens": len(ref.prompt_tokens) + len(ref.tokens)}
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")


@pytest.mark.parametrize("kwargs", [dict(temperature=0), dict(temperature=0.9, seed=7),
                                    dict(temperature=0, stop=[" of", "\n\n"])])
def test_stream_and_non_stream_agree(smol, kwargs):
    whole = smol(PROMPT, max_tokens=40, **kwargs)
    chunks = list(smol(PROMPT, max_tokens=40, stream=True, **kwargs))
    assert _stream_text(chunks) == _text(whole)
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_stream_usage_when_asked(smol):
    """stream_options.include_usage (OpenAI's): every chunk has "usage": null, then one last
    chunk without choices carries the usage of the non-streamed answer."""
    whole = smol(PROMPT, max_tokens=12, temperature=0)
    chunks = list(smol(PROMPT, max_tokens=12, temperature=0, stream=True,
                       stream_options={"include_usage": True}))
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert chunks[-1]["object"] == "text_completion"
    assert _stream_text(chunks[:-1]) == _text(whole)
    assert all("usage" not in c for c in smol(PROMPT, max_tokens=4, temperature=0, stream=True))


def test_stop_strings_never_leak(smol):
    full = _text(smol(PROMPT, max_tokens=40, temperature=0))
    words = full.split(" ")
    stop = " " + words[3][:2]  # a stop that starts inside the text, spanning tokens or not
    cut = full[:full.index(stop)]
    out = smol(PROMPT, max_tokens=40, temperature=0, stop=[stop, "zzzz"])
    assert _text(out) == cut and out["choices"][0]["finish_reason"] == "stop"
    shown = ""
    for chunk in smol(PROMPT, max_tokens=40, temperature=0, stop=stop, stream=True):
        shown += chunk["choices"][0]["text"]
        assert stop not in shown and cut.startswith(shown)
    assert shown == cut


def test_logprobs_are_log_softmax_of_the_logits(smol):
    out = smol(PROMPT, max_tokens=6, temperature=0, logprobs=4)
    lp = out["choices"][0]["logprobs"]
    ids = smol.tokenize(PROMPT.encode(), add_bos=True, special=True)
    gen = [smol.tokenize(t.encode(), add_bos=False) for t in lp["tokens"]]
    assert all(len(g) == 1 for g in gen)
    gen = [g[0] for g in gen]
    ctx = Context(smol.model, n_ctx=512, n_threads=2)
    all_ids = ids + gen
    assert ctx.decode(Batch.from_tokens(all_ids, logits_all=True)) == 0
    rows = ctx.get_logits()[len(ids) - 1:len(all_ids) - 1]
    for i, (tok, row) in enumerate(zip(gen, rows)):
        ref = log_softmax(row)
        assert lp["token_logprobs"][i] == pytest.approx(ref[tok], abs=2e-3)
        best = np.argsort(-ref)[:4]
        assert set(lp["top_logprobs"][i]) >= {smol.detokenize([b]).decode() for b in best[:3]}
        assert max(lp["top_logprobs"][i].values()) == pytest.approx(ref.max(), abs=2e-3)
    assert lp["text_offset"][0] == len(PROMPT)


def test_stream_logprobs_cover_every_token(smol):
    whole = smol(PROMPT, max_tokens=8, temperature=0, logprobs=2)["choices"][0]["logprobs"]
    streamed = [c["choices"][0]["logprobs"] for c in smol(PROMPT, max_tokens=8, temperature=0,
                                                          logprobs=2, stream=True)]
    tokens = [t for lp in streamed if lp for t in lp["tokens"]]
    values = [v for lp in streamed if lp for v in lp["token_logprobs"]]
    assert tokens == whole["tokens"]
    assert values == pytest.approx(whole["token_logprobs"], abs=1e-6)


def test_echo_with_logprobs_scores_the_prompt(smol):
    out = smol(PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1)
    text = _text(out)
    assert text.startswith(PROMPT)
    lp = out["choices"][0]["logprobs"]
    n_prompt = out["usage"]["prompt_tokens"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["tokens"]) == n_prompt + out["usage"]["completion_tokens"]
    assert all(v <= 0 for v in lp["token_logprobs"][1:])


def test_seeds_reproduce(smol):
    a = [_text(smol("Once upon a time", max_tokens=12, temperature=1.0, seed=s)) for s in (1, 2, 3)]
    b = [_text(smol("Once upon a time", max_tokens=12, temperature=1.0, seed=s)) for s in (1, 2, 3)]
    assert a == b
    assert len(set(a)) > 1


def test_logit_bias_bans_the_greedy_token(smol):
    first = smol(PROMPT, max_tokens=1, temperature=0, logprobs=2)["choices"][0]["logprobs"]
    greedy = smol.tokenize(first["tokens"][0].encode(), add_bos=False)[0]
    out = smol(PROMPT, max_tokens=1, temperature=0, logit_bias={greedy: -float("inf")})
    second = sorted(first["top_logprobs"][0].items(), key=lambda kv: -kv[1])[1][0]
    assert _text(out) == second


def test_logits_processor_and_stopping_criteria(smol):
    forced = smol.tokenize(b" banana", add_bos=False)[0]

    def only_banana(input_ids, scores):
        out = np.full_like(scores, -np.inf)
        out[forced] = 0.0
        return out

    seen = []

    def stop_after_three(input_ids, logits):
        seen.append(list(input_ids))
        return len(seen) >= 3

    out = smol(PROMPT, max_tokens=10, temperature=0.7, seed=1, logits_processor=[only_banana],
               stopping_criteria=[stop_after_three])
    assert _text(out) == " banana" * 2 and out["choices"][0]["finish_reason"] == "stop"
    # llama-cpp-python's generate: each call sees the ids before the token just picked (the
    # prompt alone first); the token picked when a criterion says stop is dropped
    prompt = smol.tokenize(PROMPT.encode(), special=True)
    assert seen == [prompt, prompt + [forced], prompt + [forced] * 2]
    assert out["usage"]["completion_tokens"] == 2


def test_stopping_criterion_on_the_last_token_keeps_it(smol):
    """A criterion that looks for a token stops the step after it is generated, with that
    token in the text (llama-cpp-python: `ids[-1] == period` gives ' Paris.')."""
    greedy = smol(PROMPT, max_tokens=6, temperature=0)
    ids = smol.tokenize(PROMPT.encode(), special=True)
    first = smol.tokenize(_text(greedy).encode(), add_bos=False)[0]
    out = smol(PROMPT, max_tokens=6, temperature=0,
               stopping_criteria=[lambda input_ids, logits: len(input_ids) > len(ids) and input_ids[-1] == first])
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == 1
    assert _text(out) == smol.detokenize([first]).decode()


def test_context_limits(smol):
    with pytest.raises(ValueError, match="exceed context window of 1024"):
        smol(list(range(100, 1124)), max_tokens=4)
    near = list(range(100, 1120))  # 4 cells left: the completion stops at the context's end
    out = smol(near, max_tokens=50, temperature=0)
    assert out["usage"]["completion_tokens"] == 4 and out["choices"][0]["finish_reason"] == "length"


def test_a_newer_call_invalidates_an_open_stream(smol):
    first = smol(PROMPT, max_tokens=20, temperature=0, stream=True)
    next(first)
    assert _text(smol("Hello", max_tokens=2, temperature=0))
    with pytest.raises(RuntimeError, match="another call"):
        list(first)


@pytest.mark.parametrize("mode", [1, 2])
def test_mirostat_completion_is_the_mirostat_chain(smol, mode):
    """mirostat_mode: the API's sequence samples with make_sampler's mirostat chain (temp,
    then mirostat; llama.sampling.mirostat holds llama.cpp's picks); a target surprise near
    0 keeps only the most probable token, so the text is the greedy one."""
    ctx = Context(smol.model, n_ctx=512, n_threads=2)
    chain = make_sampler(n_vocab=smol.n_vocab(), temp=0.9, mirostat=mode, mirostat_tau=4.0,
                         mirostat_eta=0.2, seed=1234)
    ref = generate(ctx, PROMPT, max_tokens=16, sampler=chain)
    out = smol(PROMPT, max_tokens=16, temperature=0.9, mirostat_mode=mode, mirostat_tau=4.0,
               mirostat_eta=0.2, seed=1234)
    assert _text(out) == ref.text
    greedy = _text(smol(PROMPT, max_tokens=16, temperature=0))
    assert _text(out) != greedy
    assert _text(smol(PROMPT, max_tokens=16, mirostat_mode=mode, mirostat_tau=0.01, seed=5)) == greedy


def test_llama_server_sampling_fields_reach_the_chain(smol):
    """repeat_last_n (-1: the context the sequence may fill), min_keep and dynatemp_*, the
    llama-server fields prepare_completion takes beyond llama-cpp-python's arguments."""
    from llama.api.completion import prepare_completion
    from llama.sampling import MinP, Penalties, TemperatureExt, TopP

    job = prepare_completion(smol, PROMPT, max_tokens=4, repeat_last_n=-1, repeat_penalty=1.1,
                             min_keep=5, dynatemp_range=0.3, dynatemp_exponent=1.5, n_ctx=300)
    by_type = {type(s): s for s in job.seq.sampler.samplers}
    assert by_type[Penalties].last_n == 300
    assert by_type[TopP].min_keep == by_type[MinP].min_keep == 5
    assert (by_type[TemperatureExt].delta, by_type[TemperatureExt].exponent) == (0.3, 1.5)
    with pytest.raises(ValueError, match="repeat_last_n"):
        prepare_completion(smol, PROMPT, max_tokens=4, repeat_last_n=-2)


def test_bad_arguments_are_named(smol):
    with pytest.raises(ValueError, match="token"):
        smol([10**7], max_tokens=1)
    with pytest.raises(ValueError, match="top_p"):
        smol(PROMPT, max_tokens=1, top_p=2.0)
    with pytest.raises(ValueError, match="mirostat_mode"):
        smol(PROMPT, max_tokens=1, mirostat_mode=3)


def test_sampled_logprob_reads_the_chains_final_candidates():
    piece = lambda t: b"t%d" % t  # noqa: E731
    probs, ids = np.array([0.5, 0.3, 0.2], np.float32), np.array([7, 3, 9], np.int32)
    e = sampled_logprob(probs, ids, 1, 2, piece)
    assert (e.token, e.piece) == (3, b"t3") and e.logprob == pytest.approx(np.log(0.3))
    assert [(t, lp) for t, _, lp in e.top] == [(7, pytest.approx(np.log(0.5))), (3, pytest.approx(np.log(0.3)))]
    greedy = sampled_logprob(np.zeros(3, np.float32), ids, 2, 5, piece)   # no probabilities computed
    assert greedy.token == 9 and greedy.logprob == 0.0 and [t for t, _, _ in greedy.top] == [9]
