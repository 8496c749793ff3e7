"""Every source package is a real package, so `pip install .` (not only the source tree the
tests run from) contains it: a folder without __init__.py is silently left out of the wheel."""
from __future__ import annotations

from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]


def test_every_source_folder_is_installed():
    installed = set(find_packages(where=str(ROOT), include=["ggmlpy", "ggmlpy.*", "llama", "llama.*"]))
    for top in ("ggmlpy", "llama"):
        for py in (ROOT / top).rglob("*.py"):
            package = ".".join(py.parent.relative_to(ROOT).parts)
            if "__pycache__" in package:
                continue
            assert package in installed, f"{package} has no __init__.py and would not be installed"
