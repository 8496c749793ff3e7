"""Importance matrices as llama-quantize reads them: llama-imatrix's GGUF files (sums divided by
each expert's count, 1 where an expert saw no token) and the legacy .dat files (sums divided
by ncall), --include-weights / --exclude-weights, and the files it rejects."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from ggmlpy.gguf import GGUFValueType
from ggmlpy.gguf.writer import GGUFWriter
from llama.quantize import load_imatrix
from tests.llama.quantize.cases import write_imatrix


def legacy(path, entries: dict[str, tuple[int, list[float]]], tail: bytes = b"") -> None:
    raw = struct.pack("<i", len(entries))
    for name, (ncall, sums) in entries.items():
        raw += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, len(sums))
        raw += np.asarray(sums, "<f4").tobytes()
    path.write_bytes(raw + tail)


def test_legacy_file(tmp_path):
    p = tmp_path / "imatrix.dat"
    legacy(p, {"blk.0.attn_q.weight": (4, [4.0, 8.0]), "blk.0.ffn_up.weight": (0, [3.0, 1.0])},
           struct.pack("<ii", 12, 5) + b"wiki!")
    im = load_imatrix(p)
    np.testing.assert_array_equal(im.data["blk.0.attn_q.weight"], [1.0, 2.0])
    np.testing.assert_array_equal(im.data["blk.0.ffn_up.weight"], [3.0, 1.0])   # ncall 0: as stored
    assert im.chunk_count == 12 and im.datasets == ["wiki!"]


def test_gguf_file_normalised_per_expert(tmp_path):
    w = GGUFWriter()
    w.add_array("imatrix.datasets", ["a.txt"], GGUFValueType.STRING)
    w.add_uint32("imatrix.chunk_count", 2)
    w.add_uint32("imatrix.chunk_size", 512)
    w.add_tensor("blk.0.ffn_up_exps.weight.in_sum2", np.array([[2, 4], [6, 8]], np.float32))
    w.add_tensor("blk.0.ffn_up_exps.weight.counts", np.array([[2], [0]], np.float32))
    im = load_imatrix(w.write(tmp_path / "m.gguf"))
    np.testing.assert_array_equal(im.data["blk.0.ffn_up_exps.weight"], [1, 2, 1, 1])
    assert im.datasets == ["a.txt"] and im.chunk_count == 2


def test_include_and_exclude(tmp_path):
    path = write_imatrix(tmp_path)
    assert set(load_imatrix(path, include=["blk.3.attn_v"]).data) == {"blk.3.attn_v.weight"}
    assert "output.weight" in load_imatrix(path, exclude=["blk."]).data
    assert len(load_imatrix(path, exclude=["blk."]).data) == 1


def test_rejected_files(tmp_path):
    w = GGUFWriter()
    w.add_tensor("x.in_sum2", np.ones(4, np.float32))
    w.add_tensor("x.counts", np.ones(1, np.float32))
    with pytest.raises(ValueError, match="missing imatrix metadata"):
        load_imatrix(w.write(tmp_path / "nometa.gguf"))
    p = tmp_path / "nan.dat"
    legacy(p, {"blk.0.attn_q.weight": (1, [1.0, float("nan")])})
    with pytest.raises(ValueError, match="non-finite value"):
        load_imatrix(p)
    (tmp_path / "empty.dat").write_bytes(struct.pack("<i", 0))
    with pytest.raises(ValueError, match="no data in file"):
        load_imatrix(tmp_path / "empty.dat")
    with pytest.raises(FileNotFoundError, match="missing.dat"):
        load_imatrix(tmp_path / "missing.dat")
