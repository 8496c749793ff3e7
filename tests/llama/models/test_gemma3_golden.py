"""Gemma 3 270M Q4_K_M against llama.cpp's outputs (tests/golden/gemma3-270m-q4_k_m), on the
reference and the CPU backend, with the bars of the golden README.

The reference backend turns every weight into float32 once per context (the 262,144 x 640
embedding alone is 670 MB), so the module shares one context (n_ctx 256, the perplexity
protocol's chunk) and clears its memory between uses. The logits and the greedy decoding
from the golden prompt ids need no tokenizer; tokenization, the greedy prompts' ids and
perplexity need the SPM tokenizer.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import llama
from llama.perplexity import perplexity
from tests.llama.models import golden

BACKENDS = ["ref", "cpu"]
N_CTX = 256


@pytest.fixture(scope="module")
def model(gemma3_path):
    m = llama.Model.load(gemma3_path)
    yield m
    m.close()


@pytest.fixture(scope="module", params=BACKENDS)
def ctx(model, request):
    c = llama.Context(model, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, backend=request.param)
    yield c
    del c


@pytest.fixture(scope="module")
def gdir(golden_dir):
    return golden_dir / "gemma3-270m-q4_k_m"


def greedy_ids(ctx: llama.Context, prompt_ids: list[int], n: int) -> list[int]:
    """n tokens picked by argmax of the raw logits, as greedy.json was made."""
    ctx.memory.clear()
    assert ctx.decode(llama.Batch.from_tokens(prompt_ids)) == 0
    out = []
    for _ in range(n):
        out.append(int(np.argmax(ctx.get_logits_ith(-1))))
        assert ctx.decode(llama.Batch.from_tokens([out[-1]])) == 0
    return out


def test_hparams_and_cache_layout(model, ctx):
    hp = model.hparams
    assert (hp.n_layer, hp.n_embd, hp.n_head[0], hp.n_head_kv[0], hp.n_embd_head_k) == (18, 640, 4, 1, 256)
    assert hp.n_vocab == 262144 and hp.n_swa == 512 and hp.rope_type == 2
    assert [il for il in range(18) if not hp.is_swa(il)] == [5, 11, 17]
    assert (hp.rope_freq_base, hp.rope_freq_base_swa) == (1e6, 1e4)
    assert hp.f_attention_scale == 1 / 16
    assert model.w.output is None  # tied to token_embd
    # 512-token window + one ubatch > n_ctx: the SWA half is as large as the main one here
    assert (ctx.memory.base.size, ctx.memory.swa.size) == (N_CTX, N_CTX)
    assert sorted(ctx.memory.base.k) == [5, 11, 17]


def test_logits_within_golden_bars(ctx, gdir):
    g = np.load(gdir / "logits.npz")
    ctx.memory.clear()
    assert ctx.decode(llama.Batch.from_tokens([int(t) for t in g["tokens"]], logits_all=True)) == 0
    ls = golden.log_softmax(ctx.get_logits())
    top_ids, top_logits = g["top_ids"], g["top_logits"].astype(np.float64)
    diff = np.abs(np.take_along_axis(ls, top_ids, axis=1) - (top_logits - g["logsumexp"][:, None]))
    confident = top_logits[:, 0] - top_logits[:, 1] >= golden.MARGIN
    assert not (confident & (ls.argmax(axis=1) != top_ids[:, 0])).any()
    assert diff.mean() <= golden.MEAN_BAR, (diff.mean(), diff.max())
    assert diff.max() <= golden.MAX_BAR, (diff.mean(), diff.max())
    # the full last row too: same argmax, and close in absolute terms
    last = ctx.get_logits()[-1]
    assert int(np.argmax(last)) == int(np.argmax(g["last_logits"]))
    assert np.abs(last - g["last_logits"]).max() < 2.0


def test_greedy_from_golden_prompt_ids(ctx, gdir):
    for case in json.loads((gdir / "greedy.json").read_text()):
        ours = greedy_ids(ctx, case["prompt_ids"], len(case["ids"]))
        low = [i for i, m in enumerate(case["margins"]) if m < golden.MARGIN]
        must = low[0] if low else len(ours)
        assert ours[:must] == case["ids"][:must], case["prompt"]


# -- these need the SPM tokenizer ---------------------------------------------------------------

def test_tokenize_every_golden_case(model, gdir):
    data = json.loads((gdir / "tokenize.json").read_text())
    for case in data["cases"]:
        ids = model.tokenize(case["text"], add_special=case["add_special"],
                             parse_special=case["parse_special"])
        assert ids == case["ids"], case["text"]
    for tok, hexed in data["pieces_hex"].items():
        assert model.token_to_piece(int(tok), special=True) == bytes.fromhex(hexed), tok


def test_greedy_prompts_tokenize_to_golden_ids(model, gdir):
    for case in json.loads((gdir / "greedy.json").read_text()):
        assert model.tokenize(case["prompt"], add_special=True, parse_special=True) == case["prompt_ids"]


# Perplexity of ppl_text.txt computed exactly in float32 by an independent implementation:
# Hugging Face transformers 5.24 + torch 2.13 (CPU), loading the same GGUF (dequantised,
# query_pre_attn_scalar=256, eager attention), same chunks and scored positions.
EXACT_F32_PPL = 9.83857


@pytest.fixture(scope="module")
def ppl(ctx, gdir) -> tuple[float, float]:
    """(ours, llama.cpp's) perplexity, computed once for both tests."""
    spec = json.loads((gdir / "ppl.json").read_text())
    assert spec["n_ctx"] == N_CTX
    text = (gdir / spec["text_file"]).read_text()
    result = perplexity(ctx, text, n_ctx=N_CTX, n_chunks=spec["chunks"])
    assert len(result.ppl_per_chunk) == spec["chunks"]
    return result.ppl, spec["ppl"]


def test_perplexity_against_exact_float32(ppl, ctx):
    """The reference backend is exact float32: it equals transformers. The CPU backend
    quantises activations as llama.cpp does, which must bring it closer to llama.cpp."""
    ours, ref = ppl
    if ctx.backend_name == "ref":
        assert abs(ours - EXACT_F32_PPL) / EXACT_F32_PPL <= 1e-3, ours
    else:
        assert abs(ours - ref) < abs(EXACT_F32_PPL - ref), (ours, ref)


def test_perplexity_within_one_percent(ppl, ctx, request):
    if ctx.backend_name == "ref":
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "exact float32 (this backend, and transformers) gives 9.838 against llama.cpp's "
            "9.970: 1.32% off. llama.cpp quantises activations (q8_K/q8_0) before quantised "
            "dot products; emulating that alone gives 9.901 (0.69%). Gemma 3 270M is that "
            "sensitive to llama.cpp's numeric shortcuts; SmolLM2 is within 0.2%.")))
    ours, ref = ppl
    assert abs(ours - ref) / ref <= golden.PPL_REL, (ours, ref)
