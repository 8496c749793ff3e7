"""`ggmlpy quantize` writes llama-quantize's bytes: every case of cases.py run through the CLI
and compared, by sha256, with what the llama.cpp of llama-cpp-python 0.3.36 wrote
(data/llama_quantize.json, made by tests/tools/quantize_vectors.py): the same files, by name
(--keep-split writes several), with the same bytes. Where llama-quantize refused, ggmlpy must
refuse for the same reason.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ggmlpy.cli import main
from tests.llama.quantize.cases import (
    CASES, DATA, FILES, SPLIT_FILES, case_id, expected_outputs, sha256, write_file, write_imatrix, write_split_file,
    written,
)

VECTORS = json.loads(DATA.read_text())
# llama-quantize's error -> what ggmlpy's error says
SAME_REASON = {
    "this quantization requires an imatrix!": "requires an importance matrix",
    "no tensor type fallback is defined for type q1_0": "no tensor type fallback is defined for type q1_0",
    "requantizing from type q8_0 is disabled": "requantizing from type q8_0 is disabled",
    "Missing importance matrix for tensor blk.0.attn_output.weight in a very low-bit quantization":
        "missing importance matrix for tensor blk.0.attn_output.weight in a very low-bit quantization",
}
# mixes whose numpy searches take seconds on the 256-wide files (IQ3_S's grid, IQ4's 15 trial
# scales): `slow` there, in the everyday tier on qwen2-odd, whose rows fall back or are few
SLOW_MIXES = {"IQ3_S", "IQ3_M", "IQ4_NL", "IQ4_XS"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("quantize")
    for name in FILES:
        assert sha256(write_file(name, folder)) == VECTORS["files"][name], f"{name} is not the file llama.cpp saw"
    for name in SPLIT_FILES:
        for part in write_split_file(name, folder):
            assert sha256(part) == VECTORS["files"][part.stem], f"{part.name} is not the file llama.cpp saw"
    assert sha256(write_imatrix(folder)) == VECTORS["imatrix"]
    assert sha256(write_imatrix(folder, dense=True)) == VECTORS["imatrix_dense"]
    return folder


def _param(file: str, options: list[str], mix: str):
    marks = [pytest.mark.slow] if mix in SLOW_MIXES and file != "qwen2-odd" else []
    return pytest.param(file, options, mix, id=case_id(file, options, mix), marks=marks)


@pytest.mark.parametrize("file,options,mix", [_param(*c) for c in CASES])
def test_same_bytes_as_llama_quantize(inputs, monkeypatch, capsys, file, options, mix):
    monkeypatch.chdir(inputs)   # the imatrix path is recorded as given, relative here as there
    key = case_id(file, options, mix)
    expected = VECTORS["cases"][key]
    out = inputs / f"out-{abs(hash(key))}"   # a folder of its own: only this case's files (temporaries too)
    out.mkdir()
    rc = main(["quantize", "--no-progress", *options, f"{file}.gguf", str(out / "out.gguf"), mix, "2"])
    err = capsys.readouterr().err
    if "error" in expected:
        assert rc == 1, f"llama-quantize refused ({expected['error']}), ggmlpy did not"
        assert SAME_REASON[expected["error"]] in err
        assert written(out) == {}
    else:
        assert rc == 0, err
        assert written(out) == expected_outputs(expected)
    shutil.rmtree(out)


def test_worker_processes_write_the_same_bytes(inputs, monkeypatch, tmp_path):
    """The multi-process path (NTHREADS > 1 on a model with enough to convert) keeps the
    file order: the same bytes as the one-process path and llama-quantize."""
    from llama.quantize import driver
    monkeypatch.setattr(driver, "PARALLEL_ELEMENTS", 0)
    monkeypatch.setattr(driver, "WORK_ELEMENTS", 1 << 14)   # many units in flight
    out = tmp_path / "out.gguf"
    driver.quantize_file(inputs / "qwen3moe-256.gguf", out, "Q4_K_M", nthread=2, progress=False)
    assert sha256(out) == VECTORS["cases"][case_id("qwen3moe-256", [], "Q4_K_M")]["sha256"]
