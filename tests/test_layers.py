"""The layering: the compiler library `ggmlpy/` imports nothing from the runtime `llama/`.

Only the command line (ggmlpy/cli/) stands above both, as llama.cpp's tools/ stands above
ggml/ and src/. One test reads every module's source (imports inside functions too); the
other imports every module in a fresh interpreter and looks for llama in sys.modules, which
also catches an import that goes through another package.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "ggmlpy"
ABOVE = PACKAGE / "cli"  # the command line may import both
RUNTIME = "llama"
IMPORT_FUNCTIONS = frozenset({"import_module", "__import__"})


def is_runtime(module: str | None) -> bool:
    return module is not None and (module == RUNTIME or module.startswith(RUNTIME + "."))


def runtime_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of the runtime in `source`: import statements anywhere
    in the file, and importlib.import_module / __import__ calls with a literal name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if is_runtime(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and is_runtime(node.module):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in IMPORT_FUNCTIONS and isinstance(node.args[0].value, str) and is_runtime(node.args[0].value):
                found.append((node.lineno, node.args[0].value))
    return found


def library_files() -> list[Path]:
    """Every Python file of ggmlpy/ below the command line."""
    return sorted(p for p in PACKAGE.rglob("*.py") if ABOVE not in p.parents)


def test_the_finder_sees_every_form_of_import():
    source = ("import os\nimport llama\nimport llama.model as m, numpy\nfrom llama.server import app\n"
              "from llamafile import x\nimport llama_cpp\nfrom . import llama\n"
              "def f():\n    from llama import Model\n    importlib.import_module('llama.batch')\n"
              "    __import__('llama')\n    importlib.import_module(name)\n")
    assert runtime_imports(source) == [(2, "llama"), (3, "llama.model"), (4, "llama.server"),
                                       (9, "llama"), (10, "llama.batch"), (11, "llama")]


def test_the_compiler_library_imports_nothing_from_the_runtime():
    files = library_files()
    assert PACKAGE / "sched" / "scheduler.py" in files and PACKAGE / "cli" / "viz_cmd.py" not in files
    offending = [f"{path.relative_to(REPO)}:{line}: imports {module}"
                 for path in files
                 for line, module in runtime_imports(path.read_text(encoding="utf-8"))]
    assert not offending, ("ggmlpy/ outside ggmlpy/cli/ imports the runtime (llama/); move the code "
                           "to llama/ or ggmlpy/cli/, or pass the data in:\n" + "\n".join(offending))


_IMPORT_ALL = """
import importlib, json, sys
loaded, missing = [], {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
        loaded.append(name)
    except ImportError as e:
        if e.name is None or e.name.split(".")[0] in ("ggmlpy", "llama"):
            raise
        missing[name] = e.name  # an optional extra (ray, fastapi, ...) not installed here
runtime = sorted(m for m in sys.modules if m == "llama" or m.startswith("llama."))
print(json.dumps({"loaded": loaded, "missing": missing, "runtime": runtime}))
"""


def library_modules() -> list[str]:
    """The dotted names of library_files(), packages by their __init__; not __main__, which runs the CLI."""
    names = []
    for path in library_files():
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_importing_every_library_module_loads_no_runtime_module():
    modules = library_modules()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _IMPORT_ALL, json.dumps(modules)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"ggmlpy.viz", "ggmlpy.sched.scheduler", "ggmlpy.distributed.actor"} <= set(modules)
    assert "ggmlpy.viz.snapshot" in result["loaded"] and "ggmlpy.sched.placement" in result["loaded"]
    assert result["runtime"] == [], (f"importing ggmlpy's library modules loaded {result['runtime']} "
                                     f"(optional extras not installed: {result['missing']})")
