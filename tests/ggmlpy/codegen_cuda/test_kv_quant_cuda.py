"""A quantised KV cache (-ctk/-ctv) on the CUDA backend, whole graphs (host emulator and GPU):
the tiny llama files of tests/tools/kv_quant_vectors.py with every layer on the device give
llama.cpp's logits (data/llama_cpp_kv_quant.json) as the CPU backend does, and a K-shift (its
decode and re-quantisation run on the host) moves the device's keys as it moves the host's."""
from __future__ import annotations

import numpy as np
import pytest

import llama
import llama.model
import llama.placement as placement
from ggmlpy.codegen_cuda.backend import CudaBackend
from ggmlpy.options import Options
from tests.llama.models.test_kv_quant_llama_cpp import DATA, log_softmax
from tests.tools.kv_quant_vectors import write_file


@pytest.fixture
def on_device(device, monkeypatch):
    """Models loaded with devices=["cuda:0"] get the session's device (emulator or GPU)."""
    kind, driver = device

    def make(name: str, options: Options | None = None) -> CudaBackend:
        # products of up to 16 columns (the prompts here) on the f32 matrix-vector kernel: the
        # tiled one rounds operands to half, and a 4-bit cache turns that into flipped levels
        # (h32-q4_1: 0.018 with it, 0.0001 without); the attention kernel is what is checked
        be = CudaBackend(driver=driver, options=options, matvec_max_cols=16)
        be.buffer_type = name
        return be

    monkeypatch.setattr(placement, "make_device_backend", make)
    monkeypatch.setattr(llama.model, "make_device_backend", make)
    return kind


@pytest.mark.parametrize("name", ["h32-q8_0", "h32-q4_1", "h32-iq4_nl", "h64-q4_0", "h32-f16-q4_0", "h32-q8_0-f16"])
def test_device_cache_matches_llama_cpp(on_device, tmp_path, name):
    ref = DATA["variants"][name]
    path = str(write_file(ref["file"], tmp_path))
    prompt = ref["prompt"]
    model = llama.Model.load(path, devices=["cuda:0"], n_gpu_layers=99)
    ctx = llama.Context(model, n_ctx=64, backend="cpu", type_k=ref["type_k"], type_v=ref["type_v"])
    assert ctx.decode(llama.Batch.from_tokens(prompt, logits_all=True)) == 0
    ours = np.array([ctx.get_logits_ith(i) for i in range(len(prompt))], dtype=np.float64)
    splits = {s.backend.name for c in ctx.graph_cache.entries.values() for s in c.splits}
    assert "cuda" in splits
    diff = np.abs(log_softmax(ours) - log_softmax(np.array(ref["logits"], dtype=np.float64)))
    assert diff.mean() <= 0.002, f"{on_device}: mean |Δ log-softmax| {diff.mean():.4f}"


def test_k_shift_of_a_device_cache(on_device, tmp_path):
    path = str(write_file("h64", tmp_path))
    out = []
    for devices in (["cuda:0"], None):
        kw = dict(devices=devices, n_gpu_layers=99) if devices else {}
        ctx = llama.Context(llama.Model.load(path, **kw), n_ctx=64, backend="cpu", type_k="q8_0", type_v="q8_0")
        assert ctx.decode(llama.Batch.from_tokens(list(range(5, 19)))) == 0
        ctx.memory.seq_rm(0, 2, 5)
        ctx.memory.seq_add(0, 5, -1, -3)
        assert ctx.decode(llama.Batch.from_tokens([40], pos0=11)) == 0
        out.append(np.array(ctx.get_logits_ith(-1), dtype=np.float64))
    assert np.abs(log_softmax(out[0]) - log_softmax(out[1])).mean() < 1e-4
