"""Embeddings contexts (`Context(embeddings=True)`), as llama.cpp's: every token's final
normed hidden state (t_embd) and the pooled vector of every sequence.

1. the hidden states equal an independent numpy forward pass (tests/llama/models/oracles; its
   logits are solved back for the hidden states, so tied embeddings work too), and the CPU
   backend gives the reference backend's;
2. projecting them with the dequantised output weight gives a logits context's logits
   (tiny models, and SmolLM2 whose logits are checked against llama.cpp elsewhere);
3. mean / cls / last pooling equal numpy pooling of the token rows, each sequence of a
   batch over its own tokens only, a sequence split across ubatches over all of them;
4. the pooling type comes from `{arch}.pooling_type` unless the argument overrides it;
   bad names are a ValueError;
5. the embeddings graph is its own compiled graph, without the output projection.
"""
from __future__ import annotations

from contextlib import closing

import numpy as np
import pytest

import llama
from ggmlpy.testing.ops import normalized_error
from ggmlpy.quants import dequantize
from ggmlpy.sched.registry import available_backends
from ggmlpy.testing.models_archs import write_tiny_model
from llama.graph_inputs import GraphParams
from llama.pooling import PoolingType
from tests.llama.models import oracles

TOKENS = [5, 17, 200, 33, 41, 9, 8, 7, 100, 101]
PROMPTS = [[5, 17, 200, 33, 41], [300, 2, 9], [77, 78, 79, 80, 81, 82, 83]]
ARCHS = ["llama", "gemma3"]  # gemma3: tied output, sliding-window layers (iSWA cache)
MAX_NMSE_ORACLE = 1e-6
MAX_NMSE_BACKEND = 1e-4


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("embd")
    return {arch: write_tiny_model(arch, root / f"{arch}.gguf") for arch in ARCHS}


@pytest.fixture(scope="module")
def models(paths):
    loaded = {arch: llama.Model.load(p) for arch, p in paths.items()}
    yield loaded
    for m in loaded.values():
        m.close()


def make_ctx(model, backend="ref", **kw) -> llama.Context:
    kw.setdefault("n_ctx", 256)
    kw.setdefault("n_batch", 32)
    kw.setdefault("n_ubatch", 32)
    return llama.Context(model, backend=backend, **kw)


def hidden_states(model, tokens=TOKENS, backend="ref", **kw) -> np.ndarray:
    ctx = make_ctx(model, backend, embeddings=True, pooling_type="none", **kw)
    assert ctx.decode(llama.Batch.from_tokens(tokens)) == 0
    return ctx.get_embeddings().copy()


def output_weight(model) -> np.ndarray:
    """The output projection [n_vocab, n_embd] as float32 (the token embedding when tied)."""
    tensors = model.gguf.tensors
    info = tensors["output.weight"] if "output.weight" in tensors else tensors["token_embd.weight"]
    return dequantize(info.data, info.type, info.ne)


def logits_of(model, tokens, backend="ref", **kw) -> np.ndarray:
    ctx = make_ctx(model, backend, **kw)
    assert ctx.decode(llama.Batch.from_tokens(tokens, logits_all=True)) == 0
    return ctx.get_logits().copy()


# 1. hidden states ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_hidden_states_match_the_numpy_oracle(arch, paths, models):
    contents = oracles.read_gguf(paths[arch])
    w_out = contents.tensors.get("output.weight", contents.tensors["token_embd.weight"])
    logits = oracles.run(paths[arch], TOKENS)  # [n_tokens, n_vocab] = hidden @ w_out.T
    expected = np.linalg.lstsq(w_out, logits.T, rcond=None)[0].T  # n_vocab > n_embd: exact
    ours = hidden_states(models[arch])
    assert ours.shape == (len(TOKENS), models[arch].hparams.n_embd)
    assert normalized_error(ours, expected) <= MAX_NMSE_ORACLE


@pytest.mark.skipif("cpu" not in available_backends(), reason="no CPU backend (llvmlite)")
def test_cpu_backend_gives_the_reference_hidden_states(models):
    m = models["llama"]
    ref = hidden_states(m)
    ctx = make_ctx(m, "cpu", embeddings=True, pooling_type="mean")
    assert ctx.decode(llama.Batch.from_tokens(TOKENS[:6])) == 0   # the prompt graph
    assert ctx.decode(llama.Batch.from_tokens([TOKENS[6]])) == 0  # the one-token graph
    assert normalized_error(ctx.get_embeddings_ith(0), ref[6]) <= MAX_NMSE_BACKEND
    assert ctx.decode(llama.Batch.from_tokens(TOKENS[7:])) == 0
    assert normalized_error(ctx.get_embeddings(), ref[7:]) <= MAX_NMSE_BACKEND


