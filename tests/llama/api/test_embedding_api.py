"""embed / create_embedding against numpy pooling of a plain Context's hidden states."""
import numpy as np
import pytest

from llama import Batch, Context, Llama

TEXTS = ["The capital of France is Paris.", "Cats sleep a lot", "naïve café ☕"]


@pytest.fixture(scope="module")
def hidden(smol):
    """Per-token hidden states of each text alone, from an embeddings context with no pooling."""
    ctx = Context(smol.model, n_ctx=256, n_threads=2, embeddings=True, pooling_type="none")
    rows = []
    for text in TEXTS:
        ctx.memory.clear()
        ids = smol.tokenize(text.encode(), add_bos=True, special=False)
        assert ctx.decode(Batch.from_tokens(ids)) == 0
        rows.append(np.array(ctx.get_embeddings()))
    return rows


@pytest.mark.parametrize("pooling,pick", [("mean", lambda r: r.mean(0)), ("cls", lambda r: r[0]),
                                          ("last", lambda r: r[-1])])
def test_pooled_embeddings_are_numpy_pooling(smollm2_path, hidden, pooling, pick):
    llm = Llama(str(smollm2_path), n_ctx=256, embedding=True, pooling_type=pooling, verbose=False)
    vectors = llm.embed(TEXTS)  # three sequences in one decode
    for vec, rows in zip(vectors, hidden):
        np.testing.assert_allclose(vec, pick(rows), rtol=1e-4, atol=1e-4)
    unit = llm.embed(TEXTS[0], normalize=True)
    assert np.linalg.norm(unit) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(unit, pick(hidden[0]) / np.linalg.norm(pick(hidden[0])), atol=1e-4)
    out = llm.create_embedding(TEXTS[:2])
    assert out["object"] == "list" and [d["index"] for d in out["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 576 for d in out["data"])
    n_tokens = sum(len(llm.tokenize(t.encode())) for t in TEXTS[:2])
    assert out["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    with pytest.raises(RuntimeError, match="no logits"):
        llm("Hello", max_tokens=1)


def test_no_pooling_gives_a_vector_per_token(smollm2_path, hidden):
    llm = Llama(str(smollm2_path), n_ctx=256, embedding=True, pooling_type="none", verbose=False)
    per_token = llm.embed(TEXTS[1])
    np.testing.assert_allclose(np.array(per_token), hidden[1], rtol=1e-4, atol=1e-4)
    vec, n = llm.embed([TEXTS[0]], return_count=True)
    assert n == len(hidden[0]) and np.array(vec[0]).shape == hidden[0].shape


def test_embeddings_need_the_flag(smol):
    with pytest.raises(RuntimeError, match="embedding=True"):
        smol.embed("hello")
