"""`ggmlpy.cli.bench_run.run_bench` with an offload device: the JSON stays strict (no NaN where a
backend does not time its native code) and reports the device backend's graph statistics.
The CUDA backend runs on the dry-run driver (compiles nothing, launches nothing), so this
checks the bookkeeping of a CUDA generation without a GPU: one captured graph for every
cache length, replayed for every other token."""
from __future__ import annotations

import json

import pytest

import llama.model
import llama.placement as placement
from ggmlpy.cli.bench_run import run_bench
from ggmlpy.codegen_cuda.backend import CudaBackend
from ggmlpy.codegen_cuda.driver import DryRunDriver
from ggmlpy.options import Options
from ggmlpy.testing.models import write_tiny_llama


def test_bench_on_a_cuda_device_reports_one_graph_per_generation(tmp_path, monkeypatch):
    driver = DryRunDriver(compile=False)

    def make(name: str, options: Options | None = None) -> CudaBackend:
        be = CudaBackend(driver=driver, options=options)
        be.buffer_type = name
        return be

    monkeypatch.setattr(placement, "make_device_backend", make)
    monkeypatch.setattr(llama.model, "make_device_backend", make)
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=2)
    n_gen, reps = 40, 2  # 41 tokens per round: the cache view grows past 32 cells
    result = run_bench(str(path), n_prompt=8, n_gen=n_gen, reps=reps, start_times=False,
                       devices=["cuda:0"], n_gpu_layers=99, backend="ref")
    json.dumps(result, allow_nan=False)  # strict JSON
    assert result["devices"] == ["cuda:0"] and result["ngl"] == 99
    assert result["python_overhead_us_per_token"] is None  # CUDA does not time native code
    stats = result["cuda_stats"]
    decodes = (reps + 1) * (1 + n_gen)  # each round: one start token, then n_gen
    assert stats["graph_captures"] == 1
    assert stats["graph_replays"] == decodes - 1
    assert result["cuda_device"] == driver.device_name


