"""Rendering CUDA C from `templates/cuda/*.cu.j2` (docs/architecture.md, decision 8).

The templates are installed as the package `ggmlpy.templates`; a source checkout that runs
without installing (PYTHONPATH=.) finds them in the repository's `templates/` folder. The
environment uses StrictUndefined, so a variant that forgets a variable fails loudly at
render time instead of producing C with a hole in it.
"""
from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path
from typing import Any

import jinja2

TEMPLATE_PACKAGE = "ggmlpy.templates"
_REPO_TEMPLATES = Path(__file__).resolve().parents[2] / "templates" / "cuda"


def _template_root():
    """The folder holding the .cu.j2 files (a Traversable or a Path)."""
    try:
        root = importlib.resources.files(TEMPLATE_PACKAGE) / "cuda"
        if root.is_dir():
            return root
    except ModuleNotFoundError:
        pass
    if _REPO_TEMPLATES.is_dir():
        return _REPO_TEMPLATES
    raise FileNotFoundError(f"CUDA templates not found: neither the package {TEMPLATE_PACKAGE} "
                            f"nor {_REPO_TEMPLATES} exists")


def _load(name: str) -> str:
    path = _template_root() / name
    if not path.is_file():
        raise jinja2.TemplateNotFound(name)
    return path.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FunctionLoader(_load), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                              autoescape=False)


def render(template: str, **variables: Any) -> str:
    """Render one template (`matvec.cu.j2`) with the given variables."""
    return environment().get_template(template).render(**variables)


def template_names() -> list[str]:
    """Every kernel-family template (partials start with an underscore)."""
    root = _template_root()
    return sorted(p.name for p in root.iterdir() if p.name.endswith(".cu.j2") and not p.name.startswith("_"))
