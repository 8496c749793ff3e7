"""A quantised KV cache (llama.cpp's -ctk/-ctv) against llama.cpp itself: the tiny llama files
of tests/tools/kv_quant_vectors.py decoded with each cache type llama.cpp allows, its
logits for every position of a prompt and its greedy continuation (llama-cpp-python 0.3.36,
flash attention on, as a quantised V needs) stored in data/llama_cpp_kv_quant.json. Heads of
32 have no Hadamard rotation, heads of 64 have llama.cpp's (llama/kv_types.py). Every
available backend must give close log-probabilities (mean |Δ log-softmax| ≤ 0.01) and the
same greedy tokens; the CPU backend, which rounds q to 8 bits against a quantised K as ggml
does, is held to 0.002."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import llama
from ggmlpy.sched.registry import available_backends
from tests.tools.kv_quant_vectors import FILES, N_GREEDY, VARIANTS, write_file

DATA = json.loads((Path(__file__).parent / "data" / "llama_cpp_kv_quant.json").read_text())
MAX_MEAN_LOGSOFTMAX_DIFF = 0.01
MAX_MEAN_LOGSOFTMAX_DIFF_CPU = 0.002   # measured: 0 to 0.001 (Q5_1, Q8_1's f16 sum term)
# The reference backend on an MLA cache: llama.cpp's flash attention rounds the queries to 8
# bits against the quantised K, numpy does not, and MLA's absorbed queries (in the compressed
# space, one K row for all heads) carry it into every head (q4_0: 0.0145; q8_0: 0.003)
MAX_MEAN_LOGSOFTMAX_DIFF_REF_MLA = 0.02


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kv_quant")
    out = {}
    for name in FILES:
        path = write_file(name, folder)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == DATA["files"][name], (
            f"{name}: the tiny file changed; rerun tests/tools/kv_quant_vectors.py for llama.cpp's answers")
        out[name] = llama.Model.load(str(path))
    return out


def test_the_data_covers_every_variant():
    assert sorted(DATA["variants"]) == sorted(VARIANTS)


@pytest.mark.parametrize("backend", available_backends())
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_logits_and_greedy_tokens_match_llama_cpp(models, name, backend):
    ref = DATA["variants"][name]
    prompt = ref["prompt"]
    ctx = llama.Context(models[ref["file"]], n_ctx=64, n_threads=2, backend=backend,
                        type_k=ref["type_k"], type_v=ref["type_v"])
    assert ctx.decode(llama.Batch.from_tokens(prompt, logits_all=True)) == 0
    ours = np.array([ctx.get_logits_ith(i) for i in range(len(prompt))], dtype=np.float64)
    diff = np.abs(log_softmax(ours) - log_softmax(np.array(ref["logits"], dtype=np.float64)))
    bar = (MAX_MEAN_LOGSOFTMAX_DIFF_CPU if backend == "cpu" else
           MAX_MEAN_LOGSOFTMAX_DIFF_REF_MLA if ref["file"] == "mla" else MAX_MEAN_LOGSOFTMAX_DIFF)
    assert diff.mean() <= bar, f"mean |Δ log-softmax| {diff.mean():.4f} (per position {diff.mean(axis=1)})"
    greedy, logits = [], ours[-1]
    for _ in range(N_GREEDY):
        greedy.append(int(np.argmax(logits)))
        assert ctx.decode(llama.Batch.from_tokens([greedy[-1]])) == 0
        logits = np.array(ctx.get_logits_ith(-1))
    assert greedy == ref["greedy"]


def test_the_cpu_runs_every_node_natively(models):
    """Nothing of a quantised cache's graphs falls back to the reference backend: the cache
    stores, the attention over it (rotated, for heads of 64) and its K-shift are CPU kernels."""
    ctx = llama.Context(models["h64"], n_ctx=64, backend="cpu", type_k="q4_0", type_v="iq4_nl")
    assert ctx.kv_layout.rot_k == 64 and ctx.kv_layout.rot_v == 64
    assert ctx.decode(llama.Batch.from_tokens(list(range(5, 17)))) == 0
    ctx.memory.seq_rm(0, 1, 4)
    ctx.memory.seq_add(0, 4, -1, -3)
    assert ctx.decode(llama.Batch.from_tokens([30], pos0=9)) == 0
    assert not ctx.fallbacks.told and not ctx.fallbacks.pending
