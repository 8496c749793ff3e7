"""The reader on the two real models, against the `gguf` package's GGUFReader (the oracle),
plus the behaviour that makes it cheap: opening reads no tensor data, tensor data is a view
into the memory map, and closing releases the file."""
from __future__ import annotations

import gc
import json
import mmap
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from ggmlpy.gguf import GGMLType, GGUFFile, GGUFValueType as T, StringArray

MODELS = ["smollm2_path", "gemma3_path"]
MiB = 1 << 20


@pytest.fixture(scope="module", params=MODELS)
def pair(request):
    """(our file, the oracle's reader) for one real model; the oracle is slow, build it once."""
    path = request.getfixturevalue(request.param)
    ours = GGUFFile(path)
    yield ours, gguf.GGUFReader(path)
    ours.close()


def test_tensor_table_matches_gguf(pair):
    ours, theirs = pair
    assert [t.name for t in theirs.tensors] == list(ours.tensors)
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert mine.type == GGMLType(int(t.tensor_type)), t.name
        assert list(mine.ne) == t.shape.tolist(), t.name
        assert mine.offset == t.data_offset, t.name
        assert mine.nbytes == t.n_bytes == t.data.nbytes, t.name
        assert mine.n_elements == t.n_elements, t.name
    assert ours.data_offset == theirs.data_offset
    assert ours.alignment == theirs.alignment


def test_metadata_matches_gguf(pair):
    ours, theirs = pair
    fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == list(ours.metadata)
    assert ours.version == theirs.fields["GGUF.version"].contents() == 3
    for key, f in fields.items():
        mine = ours.fields[key]
        assert mine.type == f.types[0], key
        value = ours.metadata[key]
        if mine.type == T.ARRAY:
            assert mine.element_type == f.types[-1], key
            if isinstance(value, StringArray):
                assert value.tolist() == f.contents(), key
                assert value.lengths().tolist() == [len(f.parts[i]) for i in f.data], key
            else:
                expected = np.array(f.contents(), dtype=value.dtype)
                assert np.array_equal(value, expected), key
        else:
            assert value == f.contents(), key
            assert type(value) is {T.STRING: str, T.BOOL: bool, T.FLOAT32: float}.get(mine.type, int)


def test_tensor_data_matches_gguf(pair):
    ours, theirs = pair
    for t in theirs.tensors[:3] + theirs.tensors[-3:]:
        assert ours.tensors[t.name].data.tobytes() == t.data.tobytes(), t.name


def _mapping_of(a: np.ndarray):
    while isinstance(a, np.ndarray):
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_tensor_data_is_a_view_into_the_map(pair):
    ours, _ = pair
    tensors = list(ours.tensors.values())
    first = tensors[0].data
    base = _mapping_of(first)
    assert isinstance(base, mmap.mmap)
    for t in tensors:
        view = t.data
        assert view.dtype == np.uint8 and view.nbytes == t.nbytes
        assert not view.flags.owndata and not view.flags.writeable
        assert _mapping_of(view) is base  # one mapping for the whole file
        # the view sits at the tensor's file offset inside that mapping: no copy anywhere
        assert _address(view) - _address(first) == t.offset - tensors[0].offset
    assert np.shares_memory(tensors[0].data, ours.tensors[tensors[0].name].data)


_RSS_PROBE = r"""
import json, sys
import numpy as np
from ggmlpy.gguf import GGUFFile

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

before = rss()
f = GGUFFile(sys.argv[1])
opened = rss()
big = max(f.tensors.values(), key=lambda t: t.nbytes)
int(big.data.sum())  # now really read one tensor
touched = rss()
print(json.dumps({"open": opened - before, "touch": touched - opened, "big": big.nbytes}))
"""


@pytest.mark.parametrize("model", MODELS)
def test_open_reads_no_tensor_data(request, model):
    """RSS (anonymous and file-backed pages) barely grows at open; reading one tensor makes
    it grow by that tensor's size, which shows the probe would see tensor data being read."""
    path = request.getfixturevalue(model)
    done = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(path)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["open"] < 10 * MiB, got
    assert got["touch"] > 0.8 * got["big"], got


def _maps(path) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(str(path)))


def _fds(path) -> int:
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if os.path.realpath(f"/proc/self/fd/{fd}") == str(path))


def test_context_manager_closes(smollm2_path):
    """Counted relative to before the open: the oracle in other tests may hold the same file."""
    path = os.path.realpath(smollm2_path)
    gc.collect()
    fds, maps = _fds(path), _maps(path)
    with GGUFFile(path) as f:
        info = next(iter(f.tensors.values()))
        kept = info.data
        assert _fds(path) == fds + 1 and _maps(path) == maps + 1  # one descriptor, one mapping
    with pytest.raises(ValueError, match="closed"):
        info.data  # the closed file hands out no new views
    with open(path, "rb") as raw:  # a view taken before the close stays valid
        raw.seek(info.offset)
        assert kept[:64].tobytes() == raw.read(64)
    del kept
    f.close()  # closing twice is harmless
    del f, info
    gc.collect()
    assert (_fds(path), _maps(path)) == (fds, maps)  # nothing left open or mapped


def test_close_releases_the_mapping_at_once_without_views(smollm2_path):
    path = os.path.realpath(smollm2_path)
    gc.collect()
    fds, maps = _fds(path), _maps(path)
    f = GGUFFile(path)
    for key in [k for k, fl in f.fields.items() if fl.type == T.ARRAY]:
        del f.metadata[key], f.fields[key]  # drop the metadata views into the map
    f.close()
    assert (_fds(path), _maps(path)) == (fds, maps)
