"""Completion logprobs line up with the text they describe, as llama-cpp-python's do: each
`text_offset` is the length of the text before the token (so it indexes into the returned
text even when a token splits a character), streamed logprobs travel with the chunk their
token's text starts in, and an echoed prompt's leading BOS has no entry.

The oracle for offsets is llama-cpp-python's formula, `len(prompt) + len(detokenize(
tokens[:i]).decode("utf-8", errors="ignore"))`. The generated tokens are scripted by a logits
processor, so the texts are known whatever the model's numerics."""
import numpy as np
import pytest

PROMPT = "Say it:"
STAR = "a\N{GLOWING STAR}b"     # SmolLM2 splits the star's 4 bytes over 3 tokens


def scripted(llm, n_prompt: int, ids: list[int]):
    """A logits processor that makes the model say `ids`, then its EOS."""
    def force(input_ids, scores):
        k = len(input_ids) - n_prompt
        out = np.full_like(scores, -np.inf)
        out[ids[k] if k < len(ids) else llm.token_eos()] = 0.0
        return out
    return force


def oracle_offsets(llm, start: int, ids: list[int]) -> list[int]:
    return [start + len(llm.detokenize(ids[:i]).decode("utf-8", errors="ignore")) for i in range(len(ids))]


def test_offsets_index_into_text_across_a_split_character(smol):
    ids = smol.tokenize(STAR.encode(), add_bos=False)
    assert [len(smol.piece(t)) for t in ids] == [1, 2, 1, 1, 1]
    n_prompt = len(smol.tokenize(PROMPT.encode(), special=True))
    out = smol(PROMPT, max_tokens=len(ids), temperature=0, logprobs=1,
               logits_processor=[scripted(smol, n_prompt, ids)])
    text, lp = out["choices"][0]["text"], out["choices"][0]["logprobs"]
    assert text == STAR
    assert lp["text_offset"] == oracle_offsets(smol, len(PROMPT), ids) == [7, 8, 8, 8, 9]
    assert lp["tokens"] == ["a", "", "", "", "b"]      # llama-cpp-python: errors="ignore"
    full = PROMPT + text
    for offset, token in zip(lp["text_offset"], ids):
        if smol.piece(token).decode("utf-8", errors="ignore"):
            assert full[offset:].encode().startswith(smol.piece(token))

    chunks = list(smol(PROMPT, max_tokens=len(ids), temperature=0, logprobs=1, stream=True,
                       logits_processor=[scripted(smol, n_prompt, ids)]))
    streamed = [o for c in chunks if c["choices"][0]["logprobs"] for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert streamed == lp["text_offset"]


def test_streamed_logprobs_travel_with_the_text_their_token_starts(smol):
    """' Paris' '.' '\\n' with the stop string 's.\\n': ' Pari' is sent (the 's' may start
    the stop string), with ' Paris''s logprob; the stop string's own tokens have none."""
    ids = smol.tokenize(b" Paris.\n", add_bos=False)
    assert [smol.piece(t) for t in ids] == [b" Paris", b".", b"\n"]
    n_prompt = len(smol.tokenize(PROMPT.encode(), special=True))
    run = dict(max_tokens=8, temperature=0, logprobs=2, stop=["s.\n"])
    whole = smol(PROMPT, logits_processor=[scripted(smol, n_prompt, ids)], **run)["choices"][0]
    assert whole["text"] == " Pari" and whole["finish_reason"] == "stop"
    chunks = [c["choices"][0] for c in smol(PROMPT, stream=True, logits_processor=[scripted(smol, n_prompt, ids)], **run)]
    with_text = [c for c in chunks if c["text"]]
    assert "".join(c["text"] for c in chunks) == " Pari"
    assert with_text[0]["logprobs"]["tokens"] == [" Paris"]
    assert with_text[0]["logprobs"]["text_offset"] == [len(PROMPT)]
    later = [t for c in chunks[chunks.index(with_text[0]) + 1:] if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert later == []
    assert whole["logprobs"]["text_offset"][0] == len(PROMPT)


def test_echo_leaves_a_leading_bos_out(smol):
    """A prompt that starts with BOS: the echoed logprobs start at the first real token,
    which has None (llama-cpp-python drops the BOS; OpenAI gives the first token none)."""
    bos = smol.token_bos()
    words = smol.tokenize(b"The capital of France is", add_bos=False)
    out = smol([bos] + words, max_tokens=2, temperature=0, echo=True, logprobs=1)
    lp = out["choices"][0]["logprobs"]
    n_gen = out["usage"]["completion_tokens"]
    assert out["usage"]["prompt_tokens"] == len(words) + 1
    assert len(lp["tokens"]) == len(words) + n_gen
    assert lp["tokens"][:len(words)] == [smol.piece(t).decode() for t in words]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v is not None and v <= 0 for v in lp["token_logprobs"][1:])
    text = out["choices"][0]["text"]
    assert lp["text_offset"][:len(words)] == oracle_offsets(smol, 0, words)
    assert text.startswith(smol.detokenize(words).decode())
    without = smol(words, max_tokens=2, temperature=0, echo=True, logprobs=1)["choices"][0]["logprobs"]
    assert without["tokens"][:len(words)] == lp["tokens"][:len(words)]
    assert without["text_offset"][:len(words)] == lp["text_offset"][:len(words)]


@pytest.mark.parametrize("stream", [False, True])
def test_offsets_are_the_oracles_for_free_text(smol, stream):
    out = smol("Once upon a time", max_tokens=12, temperature=0, logprobs=0, stream=stream)
    if stream:
        chunks = [c["choices"][0] for c in out]
        offsets = [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]]
        tokens = [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]]
    else:
        offsets = out["choices"][0]["logprobs"]["text_offset"]
        tokens = out["choices"][0]["logprobs"]["tokens"]
    ids = [smol.tokenize(t.encode(), add_bos=False)[0] for t in tokens]
    assert offsets == oracle_offsets(smol, len("Once upon a time"), ids)
