"""The pieces around the kernels: rendering, kernel naming and parameter packing, the disk
cache (keying and corruption), the nvcc cache, the arena planner and backend registration."""
from __future__ import annotations

import struct

import jinja2
import numpy as np
import pytest

from ggmlpy.codegen_cuda import render as render_mod
from ggmlpy.codegen_cuda.kernels import KernelSpec, common_tables, module_source
from ggmlpy.codegen_cuda.nvcc import compile_cuda, find_nvcc
from ggmlpy.codegen_cuda.planner import ALIGN, nbytes, plan_arena
from ggmlpy.codegen_cuda.steps import Step
from ggmlpy.disk_cache import DiskCache, cache_key
from ggmlpy.ir import GGMLType, GraphBuilder, N_TOKENS


# rendering and specs ---------------------------------------------------------------------------
def test_strict_undefined_rejects_a_missing_variable():
    with pytest.raises(jinja2.UndefinedError):
        render_mod.render("norm.cu.j2", name="k", fields=(), kind="rms", src="f32")  # no has_w


def test_templates_fall_back_to_the_repository(monkeypatch):
    monkeypatch.setattr(render_mod, "TEMPLATE_PACKAGE", "ggmlpy.no_such_templates_package")
    render_mod.environment.cache_clear()
    try:
        assert "norm.cu.j2" in render_mod.template_names()
        assert "block_sum" in render_mod.render("common.cu.j2", **common_tables())
    finally:
        render_mod.environment.cache_clear()


def _spec(**variant) -> KernelSpec:
    fields = [("s", "ptr"), ("d", "ptr"), ("ne0", "i64"), ("ne1", "i64"), ("ne2", "i64"), ("ne3", "i64")]
    fields += [(f"nbs{i}", "i64") for i in range(4)] + [(f"nbd{i}", "i64") for i in range(4)]
    return KernelSpec.make("norm", fields + [("eps", "f64")], kind="rms", src="f32", has_w=False, **variant)


def test_kernel_names_follow_the_signature_and_dedupe():
    a, b = _spec(), _spec()
    assert a.name == b.name and a.name.startswith("gg_norm_")
    c = KernelSpec.make("norm", a.fields, kind="norm", src="f32", has_w=False)
    assert c.name != a.name
    src = module_source([a, b, c])
    assert src.count(f"void __launch_bounds__(1024) {a.name}(") == 1


def test_parameters_pack_as_eight_byte_fields_in_order():
    s = _spec()
    vals = {f: i + 1 for i, (f, _) in enumerate(s.fields)}
    vals["eps"] = 1e-5
    raw = s.pack(vals)
    assert len(raw) == 8 * len(s.fields)
    assert struct.unpack_from("<Q", raw, 0)[0] == 1
    assert struct.unpack_from("<d", raw, 8 * (len(s.fields) - 1))[0] == 1e-5
    with pytest.raises(KeyError, match="eps"):
        s.pack({f: 0 for f, _ in s.fields[:-1]})
    with pytest.raises(ValueError, match="duplicate"):
        KernelSpec.make("norm", [("a", "i64"), ("a", "i64")])


# disk cache -----------------------------------------------------------------------------------
def test_cache_key_depends_on_every_part():
    base = {"source": "abc", "arch": "sm_90", "nvcc": "13.0"}
    keys = {cache_key(base)} | {cache_key({**base, k: "other"}) for k in base}
    assert len(keys) == 4
    assert cache_key(dict(reversed(list(base.items())))) == cache_key(base)


def test_corrupt_entries_are_detected_and_dropped(tmp_path):
    cache = DiskCache("cuda", tmp_path)
    parts = {"source": "ab", "arch": "sm_90"}
    cache.put(parts, b"payload bytes")
    assert cache.get(parts) == b"payload bytes"
    path, record = cache.paths(parts)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01                       # one flipped bit
    path.write_bytes(bytes(raw))
    assert cache.get(parts) is None and cache.discards == 1
    assert not path.exists() and not record.exists()  # deleted, so the next build replaces it
    other = {"source": "cd", "arch": "sm_90"}
    cache.put(other, b"x" * 100)
    p2, _ = cache.paths(other)
    p2.write_bytes(p2.read_bytes()[:-10])  # truncated
    assert cache.get(other) is None and cache.discards == 2


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc (the CUDA toolkit) is not installed")
def test_nvcc_results_are_cached_and_rebuilt_when_corrupt(tmp_path):
    cache = DiskCache("cuda", tmp_path)
    src = module_source([_spec()])
    first = compile_cuda(src, "sm_90", "ptx", cache)
    assert cache.misses == 1 and cache.hits == 0
    assert compile_cuda(src, "sm_90", "ptx", cache) == first and cache.hits == 1
    entry = next(tmp_path.rglob("*.ptx"))
    entry.write_bytes(entry.read_bytes()[:-5])
    assert compile_cuda(src, "sm_90", "ptx", cache) == first and cache.discards == 1
    assert compile_cuda(src, "sm_90", "ptx", cache) == first and cache.hits == 2


