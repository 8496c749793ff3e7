"""Shared fixtures (the real model files, the golden reference data) and the test tiers.

The real models are fetched once into the model cache (`ggmlpy.hub`); `.ci/run` fetches them
before the tests, so a test that needs one never silently skips on CI.

Tiers: every test under a folder (or file) of `MARKERS` gets that entry's markers, and every
test that uses a real model file gets `model`; `model`, `browser`, `ray` and `cuda_emu` tests
are also `slow`. `pytest -m "not slow"` is the everyday tier; CI runs everything.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from ggmlpy.hub import resolve_model

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
GOLDEN = TESTS / "golden"  # llama.cpp's reference outputs (tests/golden/README.md)

# path under tests/ -> markers of every test below it
MARKERS: dict[str, tuple[str, ...]] = {
    "ggmlpy/codegen_cuda": ("cuda_emu",),   # CUDA C compiled by g++ for the host emulator
    "ggmlpy/distributed": ("ray",),         # local Ray clusters
    "llama/server/ray": ("ray",),
    "ggmlpy/viz/test_browser.py": ("browser",),  # Debian's chromium through playwright
    "llama/server/test_chat_page.py": ("browser",),  # the chat page at / (also `model`: SmolLM2)
    "llama/models": ("model",),
}
SLOW = {"model", "browser", "ray", "cuda_emu"}
# fixtures that hand a test a real model file or llama.cpp's outputs for one
MODEL_FIXTURES = {"smollm2_path", "gemma3_path", "golden_dir"}


def pytest_configure(config: pytest.Config) -> None:
    for name, why in [("slow", "more than a moment: left out of the everyday tier (-m 'not slow')"),
                      ("model", "runs a real model file (SmolLM2-135M, Gemma 3 270M)"),
                      ("browser", "drives Debian's chromium through playwright"),
                      ("ray", "starts a local Ray cluster"),
                      ("cuda_emu", "compiles CUDA C for the host emulator")]:
        config.addinivalue_line("markers", f"{name}: {why}")


def markers_of(item: pytest.Item) -> set[str]:
    rel = Path(str(item.path)).relative_to(TESTS).as_posix()
    names = {m for prefix, marks in MARKERS.items()
             if rel == prefix or rel.startswith(prefix + "/") for m in marks}
    if isinstance(item, pytest.Function) and MODEL_FIXTURES & set(item.fixturenames):
        names.add("model")
    return names | ({"slow"} if names & SLOW else set())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in sorted(markers_of(item)):
            item.add_marker(name)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return resolve_model("gemma3-270m")


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    return GOLDEN