def test_token_by_token_equals_the_whole_prompt(models):
    """The one-token embeddings graph (a different topology) gives the prompt graph's rows."""
    m = models["gemma3"]
    ref = hidden_states(m)
    ctx = make_ctx(m, embeddings=True)
    rows = []
    for tok in TOKENS:
        assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
        rows.append(ctx.get_embeddings_ith(-1).copy())
    np.testing.assert_allclose(np.stack(rows), ref, atol=1e-4, rtol=0)


# 2. tied to the logits -------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_projection_of_hidden_states_gives_the_logits(arch, models):
    m = models[arch]
    projected = hidden_states(m) @ output_weight(m).T
    np.testing.assert_allclose(projected, logits_of(m, TOKENS), atol=1e-4, rtol=1e-5)


def test_smollm2_projection_gives_the_logits(smollm2_path):
    """The real model: its tied (quantised) embedding, dequantised, maps our hidden states
    onto the logits that the golden tests compare with llama.cpp's."""
    with closing(llama.Model.load(smollm2_path)) as m:
        tokens = m.tokenize("The quick brown fox")
        hidden = hidden_states(m, tokens, n_batch=8, n_ubatch=8)
        logits = logits_of(m, tokens, n_batch=8, n_ubatch=8)
        assert np.abs(hidden @ output_weight(m).T - logits).max() <= 1e-3


# 3. pooling ------------------------------------------------------------------------------------
def several_sequences() -> tuple[llama.Batch, list[np.ndarray]]:
    """PROMPTS as sequences 0, 1, 2 of one batch (no output flags: embeddings make every
    token an output), and each prompt's batch positions."""
    tokens, pos, seqs, where, start = [], [], [], [], 0
    for s, p in enumerate(PROMPTS):
        tokens += p
        pos += list(range(len(p)))
        seqs += [s] * len(p)
        where.append(np.arange(start, start + len(p)))
        start += len(p)
    return llama.Batch(tokens=tokens, pos=pos, seq_ids=seqs), where


NUMPY_POOLING = {
    "mean": lambda rows: rows.mean(axis=0),
    "cls": lambda rows: rows[0],
    "last": lambda rows: rows[-1],
}


@pytest.mark.parametrize("kind", sorted(NUMPY_POOLING))
def test_pooling_several_sequences_in_one_batch(kind, models):
    m = models["llama"]
    batch, where = several_sequences()
    ctx = make_ctx(m, embeddings=True, pooling_type=kind, n_seq_max=3)
    assert ctx.decode(batch) == 0
    rows = ctx.get_embeddings()
    assert rows.shape == (batch.n_tokens, m.hparams.n_embd)
    for s, idx in enumerate(where):
        pooled = ctx.get_embeddings_seq(s)
        np.testing.assert_allclose(pooled, NUMPY_POOLING[kind](rows[idx]), atol=1e-6, rtol=0)
        # each sequence saw only its own tokens: the same as that prompt alone, but for
        # rounding (in one ubatch a softmax row spans every sequence's cells, masked, so
        # its sum runs in another order, and the f16 rounding of its weights may differ)
        alone = hidden_states(m, PROMPTS[s])
        np.testing.assert_allclose(pooled, NUMPY_POOLING[kind](alone), atol=1e-3, rtol=0)
    with pytest.raises(KeyError):
        ctx.get_embeddings_seq(3)


def test_mean_pooling_spans_ubatches(models):
    """A sequence longer than n_ubatch pools over every token of the batch."""
    m = models["gemma3"]
    ctx = make_ctx(m, embeddings=True, pooling_type="mean", n_batch=16, n_ubatch=4)
    assert ctx.decode(llama.Batch.from_tokens(TOKENS)) == 0
    rows = ctx.get_embeddings()
    np.testing.assert_allclose(rows, hidden_states(m), atol=1e-4, rtol=0)
    np.testing.assert_allclose(ctx.get_embeddings_seq(0), rows.mean(axis=0), atol=1e-6, rtol=0)