def test_bench_cuda_dry_run_reports_the_cpu_host_and_the_launches(smollm2_path):
    """bench/bench_cuda.py without a GPU: the host part on the CPU backend (auto: what
    llama.Context uses, where llvmlite builds it), SmolLM2's 151 launches per decode token
    (5 per layer and the output product), one CUDA graph capture."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[3] / "bench" / "bench_cuda.py"
    done = subprocess.run([sys.executable, str(script), "--model", str(smollm2_path), "--dry",
                           "-p", "8", "-n", "8", "--reps", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["host_backend"] == "cpu" and "host_fallback" not in result
    tg = result["tg8"]
    assert tg["launches_per_token"] == 151 and tg["graph_captures"] == 1
    assert 0 < tg["per_token_ms"]["backend_host"] < tg["per_token_ms"]["host"]


def test_bench_reports_the_roofline_and_batched_decode(tmp_path):
    """The bytes a decode step reads are every tensor of the file but the embedding table
    (read a row at a time), counted by the gguf package; the roofline fraction is
    tg128 x bytes / bandwidth; batched decode reports every sequence count asked for."""
    import gguf

    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=2)
    result = run_bench(str(path), n_prompt=8, n_gen=8, reps=1, start_times=False, batched=(1, 3))
    json.dumps(result, allow_nan=False)
    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    expected = sum(n for name, n in tensors.items() if name != "token_embd.weight")
    assert result["weight_mb_per_token"] == round(expected / 1e6, 2)
    assert result["read_gb_s"] > 0.5
    runs = result["tg8_runs"]   # each run against the bandwidth measured around it
    assert len(runs) == 1 and runs[0]["tok_s"] == result["tg8_tok_s"]
    for run in runs:
        fraction = expected * run["tok_s"] / (run["read_gb_s"] * 1e9)
        assert run["roofline"] == pytest.approx(fraction, rel=0.01, abs=1e-3)
    assert result["tg8_roofline"] == runs[0]["roofline"] and result["read_gb_s"] == runs[0]["read_gb_s"]
    assert set(result["tg8_batched"]) == {"1", "3"} and all(v > 0 for v in result["tg8_batched"].values())
    assert set(result["tg8_batched_roofline"]) == {"1", "3"}
    assert all(v > 0 for v in result["tg8_batched_roofline"].values())


def test_bench_measures_with_the_kv_cache_types_asked_for(tmp_path, monkeypatch):
    """`ggmlpy bench -ctk q8_0 -ctv q8_0 -fa on -d N` (llama-bench's flags): every context it
    makes, the depth one included, has that cache; the result says which."""
    import llama
    from ggmlpy.cli import main

    made = []
    real = llama.Context.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append((self.type_k, self.type_v, self.flash_attn))

    monkeypatch.setattr(llama.Context, "__init__", spy)
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=2, n_embd=128, n_head=4)   # heads of 32
    result = run_bench(str(path), n_prompt=8, n_gen=4, reps=1, start_times=False, batched=(2,), depth=16,
                       kv={"type_k": "q8_0", "type_v": "q8_0", "flash_attn": True})
    assert result["type_k"] == result["type_v"] == "q8_0" and result["tg4_d16_tok_s"] > 0
    assert len(made) == 3 and all(m == ("q8_0", "q8_0", True) for m in made)
    made.clear()
    assert main(["bench", "-m", str(path), "-p", "8", "-n", "2", "-r", "1", "--no-start-times", "--batched", "",
                 "-ctk", "q4_0", "-ctv", "q8_0", "-fa", "1"]) == 0
    assert made == [("q4_0", "q8_0", True)]


def test_bench_batched_counts_are_checked():
    import argparse

    from ggmlpy.cli.bench_cmd import _counts

    assert _counts("1,2, 4") == (1, 2, 4) and _counts("") == ()
    for bad in ("0", "1,x", "65"):
        try:
            _counts(bad)
        except argparse.ArgumentTypeError as e:
            assert "--batched" in str(e)
        else:
            raise AssertionError(bad)


def test_bench_attention_masks_and_result():
    """bench/bench_attention.py's masks give each token its cells (disjoint blocks of 64 per
    sequence), and its graph computes attention: one layer against numpy."""
    import importlib.util
    from pathlib import Path

    import numpy as np

    path = Path(__file__).resolve().parents[3] / "bench" / "bench_attention.py"
    spec = importlib.util.spec_from_file_location("bench_attention", path)
    ba = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ba)
    mask = ba.mask_rows(4, 512, 100, "blocks")
    seen = [set(np.flatnonzero(row == 0)) for row in mask]
    assert [len(s) for s in seen] == [100] * 4
    assert all(not (seen[a] & seen[b]) for a in range(4) for b in range(a + 1, 4))
    assert seen[1] == set(range(64, 128)) | set(range(320, 356))   # blocks 1 and 5
    assert (ba.mask_rows(4, 256, 100, "shared") == 0).sum(axis=1).tolist() == [100] * 4

    from ggmlpy.codegen_cpu.backend import CpuBackend
    from ggmlpy.codegen_cpu.fusion import CPU_RULES
    from ggmlpy.passes.pipeline import run_pipeline
    from ggmlpy.sched.store import TensorStore

    layers, ba.LAYERS = ba.LAYERS, 1
    try:
        graph, caches = ba.build(2, 256)
    finally:
        ba.LAYERS = layers
    opt = run_pipeline(graph, "cpu", rules=CPU_RULES).graph
    split = CpuBackend(n_threads=2, worst_env={"n_tokens": 2, "n_kv": 256, "n_outputs": 2}).compile(opt, opt.nodes)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 9, 64)).astype(np.float32)
    k = rng.standard_normal((ba.CELLS, 192)).astype(np.float16)
    v = rng.standard_normal((ba.CELLS, 192)).astype(np.float16)
    m = ba.mask_rows(2, 256, 100, "blocks")
    store = TensorStore({"q": q, "mask": m, caches[0].name: k, caches[1].name: v})
    split.run(store, {})
    out = store.array(opt.outputs[0], {}).reshape(2, 9, 64)
    want = np.zeros((2, 9, 64), np.float32)
    for t in range(2):
        for h in range(9):
            kh = k[:256, 64 * (h // 3):64 * (h // 3 + 1)].astype(np.float32)
            vh = v[:256, 64 * (h // 3):64 * (h // 3 + 1)].astype(np.float32)
            s = kh @ q[t, h].astype(np.float16).astype(np.float32) / 8.0 + m[t]   # q meets f16 K as f16
            p = np.exp(s - s.max())
            want[t, h] = (p / p.sum()).astype(np.float16).astype(np.float32) @ vh   # so do the weights

    np.testing.assert_allclose(out, want, atol=2e-5)


def test_barrier_hazards_classifies_every_barrier(tmp_path):
    """bench/barrier_hazards.py: in a tiny llama's decode program the barriers that guard
    nothing are those between its independent f32 projections (q, k, v read one input and
    no scratch); with quantised weights they share the scratch and every barrier guards."""
    import importlib.util
    from pathlib import Path

    from ggmlpy.ir.types import GGMLType

    path = Path(__file__).resolve().parents[3] / "bench" / "barrier_hazards.py"
    spec = importlib.util.spec_from_file_location("barrier_hazards", path)
    bh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bh)
    found = {}
    for wtype in (GGMLType.F32, GGMLType.Q8_0):
        model = llama.model.Model.load(str(write_tiny_llama(tmp_path / f"{wtype.name}.gguf", n_layer=2,
                                                            weight_type=wtype)))
        ctx = llama.Context(model, n_ctx=64, n_batch=8, n_ubatch=8, n_threads=2)
        assert ctx.decode(llama.Batch.from_tokens([5, 6])) == 0
        split = max((c for e in ctx.graph_cache.entries.values() for c in e.compiled
                     if isinstance(c, bh.CpuSplit)), key=lambda s: len(s.nodes))
        why, free = bh.hazards(split, 64)
        assert sum(why.values()) == len(split.nodes) - 1
        assert why["reads the previous output"] > (len(split.nodes) - 1) // 2
        found[wtype] = free
    assert found[GGMLType.Q8_0] == {}
    assert found[GGMLType.F32] and set(found[GGMLType.F32]) == {"mul_mat -> mul_mat"}


def test_a_decode_step_reads_the_selected_share_of_the_experts(tmp_path):
    """The roofline's bytes per token: every weight read whole once, a stack of experts
    n_used / n_expert of it (mul_mat_id reads only the selected experts)."""
    import gguf

    import llama
    from ggmlpy.cli.bench_run import weight_bytes_per_step
    from ggmlpy.ir.types import GGMLType
    from ggmlpy.testing.models_archs import write_tiny_model

    path = write_tiny_model("qwen3moe", tmp_path / "m.gguf", weight_type=GGMLType.Q8_0)   # 3 of 8 experts
    ctx = llama.Context(llama.Model.load(str(path)), n_ctx=64, n_threads=2)
    assert ctx.decode(llama.Batch.from_tokens([5])) == 0
    expected = 0
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.name == "token_embd.weight":
            continue   # looked up a row at a time
        expected += t.n_bytes * 3 // 8 if "_exps." in t.name else t.n_bytes
    assert weight_bytes_per_step(ctx) == expected