# planner --------------------------------------------------------------------------------------
def _chain(n: int, width: int = 100):
    """x -> t1 -> t2 -> ... each a scale of the previous (F32 [width, n_tokens])."""
    b = GraphBuilder()
    x = b.input("x", GGMLType.F32, (width, N_TOKENS))
    ts = [x]
    for _ in range(n):
        ts.append(b.scale(ts[-1], 2.0))
    return ts


def _steps(pairs):
    return [Step([w], reads=list(r), writes=[w]) for r, w in pairs]


def test_planner_reuses_memory_of_dead_tensors():
    ts = _chain(4)
    steps = _steps([((ts[i],), ts[i + 1]) for i in range(4)])
    env = {"n_tokens": 3}
    owned = {t.id for t in ts[1:]}
    plan = plan_arena(steps, env, owned, keep=[ts[4].id])
    size = nbytes(ts[1], env)
    assert size == 100 * 3 * 4
    a = -(-size // ALIGN) * ALIGN
    # t1 and t2 overlap in time, t3 can take t1's place, t4 t2's
    assert plan.offsets[ts[1].id] != plan.offsets[ts[2].id]
    assert plan.offsets[ts[3].id] == plan.offsets[ts[1].id]
    assert plan.size == 2 * a
    assert all(o % ALIGN == 0 for o in plan.offsets.values())


def test_planner_keeps_outputs_and_views_alive():
    b = GraphBuilder()
    x = b.input("x", GGMLType.F32, (8, N_TOKENS))
    t1 = b.scale(x, 2.0)
    view = b.reshape(t1, 8 * N_TOKENS)          # a view of t1, read at the last step
    t2 = b.scale(t1, 3.0)
    t3 = b.scale(t2, 3.0)
    t4 = b.add(b.reshape(t3, 8 * N_TOKENS), view)
    steps = _steps([((x,), t1), ((t1,), t2), ((t2,), t3), ((t3, view), t4)])
    owned = {t.id for t in (t1, t2, t3, t4)}
    plan = plan_arena(steps, {"n_tokens": 5}, owned, keep=[t2.id])
    spans = {t.id: (plan.offsets[t.id], plan.offsets[t.id] + plan.sizes[t.id]) for t in (t1, t2, t3, t4)}

    def overlap(a, b):
        return spans[a.id][0] < spans[b.id][1] and spans[b.id][0] < spans[a.id][1]

    # t1 is read through its view at the last step: nothing may take its memory
    assert not any(overlap(t1, t) for t in (t2, t3, t4))
    assert not overlap(t2, t4)  # t2 is an output: kept to the end


def test_planner_random_graphs_never_share_live_memory():
    rng = np.random.default_rng(0)
    for _ in range(20):
        ts = _chain(12, width=int(rng.integers(1, 300)))
        pairs = []
        for i in range(1, 13):
            reads = [ts[i - 1]] + [ts[j] for j in rng.choice(i, size=min(i, 2), replace=False)]
            pairs.append((reads, ts[i]))
        steps = _steps(pairs)
        env = {"n_tokens": int(rng.integers(1, 9))}
        owned = {t.id for t in ts[1:]}
        plan = plan_arena(steps, env, owned)
        first = {s.writes[0].id: i for i, s in enumerate(steps)}
        last = dict(first)
        for i, s in enumerate(steps):
            for r in s.reads:
                if r.id in owned:
                    last[r.id] = max(last[r.id], i)
        ids = list(owned)
        for a in ids:
            for b in ids:
                if a >= b:
                    continue
                live = first[a] <= last[b] and first[b] <= last[a]
                mem = plan.offsets[a] < plan.offsets[b] + plan.sizes[b] and plan.offsets[b] < plan.offsets[a] + plan.sizes[a]
                assert not (live and mem)


# registration ---------------------------------------------------------------------------------
def test_the_registry_lists_cuda_only_with_a_device():
    from ggmlpy.codegen_cuda import cuda_available
    from ggmlpy.sched.registry import available_backends

    ok, reason = cuda_available()
    assert ("cuda" in available_backends()) == ok
    if not ok:
        assert reason  # says why (no binding, no driver, no device)
    else:
        assert available_backends().index("cuda") < available_backends().index("ref")
