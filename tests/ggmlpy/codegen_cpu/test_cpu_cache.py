"""The compiled-graph caches: one compile per signature in memory, object code on disk
keyed by IR, CPU and tool versions; a corrupt or stale entry is rebuilt, never run."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import llama
from ggmlpy.codegen_cpu.object_cache import SUFFIX, ObjectCache, key_parts
from ggmlpy.testing.models import write_tiny_llama

SCRIPT = """
import json, logging, sys
import llama
events = []
class H(logging.Handler):
    def emit(self, record):
        events.append(record.getMessage())
logging.getLogger("ggmlpy.cache").addHandler(H())
logging.getLogger("ggmlpy.cache").setLevel(logging.INFO)
m = llama.Model.load(sys.argv[1])
ctx = llama.Context(m, n_ctx=256, backend="cpu")
assert ctx.decode(llama.Batch.from_tokens([1, 2, 3])) == 0
be = ctx.backends[0]
print(json.dumps({"hits": be.object_cache.hits, "misses": be.object_cache.misses, "ir_builds": be.ir_builds,
                  "events": events, "logit": float(ctx.get_logits_ith(-1)[7])}))
"""


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("cache") / "tiny.gguf", seed=11)


def run_process(model, cache_dir) -> dict:
    env = {"GGMLPY_CACHE": str(cache_dir), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(model)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_compiles_nothing(tiny_path, tmp_path):
    first = run_process(tiny_path, tmp_path)
    # two graphs (prompt and one-token), one compile unit per distinct kernel and one entry;
    # the units the graphs share compile once (no second lookup, so no hit)
    assert first["misses"] >= 3 and first["hits"] == 0
    assert first["misses"] == first["ir_builds"]
    second = run_process(tiny_path, tmp_path)
    assert second["misses"] == 0 and second["hits"] >= first["misses"]
    assert first["ir_builds"] >= 1 and second["ir_builds"] == 0  # found by plan key: no IR generated
    assert all("hit" in e for e in second["events"] if "object cache" in e)
    assert second["logit"] == first["logit"]


def test_corrupt_entry_is_discarded_and_rebuilt(tiny_path, tmp_path):
    run_process(tiny_path, tmp_path)
    objects = sorted((tmp_path / "cpu").glob("*.o"))
    assert objects
    for obj in objects:
        data = bytearray(obj.read_bytes())
        data[len(data) // 2] ^= 0xFF
        obj.write_bytes(bytes(data))
    again = run_process(tiny_path, tmp_path)
    assert again["misses"] >= 1
    assert any("corrupt object file" in e for e in again["events"])
    third = run_process(tiny_path, tmp_path)  # rebuilt and stored again
    assert third["misses"] == 0


def test_plan_record_without_its_object_rebuilds(tiny_path, tmp_path):
    """A plan record whose object is gone (or garbage) is a miss: the IR is built, compiled
    and stored again, with the same results."""
    first = run_process(tiny_path, tmp_path)
    plans = sorted((tmp_path / "cpu" / "index").iterdir())
    assert plans
    for obj in (tmp_path / "cpu").glob("*.o"):
        obj.unlink()
    plans[0].write_text("not a hash")
    again = run_process(tiny_path, tmp_path)
    assert again["ir_builds"] >= 1 and again["logit"] == first["logit"]
    assert run_process(tiny_path, tmp_path)["ir_builds"] == 0


def test_stale_entry_is_discarded(tmp_path):
    cache = ObjectCache(tmp_path)
    ir_text = "; a module\n"
    cache.store(ir_text, b"object code")
    obj, record = cache.paths(key_parts(ir_text), SUFFIX)
    meta = json.loads(record.read_text())
    meta["parts"]["cpu"] = "some-other-cpu"
    record.write_text(json.dumps(meta))
    assert cache.load(ir_text) is None
    assert cache.events[-1][0] == "discard" and "stale" in cache.events[-1][1]
    assert not obj.exists()


def test_one_compile_serves_every_prompt_length(tiny_path):
    model = llama.Model.load(tiny_path)
    ctx = llama.Context(model, n_ctx=512, n_batch=512, n_ubatch=512, backend="cpu")
    compiled = len(ctx.graph_cache.entries)
    for n in (2, 17, 300):
        ctx.memory.clear()
        assert ctx.decode(llama.Batch.from_tokens(list(range(1, n + 1)))) == 0
    assert len(ctx.graph_cache.entries) == compiled == 2
    assert ctx.graph_cache.misses == 2
    ref = llama.Context(model, n_ctx=512, backend="ref")
    assert ref.decode(llama.Batch.from_tokens(list(range(1, 301)))) == 0
    np.testing.assert_allclose(ctx.get_logits_ith(-1), ref.get_logits_ith(-1), atol=1e-3, rtol=0)


def test_llvm_runs_beside_the_caller(tiny_path, tmp_path, monkeypatch):
    """On a miss the CPU backend hands LLVM's work to a worker process and returns at once:
    each split waits for its module at its first run, with the same results as splits
    compiled before Context returns (GGMLPY_COMPILE_INPROCESS=1)."""
    monkeypatch.setenv("GGMLPY_CACHE", str(tmp_path / "async"))
    model = llama.Model.load(tiny_path)
    ctx = llama.Context(model, n_ctx=256, backend="cpu")
    splits = [c for e in ctx.graph_cache.entries.values() for c in e.compiled]
    assert splits and all(s.modules is None and s._compiling is not None for s in splits)
    assert ctx.decode(llama.Batch.from_tokens([1, 2, 3])) == 0
    assert ctx.decode(llama.Batch.from_tokens([4])) == 0
    logits = np.array(ctx.get_logits_ith(-1))
    assert all(s.modules is not None and s._compiling is None for s in splits)
    monkeypatch.setenv("GGMLPY_CACHE", str(tmp_path / "sync"))
    monkeypatch.setenv("GGMLPY_COMPILE_INPROCESS", "1")
    ctx2 = llama.Context(model, n_ctx=256, backend="cpu")
    assert all(s.modules is not None for e in ctx2.graph_cache.entries.values() for s in e.compiled)
    assert ctx2.decode(llama.Batch.from_tokens([1, 2, 3])) == 0
    assert ctx2.decode(llama.Batch.from_tokens([4])) == 0
    np.testing.assert_array_equal(ctx2.get_logits_ith(-1), logits)
