"""Shared fixtures: the real model files and the golden reference data.

The real models are fetched once into the model cache (`ggmlpy.hub`); `.ci/run` fetches them
before the tests, so a test that needs one never silently skips on CI.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ggmlpy.hub import resolve_model

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"  # llama.cpp's reference outputs (tests/golden/README.md)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return resolve_model("gemma3-270m")


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    return GOLDEN
