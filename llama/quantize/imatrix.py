"""Importance matrices as llama-quantize reads them (common_imatrix_load, prepare_imatrix).

Two formats: llama-imatrix's GGUF files (per tensor `NAME.in_sum2`, F32 sums of squared
activations, and `NAME.counts`, one F32 count per expert; metadata imatrix.datasets,
imatrix.chunk_count and imatrix.chunk_size) and the legacy binary `.dat` files. Either way the
result is, per tensor name, the mean squared activation of each input column (per expert,
experts one after another), which is what ggml's quantize_* take as `quant_weights`.

The driver uses it to choose types, as llama-quantize does, and hands each tensor's values
to its encoder (ggmlpy.quants.quantize(..., imatrix=...)). `write_imatrix` writes the GGUF
form (the test inputs and the benchmarks' synthetic matrices).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggmlpy.gguf import GGMLType, GGUFError, GGUFFile, GGUFValueType


@dataclass
class Imatrix:
    """Per tensor name the normalised importance (float32), and the file's provenance."""

    path: str
    data: dict[str, np.ndarray]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0


def _read_legacy(path: str) -> Imatrix:
    """common_imatrix_load_legacy: n_entries, then per entry name, ncall, nval and the sums
    (already means times ncall), then optionally the chunk count and a dataset name."""
    raw = open(path, "rb").read()
    pos = 0

    def take(fmt: str, what: str) -> tuple:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(raw):
            raise ValueError(f"imatrix {path}: truncated while reading {what}")
        out = struct.unpack_from(fmt, raw, pos)
        pos += size
        return out

    (n_entries,) = take("<i", "the entry count")
    if n_entries < 1:
        raise ValueError(f"imatrix {path}: no data in file")
    data: dict[str, np.ndarray] = {}
    for i in range(n_entries):
        (length,) = take("<i", f"the name length of entry {i + 1}")
        if length < 0 or pos + length > len(raw):
            raise ValueError(f"imatrix {path}: failed reading name for entry {i + 1}")
        name = raw[pos:pos + length].split(b"\0")[0].decode("utf-8", "surrogateescape")
        pos += length
        ncall, nval = take("<ii", f"the counts of entry {i + 1}")
        if nval < 1:
            raise ValueError(f"imatrix {path}: failed reading number of values for entry {i}")
        sums = np.frombuffer(raw, "<f4", nval, pos) if pos + 4 * nval <= len(raw) else None
        if sums is None:
            raise ValueError(f"imatrix {path}: failed reading data for entry {i}")
        pos += 4 * nval
        data[name] = (sums / np.float32(ncall) if ncall > 0 else sums).astype(np.float32)
    result = Imatrix(path, data)
    if pos + 4 <= len(raw):
        (result.chunk_count,) = take("<i", "the chunk count")
        if pos + 4 <= len(raw):
            (length,) = take("<i", "the dataset name length")
            if length > 0 and pos + length <= len(raw):
                result.datasets.append(raw[pos:pos + length].split(b"\0")[0].decode("utf-8", "replace"))
    return result


def _read_gguf(path: str, f: GGUFFile) -> Imatrix:
    """common_imatrix_load + load_imatrix's normalisation: sums / count per expert, 1 where
    an expert was never routed to."""
    if not f.tensors:
        raise ValueError(f"imatrix {path}: no data in file")
    keys = ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")
    if not all(k in f.fields for k in keys):
        raise ValueError(f"imatrix {path}: missing imatrix metadata ({', '.join(keys)})")
    ds = f.fields["imatrix.datasets"]
    datasets = [str(s) for s in ds.value] if (ds.type == GGUFValueType.ARRAY
                                              and ds.element_type == GGUFValueType.STRING) else []
    pairs: dict[str, list] = {}
    for name, info in f.tensors.items():
        for suffix, slot in ((".in_sum2", 0), (".counts", 1)):
            if name.endswith(suffix) and len(name) > len(suffix):
                pairs.setdefault(name[:-len(suffix)], [None, None])[slot] = info
    data: dict[str, np.ndarray] = {}
    for name, (sums, counts) in sorted(pairs.items()):
        if sums is None or counts is None:
            raise ValueError(f"imatrix {path}: mismatched sums and counts for {name}")
        if sums.type != GGMLType.F32 or counts.type != GGMLType.F32:
            raise ValueError(f"imatrix {path}: sums and counts for {name} must be F32")
        s = sums.data.view("<f4").astype(np.float32)
        c = np.rint(counts.data.view("<f4").astype(np.float64)).astype(np.float32)   # std::lround
        if len(c) == 0 or len(s) % len(c):
            raise ValueError(f"imatrix {path}: {name} has {len(s)} sums for {len(c)} counts")
        per = s.reshape(len(c), -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            norm = np.where(c[:, None] > 0, per / c[:, None], np.float32(1.0)).astype(np.float32)
        data[name] = norm.reshape(-1)
    return Imatrix(path, data, datasets, int(f.metadata.get("imatrix.chunk_count", 0)))


def load_imatrix(path: str | os.PathLike, include: list[str] | None = None,
                 exclude: list[str] | None = None) -> Imatrix:
    """Read an importance matrix (GGUF or legacy) and apply --include-weights (keep only names
    containing one of them) or --exclude-weights (drop names containing any of them)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"imatrix {path}: no such file")
    try:
        with GGUFFile(path) as f:
            result = _read_gguf(path, f)
    except GGUFError:
        result = _read_legacy(path)
    if exclude:
        result.data = {k: v for k, v in result.data.items() if not any(s in k for s in exclude)}
    if include:
        result.data = {k: v for k, v in result.data.items() if any(s in k for s in include)}
    for name, values in result.data.items():
        if not np.isfinite(values).all():
            bad = values[~np.isfinite(values)][0]
            raise ValueError(f"imatrix {path}: {name} contains non-finite value {bad}")
    return result


def write_imatrix(path: str | os.PathLike, sums: dict[str, tuple[np.ndarray, np.ndarray]],
                  datasets: list[str], chunk_count: int, chunk_size: int) -> Path:
    """llama-imatrix's GGUF file: per tensor name its in_sum2 (matrices x ne0, F32) and counts
    (matrices x 1, F32), as _read_gguf reads them."""
    from ggmlpy.gguf.writer import GGUFWriter

    w = GGUFWriter()
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", list(datasets), GGUFValueType.STRING)
    w.add_uint32("imatrix.chunk_count", chunk_count)
    w.add_uint32("imatrix.chunk_size", chunk_size)
    for name, (in_sum2, counts) in sums.items():
        w.add_tensor(f"{name}.in_sum2", np.asarray(in_sum2, dtype=np.float32))
        w.add_tensor(f"{name}.counts", np.asarray(counts, dtype=np.float32).reshape(-1, 1))
    return w.write(path)
