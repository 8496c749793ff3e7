"""Split models: NAME-0000i-of-0000N.gguf parts opened from the first one as a single model."""
from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest

from ggmlpy.gguf import GGMLType, GGUFError, GGUFFile, GGUFValueType as T, split_path
from ggmlpy.gguf.writer import GGUFWriter

RNG = np.random.default_rng(3)
TENSORS = {  # name -> (data as the writer takes it, ggml type)
    "token_embd.weight": (RNG.integers(0, 256, (4, 68), dtype=np.uint8), GGMLType.Q8_0),
    "blk.0.attn_norm.weight": (RNG.standard_normal(64).astype(np.float32), GGMLType.F32),
    "blk.0.attn_q.weight": (RNG.standard_normal((3, 64)).astype(np.float16), GGMLType.F16),
    "blk.1.attn_norm.weight": (RNG.standard_normal(64).astype(np.float32), GGMLType.F32),
    "blk.1.attn_q.weight": (RNG.standard_normal((3, 64)).astype(np.float16), GGMLType.F16),
    "output_norm.weight": (RNG.standard_normal(64).astype(np.float32), GGMLType.F32),
    "output.weight": (RNG.integers(0, 256, (2, 34), dtype=np.uint8), GGMLType.Q8_0),
}
NAMES = list(TENSORS)


def model_writer(names=NAMES) -> GGUFWriter:
    w = GGUFWriter("llama")
    w.add_uint32("llama.block_count", 2)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ab"])
    for name in names:
        data, ttype = TENSORS[name]
        w.add_tensor(name, data, type=ttype)
    return w


def write_part(path, no: int | None, count, total: int, names) -> None:
    """One hand-made part, for the broken cases."""
    w = GGUFWriter()
    if no is not None:
        w.add_key_value("split.no", no, T.UINT16)
    w.add_key_value("split.count", count, T.STRING if isinstance(count, str) else T.UINT16)
    w.add_key_value("split.tensors.count", total, T.INT32)
    for name in names:
        data, ttype = TENSORS[name]
        w.add_tensor(name, data, type=ttype)
    w.write(path)


@pytest.fixture
def parts(tmp_path):
    return model_writer().write_split(tmp_path / "model", 3)


def test_split_names_and_keys(parts, tmp_path):
    assert [p.name for p in parts] == [f"model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert split_path(tmp_path / "model", 1, 3) == parts[1]
    for i, path in enumerate(parts):  # the oracle reads each part's split keys with llama.cpp's types
        fields = gguf.GGUFReader(path).fields
        assert fields["split.no"].types == [T.UINT16] and fields["split.no"].contents() == i
        assert fields["split.count"].types == [T.UINT16] and fields["split.count"].contents() == 3
        assert fields["split.tensors.count"].types == [T.INT32]
        assert fields["split.tensors.count"].contents() == len(TENSORS)
        assert ("llama.block_count" in fields) == (i == 0)  # metadata lives in the first part


def test_all_tensors_in_one_map(parts):
    with GGUFFile(parts[0]) as f:
        assert f.paths == parts
        assert list(f.tensors) == NAMES
        assert f.metadata["llama.block_count"] == 2
        assert f.metadata["tokenizer.ggml.tokens"].tolist() == ["a", "b", "ab"]
        assert [t.file_index for t in f.tensors.values()] == [0, 0, 0, 1, 1, 2, 2]
        assert f.file_size == sum(p.stat().st_size for p in parts)
        for name, (data, ttype) in TENSORS.items():
            t = f.tensors[name]
            assert t.type == ttype
            assert t.data.tobytes() == data.tobytes(), name
            # the offset is within the tensor's own part
            raw = parts[t.file_index].read_bytes()
            assert raw[t.offset:t.offset + t.nbytes] == data.tobytes(), name


def test_reads_split_models_written_by_the_gguf_package(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "theirs.gguf"), "llama", split_max_tensors=3)
    w.add_uint32("llama.block_count", 2)
    for name, (data, ttype) in TENSORS.items():
        raw_dtype = None if ttype in (GGMLType.F32, GGMLType.F16) else gguf.GGMLQuantizationType(ttype)
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(tmp_path / "theirs-00001-of-00003.gguf") as f:
        assert len(f.paths) == 3 and list(f.tensors) == NAMES
        assert [t.file_index for t in f.tensors.values()] == [0, 0, 0, 1, 1, 1, 2]
        for name, (data, _) in TENSORS.items():
            assert f.tensors[name].data.tobytes() == data.tobytes(), name


def test_missing_part(parts):
    parts[2].unlink()
    with pytest.raises(GGUFError, match=r"split part 3 of 3 is missing: .*model-00003-of-00003.gguf") as e:
        GGUFFile(parts[0])
    assert e.value.path == str(parts[0])


@pytest.mark.parametrize("no, count, pattern", [
    (2, 3, r"expected split.no=1 and split.count=3, found 2 and 3"),
    (1, 4, r"expected split.no=1 and split.count=3, found 1 and 4"),
    (None, 3, r"expected split.no=1 and split.count=3, found None and 3"),
])
def test_inconsistent_split_keys(parts, no, count, pattern):
    write_part(parts[1], no, count, len(TENSORS), NAMES[3:5])
    with pytest.raises(GGUFError, match=r"inconsistent split part: " + pattern) as e:
        GGUFFile(parts[0])
    assert e.value.path == str(parts[1])


def test_split_count_of_the_wrong_type(tmp_path):
    first = tmp_path / "m-00001-of-00002.gguf"
    write_part(first, 0, "2", 1, NAMES[:1])
    with pytest.raises(GGUFError, match=r"split.count must be an integer, not STRING"):
        GGUFFile(first)


def test_tensor_count_disagrees(parts):
    write_part(parts[2], 2, 3, len(TENSORS), NAMES[5:6])  # one tensor fewer than announced
    with pytest.raises(GGUFError, match=r"split.tensors.count is 7 but the parts hold 6 tensors"):
        GGUFFile(parts[0])


def test_duplicate_tensor_across_parts(parts):
    write_part(parts[2], 2, 3, len(TENSORS), [NAMES[5], NAMES[0]])  # token_embd again
    with pytest.raises(GGUFError, match=r"tensor 'token_embd.weight' appears in more than one split part") as e:
        GGUFFile(parts[0])
    assert e.value.path == str(parts[2])


def test_opening_a_later_part_directly(parts):
    with pytest.raises(GGUFError, match=r"this is split part 2 of 3; open the first part"):
        GGUFFile(parts[1])


def test_first_part_under_another_name(parts, tmp_path):
    renamed = tmp_path / "model.gguf"
    shutil.copy(parts[0], renamed)
    with pytest.raises(GGUFError, match=r"split.count is 3 but the file name does not follow "
                                        r"NAME-00001-of-00003.gguf"):
        GGUFFile(renamed)


def test_malformed_later_part_is_named(parts):
    parts[1].write_bytes(parts[1].read_bytes()[:40])
    with pytest.raises(GGUFError, match=r"truncated|impossible") as e:
        GGUFFile(parts[0])
    assert e.value.path == str(parts[1])


def test_single_part_split_is_a_plain_file(tmp_path):
    (path,) = model_writer().write_split(tmp_path / "one", 1)
    assert path.name == "one-00001-of-00001.gguf"
    with GGUFFile(path) as f:
        assert list(f.tensors) == NAMES and f.paths == [path]
