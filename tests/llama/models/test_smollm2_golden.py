"""SmolLM2-135M Q4_1 against llama.cpp's outputs (tests/golden/smollm2-135m-q4_1), on the
reference and the CPU backend, with the bars of the golden README."""
from __future__ import annotations

import json

import pytest

import llama
from tests.llama.models import golden

BACKENDS = ["ref", "cpu"]


@pytest.fixture(scope="module")
def model(smollm2_path):
    return llama.Model.load(smollm2_path)


@pytest.fixture(scope="module")
def gdir(golden_dir):
    return golden_dir / "smollm2-135m-q4_1"


def test_tokenize_every_golden_case(model, gdir):
    data = json.loads((gdir / "tokenize.json").read_text())
    for case in data["cases"]:
        ids = model.tokenize(case["text"], add_special=case["add_special"], parse_special=case["parse_special"])
        assert ids == case["ids"], case["text"]
    for tok, hexed in data["pieces_hex"].items():
        assert model.token_to_piece(int(tok), special=True) == bytes.fromhex(hexed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_within_golden_bars(model, gdir, backend):
    r = golden.check_logits(model, gdir, backend)
    assert r["top1_mismatch_confident"] == 0
    assert r["mean"] <= golden.MEAN_BAR, r
    assert r["max"] <= golden.MAX_BAR, r


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_matches_golden(model, gdir, backend):
    for r in golden.check_greedy(model, gdir, backend):
        assert r["ours"] == r["golden"], r["prompt"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_perplexity_within_one_percent(model, gdir, backend):
    ours, ref = golden.check_perplexity(model, gdir, backend)
    assert abs(ours - ref) / ref <= golden.PPL_REL, (ours, ref)


def test_cpu_backend_runs_smollm2_without_fallbacks(model):
    ctx = llama.Context(model, n_ctx=256, backend="cpu")
    assert ctx.decode(llama.Batch.from_tokens(model.tokenize("Hello"))) == 0
    compiled = list(ctx.graph_cache.entries.values())
    assert len(compiled) == 2  # the prompt graph and the one-token graph
    for cg in compiled:
        assert cg.fallbacks == []
        assert {s.backend.name for s in cg.splits} == {"cpu"}
