"""Comparisons against tests/golden (llama.cpp's outputs) with the bars of its README.

Backend-agnostic: the CPU and CUDA backends and other models reuse these checks.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import llama
from llama.perplexity import perplexity

MARGIN = 0.5  # golden top1 - top2 logit margin above which the top-1 must match
MEAN_BAR = 0.15
MAX_BAR = 1.0
PPL_REL = 0.01


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    mx = x.max(axis=-1, keepdims=True)
    return x - mx - np.log(np.exp(x - mx).sum(axis=-1, keepdims=True))


def check_logits(model: llama.Model, golden: Path, backend: str) -> dict:
    g = np.load(golden / "logits.npz")
    tokens = [int(t) for t in g["tokens"]]
    ctx = llama.Context(model, n_ctx=max(256, len(tokens)), n_batch=512, n_ubatch=512, backend=backend)
    assert ctx.decode(llama.Batch.from_tokens(tokens, logits_all=True)) == 0
    ls = log_softmax(ctx.get_logits())
    top_ids, top_logits = g["top_ids"], g["top_logits"].astype(np.float64)
    golden_ls = top_logits - g["logsumexp"][:, None]
    diff = np.abs(np.take_along_axis(ls, top_ids, axis=1) - golden_ls)
    margins = top_logits[:, 0] - top_logits[:, 1]
    confident = margins >= MARGIN
    top1_ok = ls.argmax(axis=1) == top_ids[:, 0]
    return {"mean": float(diff.mean()), "max": float(diff.max()),
            "top1_mismatch_confident": int((~top1_ok & confident).sum()),
            "last_max_abs": float(np.abs(ctx.get_logits()[-1] - g["last_logits"]).max())}


def check_greedy(model: llama.Model, golden: Path, backend: str) -> list[dict]:
    cases = json.loads((golden / "greedy.json").read_text())
    results = []
    for case in cases:
        ids = model.tokenize(case["prompt"], add_special=True, parse_special=True)
        assert ids == case["prompt_ids"], case["prompt"]
        ctx = llama.Context(model, n_ctx=256, backend=backend)
        assert ctx.decode(llama.Batch.from_tokens(ids)) == 0
        out = []
        for _ in range(len(case["ids"])):
            tok = int(np.argmax(ctx.get_logits_ith(-1)))
            out.append(tok)
            assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
        low = [i for i, m in enumerate(case["margins"]) if m < MARGIN]
        must_match = low[0] if low else len(out)  # ids up to (excluding) the first low-margin step
        results.append({"prompt": case["prompt"], "must_match": must_match,
                        "ours": out[:must_match], "golden": case["ids"][:must_match]})
    return results


def check_perplexity(model: llama.Model, golden: Path, backend: str) -> tuple[float, float]:
    spec = json.loads((golden / "ppl.json").read_text())
    text = (golden / spec["text_file"]).read_text()
    n_ctx = spec["n_ctx"]
    ctx = llama.Context(model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, backend=backend)
    result = perplexity(ctx, text, n_ctx=n_ctx, n_chunks=spec["chunks"])
    return result.ppl, spec["ppl"]
