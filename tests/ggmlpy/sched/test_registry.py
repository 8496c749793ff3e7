"""The backend registry finds backends by module path (sched/registry.py BACKEND_MODULES):
importing it, or a backend package, registers nothing, and every declared backend is found
on first use without its package having been imported first."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ggmlpy.sched.backend_entry import BackendEntry
from ggmlpy.sched.registry import (BACKEND_MODULES, PlacementError, available_backends, backend_entries,
                                   create_backend, create_device)

ROOT = Path(__file__).resolve().parents[3]
BACKEND_PACKAGES = ("ggmlpy.codegen_cpu", "ggmlpy.codegen_cuda", "ggmlpy.distributed", "ggmlpy.sched.ref_backend")
# runtime users of the registry inside a backend package (a function-level import, not at import
# time): the Ray actor makes its node's own backend by name
RUNTIME_USERS = {"ggmlpy/distributed/actor.py"}


def _child(code: str) -> dict:
    """Run `code` in a fresh interpreter (nothing imported yet); it prints one JSON object."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(proc.stdout)


def test_importing_the_registry_imports_no_backend_and_first_use_finds_them():
    got = _child(
        "import json, sys\n"
        "import ggmlpy.sched.registry as r\n"
        f"packages = {BACKEND_PACKAGES!r}\n"
        "loaded = lambda: sorted(m for m in sys.modules if m.startswith(packages))\n"
        "before = loaded()\n"
        "names = r.available_backends()\n"
        "print(json.dumps({'before': before, 'names': names, 'after': loaded()}))\n")
    assert got["before"] == []
    assert got["names"][0] == "cpu" and got["names"][-1] == "ref"
    # the declaration modules were imported; the code generators were not (factories are lazy)
    assert {"ggmlpy.codegen_cpu.reg", "ggmlpy.codegen_cuda.reg", "ggmlpy.distributed.reg"} <= set(got["after"])
    assert not {"ggmlpy.codegen_cpu.backend", "ggmlpy.codegen_cuda.backend", "ggmlpy.sched.ref_backend"} & set(got["after"])


def test_importing_a_backend_package_registers_nothing():
    got = _child("import json, sys\n"
                 "import ggmlpy.codegen_cuda, ggmlpy.codegen_cuda.backend, ggmlpy.codegen_cuda.reg\n"
                 "import ggmlpy.codegen_cpu.backend, ggmlpy.distributed.remote_backend, ggmlpy.sched.ref_backend\n"
                 "print(json.dumps('ggmlpy.sched.registry' in sys.modules))\n")
    assert got is False


def _imports_of_registry(path: Path) -> list[tuple[int, bool]]:
    """(line, at module level) of each import of ggmlpy.sched.registry in `path`."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        if "ggmlpy.sched.registry" in names:
            found.append((node.lineno, id(node) in top))
    return found


def _backend_sources() -> list[Path]:
    paths = [ROOT / "ggmlpy/sched/ref_backend.py", ROOT / "ggmlpy/sched/ref_reg.py"]
    for package in ("codegen_cpu", "codegen_cuda", "distributed"):
        paths += sorted((ROOT / "ggmlpy" / package).rglob("*.py"))
    return paths


def test_no_backend_package_imports_the_registry():
    bad = {}
    for path in _backend_sources():
        rel = path.relative_to(ROOT).as_posix()
        imports = _imports_of_registry(path)
        if rel in RUNTIME_USERS:
            imports = [(line, top) for line, top in imports if top]
        if imports:
            bad[rel] = [line for line, _ in imports]
    assert not bad, f"backend modules importing ggmlpy.sched.registry: {bad}"


def test_every_declaration_module_is_a_backend_entry_of_its_package():
    entries = backend_entries()
    assert [type(e) for e in entries] == [BackendEntry] * len(BACKEND_MODULES)
    assert [e.name for e in entries] == ["cpu", "cuda", "ref", "ray"]
    # the priority order of today: the host CPU first, CUDA (with a GPU) next, the reference last
    assert sorted((e.priority, e.name) for e in entries if e.make is not None) == [(0, "cpu"), (1, "cuda"), (99, "ref")]


def test_cuda_is_found_by_name_without_importing_its_package_first():
    got = _child(
        "import json\n"
        "from ggmlpy.sched.registry import available_backends, create_backend\n"
        "try:\n"
        "    be = create_backend('cuda')\n"
        "    out = {'made': be.name}\n"
        "except ValueError as e:\n"
        "    out = {'error': str(e)}\n"
        "from ggmlpy.codegen_cuda import cuda_available\n"
        "out['ok'], out['reason'] = cuda_available()\n"
        "out['listed'] = 'cuda' in available_backends()\n"
        "print(json.dumps(out))\n")
    assert got["listed"] == got["ok"]
    if got["ok"]:
        assert got["made"] == "cuda"
    else:
        assert got["error"] == f"backend 'cuda' is not available: {got['reason']}"


def test_unknown_names_are_refused_with_what_exists():
    with pytest.raises(ValueError, match=r"unknown backend 'ray' \(available: cpu.*ref\)"):
        create_backend("ray")  # "ray" offers devices only
    with pytest.raises(PlacementError, match="expected one of cpu:N with N >= 1, cuda:N, ref:N, ray:"):
        create_device("tpu:0")


def test_the_default_backend_is_the_first_available():
    assert create_backend().name == available_backends()[0] == "cpu"
