"""The backend contract (sched/backend.py), the device registry and per-split pass pipelines.

- two CPU backends (a partial offload to "cpu:1"): both CPU splits run the CPU fusion
  passes, and the logits are the single-CPU run's;
- a device backend that overrides no hook (a subclass of the reference backend registered
  under a test pattern) runs with the defaults, and the host CPU's split still gets the CPU
  passes although that device comes first;
- an unknown device, or a pipeline naming an unknown pass, is an error naming it.
"""
from __future__ import annotations

import numpy as np
import pytest

import llama
from ggmlpy.cli.bench_run import device_stats
from ggmlpy.options import Options
from ggmlpy.passes.pipeline import PIPELINES, context_passes
from ggmlpy.sched.backend import REFERENCE_PIPELINE, Backend
from ggmlpy.sched.placement import PlacementError, parse_devices
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.sched.registry import create_device, register_device, unregister_device
from ggmlpy.testing.models import write_tiny_llama

FUSED_OPS = {"rms_norm_mul", "mul_mat_glu"}
PROMPT = [1, 50, 258, 28, 64, 31, 253, 7]  # within the tiny model's vocabulary too


def _logits(model: llama.Model) -> tuple[np.ndarray, llama.Context]:
    """The prompt's logits (every position), then a one-token step's."""
    ctx = llama.Context(model, n_ctx=256, n_batch=16, n_ubatch=16, n_threads=1)
    assert ctx.decode(llama.Batch.from_tokens(PROMPT, logits_all=True)) == 0
    rows = [ctx.get_logits().copy()]
    assert ctx.decode(llama.Batch.from_tokens([42])) == 0
    rows.append(ctx.get_logits().copy())
    return np.concatenate(rows), ctx


def _split_ops(ctx: llama.Context) -> list[tuple[str, set[str]]]:
    """Per compiled split of every graph: its backend and the ops it runs (after the
    backend's own fusion, for the CPU)."""
    out = []
    for cg in ctx.graph_cache.entries.values():
        for split, compiled in zip(cg.splits, cg.compiled):
            out.append((split.backend.name, {n.op for n in compiled.nodes}))
    return out


def test_two_cpu_backends_both_run_the_cpu_fusion_passes(smollm2_path):
    base, _ = _logits(llama.Model.load(smollm2_path))
    got, ctx = _logits(llama.Model.load(smollm2_path, devices=["cpu:1"], n_gpu_layers=16))
    assert [b.name for b in ctx.backends] == ["cpu:1", "cpu", "ref"]
    assert ctx.passes == PIPELINES["cpu"]
    splits = _split_ops(ctx)
    assert {name for name, _ in splits} == {"cpu", "cpu:1"}
    for name, ops in splits:
        assert FUSED_OPS <= ops, name
    np.testing.assert_array_equal(got, base)
    ctx.model.close()


class MinimalDevice(RefBackend):
    """A device that overrides no hook: the reference backend's ops, Backend's defaults."""

    name = "mini"
    is_host = False


@pytest.fixture
def mini_device():
    pattern = r"mini:\d+"

    def make(name: str, options: Options) -> Backend:
        be = MinimalDevice()
        be.name = name
        return be

    register_device(pattern, make, "mini:N")
    yield
    unregister_device(pattern)


def test_a_backend_with_only_the_defaults_runs(mini_device, tmp_path):
    be = create_device("mini:1")
    assert be.name == "mini:1" and be.buffer_type == "mini:1"
    assert be.pipeline() == REFERENCE_PIPELINE and not be.offload_op(None)  # type: ignore[arg-type]
    assert be.free_memory() is None and be.cache_stats() == {} and be.run_stats() == {}
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=3)
    base, _ = _logits(llama.Model.load(path))
    got, ctx = _logits(llama.Model.load(path, devices=["mini:1"], n_gpu_layers=2))
    assert [b.name for b in ctx.backends] == ["mini:1", "cpu", "ref"]
    assert ctx.model.placement.layers == ("cpu", "cpu", "mini:1")
    # the first backend asks for the reference passes only; the host CPU's split still runs
    # the CPU's (before, the first backend's name chose one pipeline for every split)
    assert ctx.passes == PIPELINES["cpu"]
    splits = _split_ops(ctx)
    assert {name for name, _ in splits} == {"cpu", "mini:1"}
    for name, ops in splits:
        assert ("rms_norm_mul" in ops) == (name == "cpu"), name  # (tiny's weights: no mul_mat_glu)
    assert np.abs(got - base).max() <= 1e-3  # numpy on the device's layers, LLVM on the host's
    report = ctx.compile_report()
    assert "cpu_object_cache_hits" in report and not any(k.startswith("mini") for k in report)
    assert device_stats(ctx) == {}


def test_a_context_of_default_backends_runs_the_reference_passes(mini_device):
    assert context_passes([create_device("mini:1"), RefBackend()]) == REFERENCE_PIPELINE


@pytest.mark.parametrize("name", ["tpu:0", "mini:1", "cuda-0"])
def test_an_unknown_device_is_an_error_naming_it(name):
    with pytest.raises(PlacementError, match=f"unknown device '{name}'"):
        parse_devices([name])
    with pytest.raises(PlacementError, match=f"unknown device '{name}'"):
        create_device(name)


def test_model_load_names_the_unknown_device(tmp_path):
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=2)
    with pytest.raises(PlacementError, match="unknown device 'tpu:0'.*cpu:N.*cuda:N"):
        llama.Model.load(path, devices=["tpu:0"], n_gpu_layers=99)


def test_a_pipeline_with_an_unknown_pass_is_an_error_naming_it():
    class Odd(RefBackend):
        name = "odd"

        def pipeline(self) -> tuple[str, ...]:
            return ("dce", "unroll")

    with pytest.raises(ValueError, match=r"backend 'odd' asks for unknown passes \['unroll'\]"):
        context_passes([Odd()])


def test_default_devices_are_the_discovered_gpus():
    from ggmlpy.codegen_cuda import cuda_available
    from ggmlpy.sched.registry import default_devices

    assert default_devices() == (["cuda:0"] if cuda_available()[0] else [])
