"""ggmlpy.options: the GGMLPY_* settings read when a backend is made, never at import."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cuda.backend import CudaBackend
from ggmlpy.codegen_cuda.driver import DryRunDriver
from ggmlpy.options import Options
from ggmlpy.sched.registry import create_backend, host_backends

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_from_an_empty_environment():
    assert Options.from_env({}) == Options()
    o = Options()
    assert (o.profile, o.cpu_qdot, o.cache_dir) == (False, None, None)
    assert (o.cuda_attn_threads, o.cuda_pdl, o.cuda_matvec_rows, o.cuda_fuse_oproj) == (1024, True, 0, False)


@pytest.mark.parametrize("env,field,value", [
    ({"GGMLPY_PROFILE": "1"}, "profile", True),
    ({"GGMLPY_PROFILE": "0"}, "profile", False),
    ({"GGMLPY_PROFILE": ""}, "profile", False),
    ({"GGMLPY_CPU_QDOT": "generic"}, "cpu_qdot", "generic"),
    ({"GGMLPY_CPU_QDOT": ""}, "cpu_qdot", None),
    ({"GGMLPY_CACHE": "/x/y"}, "cache_dir", "/x/y"),
    ({"GGMLPY_CUDA_ATTN_THREADS": "64"}, "cuda_attn_threads", 64),
    ({"GGMLPY_CUDA_PDL": "0"}, "cuda_pdl", False),
    ({"GGMLPY_CUDA_PDL": "1"}, "cuda_pdl", True),
    ({"GGMLPY_CUDA_MATVEC_ROWS": "2"}, "cuda_matvec_rows", 2),
    ({"GGMLPY_CUDA_FUSE_OPROJ": "1"}, "cuda_fuse_oproj", True),
    ({"GGMLPY_CUDA_FUSE_OPROJ": "0"}, "cuda_fuse_oproj", False),
])
def test_each_variable_sets_its_field(env, field, value):
    options = Options.from_env(env)
    assert getattr(options, field) == value
    others = {f: getattr(Options(), f) for f in Options.__dataclass_fields__ if f != field}
    assert {f: getattr(options, f) for f in others} == others


def test_bad_values_raise_when_the_options_are_made():
    with pytest.raises(ValueError, match="GGMLPY_CPU_QDOT"):
        Options.from_env({"GGMLPY_CPU_QDOT": "avx9"})
    with pytest.raises(ValueError, match="matvec_rows"):
        Options.from_env({"GGMLPY_CUDA_MATVEC_ROWS": "3"})


def test_options_given_to_a_backend_win_over_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GGMLPY_PROFILE", "1")
    monkeypatch.setenv("GGMLPY_CPU_QDOT", "vnni512")
    monkeypatch.setenv("GGMLPY_CUDA_ATTN_THREADS", "512")
    monkeypatch.setenv("GGMLPY_CUDA_FUSE_OPROJ", "1")
    monkeypatch.setenv("GGMLPY_CACHE", str(tmp_path / "env"))
    given = Options(cpu_qdot="generic", cache_dir=str(tmp_path / "given"))
    cpu = CpuBackend(options=given)
    assert not cpu.profile and cpu.qdot == "generic"
    assert cpu.object_cache.dir == tmp_path / "given" / "cpu"
    cuda = CudaBackend(driver=DryRunDriver(compile=False), options=given)
    assert cuda.options.attn_threads == 1024 and not cuda.options.fuse_oproj and cuda.settings.cuda_pdl
    assert cuda.cache.dir == tmp_path / "given" / "cuda"
    # and without options, the environment at creation counts
    env_cpu = CpuBackend()
    assert env_cpu.profile and env_cpu.qdot == "vnni512"
    env_cuda = CudaBackend(driver=DryRunDriver(compile=False))
    assert env_cuda.options.attn_threads == 512 and env_cuda.options.fuse_oproj
    # the registry hands them on
    assert create_backend("cpu", given).qdot == "generic"
    assert [be.name for be in host_backends("cpu", given)] == ["cpu", "ref"]
    assert host_backends("cpu", given)[0].settings is given


def test_the_qdot_flavour_is_in_the_plan_key():
    """The flavour changes the IR text, so the plan key (the warm start's lookup) changes too."""
    from ggmlpy.codegen_cpu.program import ProgramBuilder
    from ggmlpy.ir.builder import GraphBuilder
    from ggmlpy.ir.types import GGMLType

    b = GraphBuilder()
    w = b.weight("w", GGMLType.Q8_0, (64, 8, 1, 1))
    g = b.build([b.mul_mat(w, b.input("x", GGMLType.F32, (64, 2)))])
    env = {"n_tokens": 2}
    keys = {q: ProgramBuilder(g, list(g.nodes), env, set(), qdot=q).plan_key() for q in ("generic", "vnni256")}
    assert keys["generic"] != keys["vnni256"]
    assert ProgramBuilder(g, list(g.nodes), env, set(), qdot="generic").plan_key() == keys["generic"]


def test_importing_ggmlpy_reads_no_setting():
    """With every GGMLPY_* variable set to a value that would raise, importing all of
    ggmlpy and llama raises nothing; making a backend then does."""
    bad = {"GGMLPY_CPU_QDOT": "avx9", "GGMLPY_CUDA_ATTN_THREADS": "many", "GGMLPY_CUDA_MATVEC_ROWS": "lots"}
    script = """
import importlib, pkgutil
import ggmlpy, llama
for pkg in (ggmlpy, llama):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if m.name.endswith("__main__"):
            continue  # (programs, not modules)
        importlib.import_module(m.name)
print("imported")
from ggmlpy.codegen_cpu.backend import CpuBackend
try:
    CpuBackend()
except ValueError as e:
    print("raised:", e)
"""
    env = dict(os.environ, **bad, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "imported" in out.stdout and "raised:" in out.stdout, out.stdout + out.stderr
