"""SmolLM2-135M Q4_1 against llama.cpp's outputs (../shared/golden/smollm2-135m-q4_1), on the
reference backend, with the bars of the golden README."""
from __future__ import annotations

import json

import pytest

import llama
from tests.models import golden

BACKEND = "ref"


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


def test_logits_within_golden_bars(model, gdir):
    r = golden.check_logits(model, gdir, BACKEND)
    assert r["top1_mismatch_confident"] == 0
    assert r["mean"] <= golden.MEAN_BAR, r
    assert r["max"] <= golden.MAX_BAR, r


def test_greedy_matches_golden(model, gdir):
    for r in golden.check_greedy(model, gdir, BACKEND):
        assert r["ours"] == r["golden"], r["prompt"]


def test_perplexity_within_one_percent(model, gdir):
    ours, ref = golden.check_perplexity(model, gdir, BACKEND)
    assert abs(ours - ref) / ref <= golden.PPL_REL, (ours, ref)
