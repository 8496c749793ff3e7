"""Launches per decode token of the real models with every layer on the device, on the
dry-run driver (nothing runs; the plans are what a GPU would launch): fusion must not add
any. Measured before the CUDA patterns became fusion rules: 151
(SmolLM2-135M, 5 per layer and the output product) and 254 (Gemma 3 270M). The same
figure as `python bench/bench_cuda.py --model M --dry` reports (launches_per_token)."""
from __future__ import annotations

import pytest

import llama
import llama.model
import llama.placement as placement
from ggmlpy.codegen_cuda.backend import CudaBackend
from ggmlpy.codegen_cuda.driver import DryRunDriver
from ggmlpy.options import Options

LAUNCHES_BEFORE = {"smollm2": 151, "gemma3": 254}


@pytest.fixture
def dry_devices(monkeypatch):
    driver = DryRunDriver(compile=False)

    def make(name: str, options: Options | None = None) -> CudaBackend:
        be = CudaBackend(driver=driver, options=options)
        be.buffer_type = name
        return be

    monkeypatch.setattr(placement, "make_device_backend", make)
    monkeypatch.setattr(llama.model, "make_device_backend", make)


def decode_launches(path) -> int:
    model = llama.Model.load(path, devices=["cuda:0"], n_gpu_layers=99)
    ctx = llama.Context(model, n_ctx=64, n_batch=8, n_ubatch=8, backend="ref")
    assert ctx.decode(llama.Batch.from_tokens([1, 2, 3])) == 0
    for t in (4, 5):
        assert ctx.decode(llama.Batch.from_tokens([t])) == 0
    (split,) = [s for c in ctx.graph_cache.entries.values() for s in c.compiled if getattr(s, "single", False)]
    return max(len(p.launches) for p in split._plans.values())


@pytest.mark.parametrize("model", sorted(LAUNCHES_BEFORE))
def test_decode_launches_per_token_do_not_rise(dry_devices, request, model):
    n = decode_launches(request.getfixturevalue(f"{model}_path"))
    print(f"{model}: {n} launches per decode token")
    assert n <= LAUNCHES_BEFORE[model]