def test_every_token_is_an_output(models):
    ctx = make_ctx(models["llama"], embeddings=True, pooling_type="last")
    flags = [False] * (len(TOKENS) - 1) + [True]
    assert ctx.decode(llama.Batch(tokens=TOKENS, logits=flags)) == 0
    rows = ctx.get_embeddings()
    assert len(rows) == len(TOKENS)
    np.testing.assert_array_equal(ctx.get_embeddings_seq(0), rows[-1])
    np.testing.assert_array_equal(ctx.get_embeddings_ith(2), rows[2])


# 4. the pooling type ---------------------------------------------------------------------------
def test_pooling_type_from_the_file_and_overrides(tmp_path):
    path = write_tiny_model("llama", tmp_path / "cls.gguf", extra_keys={"pooling_type": 2})
    with closing(llama.Model.load(path)) as m:
        ctx = make_ctx(m, embeddings=True)
        assert ctx.pooling_type == PoolingType.CLS
        assert ctx.decode(llama.Batch.from_tokens(TOKENS[:4])) == 0
        np.testing.assert_array_equal(ctx.get_embeddings_seq(0), ctx.get_embeddings()[0])
        assert make_ctx(m, embeddings=True, pooling_type="mean").pooling_type == PoolingType.MEAN
        assert make_ctx(m, embeddings=True, pooling_type=3).pooling_type == PoolingType.LAST
        assert make_ctx(m, embeddings=True, pooling_type=-1).pooling_type == PoolingType.CLS


def test_files_without_the_key_pool_nothing(models):
    ctx = make_ctx(models["llama"], embeddings=True)
    assert ctx.pooling_type == PoolingType.NONE
    assert ctx.decode(llama.Batch.from_tokens(TOKENS[:3])) == 0
    with pytest.raises(RuntimeError, match="none"):
        ctx.get_embeddings_seq(0)


@pytest.mark.parametrize("bad", ["average", "", 7, -2, 1.0, True])
def test_bad_pooling_types_raise(bad, models):
    with pytest.raises(ValueError, match="pooling"):
        make_ctx(models["llama"], embeddings=True, pooling_type=bad)


def test_rank_pooling_without_a_head_is_the_last_token(models):
    """llama.cpp's rank pooling on a causal model without a classification head: the last
    token's state (the server's score is its first value); a file with a head ggmlpy does
    not apply is refused by name."""
    from llama.pooling import check_supported
    vectors = {}
    for kind in ("rank", "last"):
        ctx = make_ctx(models["llama"], embeddings=True, pooling_type=kind)
        assert ctx.decode(llama.Batch.from_tokens(TOKENS[:5])) == 0
        vectors[kind] = np.asarray(ctx.get_embeddings_seq(0))
    np.testing.assert_array_equal(vectors["rank"], vectors["last"])
    with pytest.raises(ValueError, match="cls.output.weight"):
        check_supported(PoolingType.RANK, ["token_embd.weight", "cls.output.weight"])


def test_logits_and_embeddings_getters_are_exclusive(models):
    m = models["llama"]
    embd = make_ctx(m, embeddings=True)
    assert embd.decode(llama.Batch.from_tokens(TOKENS[:3])) == 0
    with pytest.raises(RuntimeError, match="no logits"):
        embd.get_logits()
    with pytest.raises(IndexError):
        embd.get_embeddings_ith(3)
    plain = make_ctx(m)
    assert plain.decode(llama.Batch.from_tokens(TOKENS[:3])) == 0
    with pytest.raises(RuntimeError, match="embeddings=True"):
        plain.get_embeddings()


# 5. the graph ----------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens_class", ["multi", "single"])
def test_embeddings_graph_has_its_own_signature_and_no_output_projection(tokens_class, models):
    m = models["llama"]
    ctx = make_ctx(m, embeddings=True)
    logits_graph = ctx.build_graph(GraphParams(tokens_class, False, ctx.n_ctx))
    embd_graph = ctx.build_graph(GraphParams(tokens_class, False, ctx.n_ctx, embeddings=True))
    assert embd_graph.graph.signature() != logits_graph.graph.signature()
    assert embd_graph.output.name == "result_norm"
    assert embd_graph.output.ne[0] == m.hparams.n_embd
    assert "output.weight" not in {t.name for t in embd_graph.graph.leafs}
    assert "output.weight" in {t.name for t in logits_graph.graph.leafs}
    # the context reserved the embeddings graphs, not the logits ones
    assert all(p.embeddings for p in ctx._built)
    assert not any(p.embeddings for p in make_ctx(m)._built)
