"""get_rows on a table in the model file's memory map (mapped_rows.py): the rows a run looks
up are read with pread into private memory, so the map itself stays unmapped (read through
it, each row would map the 64 KiB around it), and that memory is handed back after the run."""
from __future__ import annotations

import mmap

import numpy as np
import pytest

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.mapped_rows import MappedRowLookups
from ggmlpy.gguf.file_map import FileMap
from ggmlpy.ir.ops import OpCase, SrcSpec
from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.store import TensorStore
from ggmlpy.testing.ops import build_case_graph, decode, make_inputs

K, ROWS, N_IDS = 256, 32768, 48          # a 4.5 MiB Q4_K table, 48 rows far apart
STRAY_KIB = 64
CASE = OpCase((SrcSpec(GGMLType.Q4_K, (K, ROWS, 1, 1), weight=True),
               SrcSpec(GGMLType.I32, (N_IDS,), fill=f"rows:{ROWS}")))


def _smaps_field(address: int, name: str) -> str:
    """A field of the mapping that holds `address` in /proc/self/smaps."""
    inside = False
    for line in open("/proc/self/smaps"):
        head, _, rest = line.partition(" ")
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == name + ":":
            return rest.strip()
    raise AssertionError("address not mapped")


def _rss_kib(address: int) -> int:
    """Resident KiB of the mapping that holds `address`."""
    return int(_smaps_field(address, "Rss").split()[0])


@pytest.fixture
def table(tmp_path):
    """The table in a file mapped for reading (just written, so in the page cache, as a
    model's file is on a warm start), its bytes, and the ids looked up."""
    inputs = make_inputs(CASE, np.random.default_rng(0))
    path = tmp_path / "table.bin"
    path.write_bytes(inputs["src0"].tobytes())
    with open(path, "rb") as f:
        fmap = FileMap.of(f.fileno(), path)
    mapped = np.frombuffer(fmap, np.uint8).reshape(inputs["src0"].shape)
    ids = np.arange(N_IDS, dtype=np.int32) * (ROWS // N_IDS) + 7
    return mapped, inputs["src0"], ids


def _run(mapped: np.ndarray, ids: np.ndarray):
    graph, node = build_case_graph("get_rows", CASE)
    split = CpuBackend(n_threads=2).compile(graph, graph.nodes)
    store = TensorStore({"src0": mapped, "src1": ids})
    split.run(store, {})
    return split, np.array(store.array(node, {}), copy=True).reshape(N_IDS, K)


def test_rows_are_read_from_the_file_not_the_map(table):
    mapped, raw, ids = table
    split, out = _run(mapped, ids)
    expected = decode(raw, GGMLType.Q4_K, (K, ROWS, 1, 1)).reshape(ROWS, K)[ids]
    np.testing.assert_array_equal(out, expected)
    # read through the map the 48 rows map 384 KiB to 3 MiB (test below); a stray page or
    # window from elsewhere in a long test session is allowed, not one per row
    assert _rss_kib(mapped.ctypes.data) <= STRAY_KIB, _rss_kib(mapped.ctypes.data)
    [copy] = split._row_lookups.tables.values()
    assert _rss_kib(copy.address) <= STRAY_KIB, _rss_kib(copy.address)   # handed back after the run
    # out of transparent huge pages (on a kernel where they are always on, a row would fault
    # in 2 MiB that MADV_DONTNEED of its own pages does not hand back)
    assert "nh" in _smaps_field(copy.address, "VmFlags").split()
    ids2 = ids[::-1] + 1                          # a second run reads its own rows
    store = TensorStore({"src0": mapped, "src1": ids2})
    split.run(store, {})
    out2 = np.array(store.array(split.nodes[-1], {}), copy=True).reshape(N_IDS, K)
    np.testing.assert_array_equal(out2, decode(raw, GGMLType.Q4_K, (K, ROWS, 1, 1)).reshape(ROWS, K)[ids2])


def test_read_through_the_map_each_row_maps_a_window(table, monkeypatch):
    """What the private copies avoid (the kernel maps up to 64 KiB around each row read
    through the map): the test above could fail."""
    mapped, raw, ids = table
    monkeypatch.setattr(MappedRowLookups, "of", classmethod(lambda cls, nodes, weights: cls({})))
    _, out = _run(mapped, ids)
    np.testing.assert_array_equal(out, decode(raw, GGMLType.Q4_K, (K, ROWS, 1, 1)).reshape(ROWS, K)[ids])
    rss_kib = _rss_kib(mapped.ctypes.data)
    if rss_kib <= 4 * N_IDS:
        pytest.skip(f"this kernel maps no fault-around window ({rss_kib} KiB for {N_IDS} rows)")
    assert rss_kib >= 8 * N_IDS


def test_other_maps_are_read_in_place():
    """A map that is not a model file's (here anonymous and private) is read as it is: the
    kernel reads the table itself, unchanged by the run."""
    case = OpCase((SrcSpec(GGMLType.Q4_K, (K, 64, 1, 1), weight=True),
                   SrcSpec(GGMLType.I32, (5,), fill="rows:64")))
    inputs = make_inputs(case, np.random.default_rng(1))
    anon = mmap.mmap(-1, inputs["src0"].nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    table = np.frombuffer(anon, np.uint8).reshape(inputs["src0"].shape)
    table[:] = inputs["src0"]
    graph, node = build_case_graph("get_rows", case)
    split = CpuBackend(n_threads=2).compile(graph, graph.nodes)
    store = TensorStore({"src0": table, "src1": inputs["src1"]})
    split.run(store, {})
    assert split._row_lookups.tables == {}
    expected = decode(inputs["src0"], GGMLType.Q4_K, (K, 64, 1, 1)).reshape(64, K)[inputs["src1"].ravel()]
    np.testing.assert_array_equal(np.array(store.array(node, {})).reshape(5, K), expected)
    np.testing.assert_array_equal(table, inputs["src0"])
