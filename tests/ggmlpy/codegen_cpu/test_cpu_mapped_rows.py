"""Row lookups in a weight read straight from a file mapping (mapped_rows.py): the rows are
right, and the 64 KiB windows the kernel maps around each read are unmapped after the run,
so the table's resident share does not grow with every token a context sees."""
from __future__ import annotations

import mmap

import numpy as np
import pytest

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.mapped_rows import MappedRowLookups
from ggmlpy.ir.ops import OpCase, SrcSpec
from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.store import TensorStore
from ggmlpy.testing.ops import build_case_graph, decode, make_inputs

K, ROWS, N_IDS = 256, 32768, 48          # a 4.5 MiB Q4_K table, 48 rows far apart


def _mapping_rss_kib(address: int) -> int:
    """Resident KiB of the mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "Rss:":
            return int(line.split()[1])
    raise AssertionError("address not mapped")


def _lookup(tmp_path, release: bool, monkeypatch) -> tuple[np.ndarray, np.ndarray, int]:
    """get_rows of N_IDS rows from a Q4_K table in a read-only file mapping (the file just
    written, so its pages are in the page cache, as a model's are on a warm start)."""
    if not release:
        monkeypatch.setattr(MappedRowLookups, "release", lambda self, store, env: None)
    case = OpCase((SrcSpec(GGMLType.Q4_K, (K, ROWS, 1, 1), weight=True),
                   SrcSpec(GGMLType.I32, (N_IDS,), fill=f"rows:{ROWS}")))
    inputs = make_inputs(case, np.random.default_rng(0))
    inputs["src1"] = (np.arange(N_IDS, dtype=np.int32) * (ROWS // N_IDS) + 7)
    path = tmp_path / "table.bin"
    path.write_bytes(inputs["src0"].tobytes())
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    table = np.frombuffer(mapped, np.uint8).reshape(inputs["src0"].shape)
    graph, node = build_case_graph("get_rows", case)
    store = TensorStore({"src0": table, "src1": inputs["src1"]})
    CpuBackend(n_threads=2).compile(graph, graph.nodes).run(store, {})
    out = np.array(store.array(node, {}), copy=True).reshape(N_IDS, K)
    expected = decode(inputs["src0"], GGMLType.Q4_K, (K, ROWS, 1, 1)).reshape(ROWS, K)[inputs["src1"]]
    return out, expected, _mapping_rss_kib(table.ctypes.data)


def test_looked_up_rows_are_right_and_unmapped(tmp_path, monkeypatch):
    out, expected, rss_kib = _lookup(tmp_path, True, monkeypatch)
    np.testing.assert_array_equal(out, expected)
    assert rss_kib <= 16, f"{rss_kib} KiB of the table still mapped"


def test_without_the_release_the_windows_stay_mapped(tmp_path, monkeypatch):
    """The effect the release undoes (each read maps up to a 64 KiB window): the test above
    could fail."""
    out, expected, rss_kib = _lookup(tmp_path, False, monkeypatch)
    np.testing.assert_array_equal(out, expected)
    if rss_kib <= 4 * N_IDS:
        pytest.skip(f"this kernel maps no fault-around window ({rss_kib} KiB for {N_IDS} rows)")
    assert rss_kib >= 8 * N_IDS


def test_anonymous_maps_are_left_alone():
    """A private anonymous map is writable: MADV_DONTNEED there would zero the table, so
    only a read-only (file) map is released; two runs on one read the same rows."""
    case = OpCase((SrcSpec(GGMLType.Q4_K, (K, 64, 1, 1), weight=True),
                   SrcSpec(GGMLType.I32, (5,), fill="rows:64")))
    inputs = make_inputs(case, np.random.default_rng(1))
    anon = mmap.mmap(-1, inputs["src0"].nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    table = np.frombuffer(anon, np.uint8).reshape(inputs["src0"].shape)
    table[:] = inputs["src0"]
    graph, node = build_case_graph("get_rows", case)
    split = CpuBackend(n_threads=2).compile(graph, graph.nodes)
    results = []
    for _ in range(2):
        store = TensorStore({"src0": table, "src1": inputs["src1"]})
        split.run(store, {})
        results.append(np.array(store.array(node, {}), copy=True))
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(table, inputs["src0"])
