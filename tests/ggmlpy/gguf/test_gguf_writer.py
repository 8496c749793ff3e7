"""Round trips between our GGUF writer/reader and the official `gguf` package (the oracle).

Every value type is written by one side and read by the other, both ways; tensors of several
types, shapes and alignments likewise; and for content both writers can express, the files
must be byte-identical.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from ggmlpy.gguf import GGMLType, GGUFFile, GGUFValueType as T, StringArray
from ggmlpy.gguf.writer import GGUFWriter

UNICODE = "héllo, 世界 🦙 \"quoted\"\n\ttab"

# key, value type, value: one entry per scalar type (extremes of each integer range)
SCALARS = [
    ("s.u8", T.UINT8, 255), ("s.i8", T.INT8, -128), ("s.u16", T.UINT16, 65535),
    ("s.i16", T.INT16, -32768), ("s.u32", T.UINT32, 2**32 - 1), ("s.i32", T.INT32, -2**31),
    ("s.f32", T.FLOAT32, 0.1), ("s.true", T.BOOL, True), ("s.false", T.BOOL, False),
    ("s.str", T.STRING, UNICODE), ("s.empty_str", T.STRING, ""), ("s.u64", T.UINT64, 2**64 - 1),
    ("s.i64", T.INT64, -2**63), ("s.f64", T.FLOAT64, 0.1),
]
# key, element type, values: an array of every element type except ARRAY
ARRAYS = [
    ("a.u8", T.UINT8, [0, 1, 255]), ("a.i8", T.INT8, [-128, 0, 127]),
    ("a.u16", T.UINT16, [0, 65535]), ("a.i16", T.INT16, [-32768, 32767]),
    ("a.u32", T.UINT32, [0, 2**32 - 1, 7]), ("a.i32", T.INT32, [-2**31, 2**31 - 1]),
    ("a.f32", T.FLOAT32, [0.1, -2.5, 3e38]), ("a.bool", T.BOOL, [True, False, True]),
    ("a.str", T.STRING, ["a", "", UNICODE, "tok\u2581en"]), ("a.u64", T.UINT64, [2**64 - 1, 0]),
    ("a.i64", T.INT64, [-2**63, 2**63 - 1]), ("a.f64", T.FLOAT64, [0.1, -1e300]),
]
# nested arrays: what the gguf package can write (it types inner ints as INT32)
NESTED = [
    ("n.i32", T.INT32, [[1, 2, 3], [4], [-5, 6]]),
    ("n.str", T.STRING, [["a", "ü"], ["🦙"], ["x", "y", "z"]]),
]
assert {t for _, t, _ in SCALARS} | {T.ARRAY} == set(T)  # all 13 value types are covered
assert {t for _, t, _ in ARRAYS} == set(T) - {T.ARRAY}


def expected(vtype: T, value):
    """What a reader must return: floats rounded to float32 where the type is FLOAT32."""
    if vtype == T.FLOAT32:
        return float(np.float32(value))
    return value


def plain(value):
    """Our reader's value as plain Python (StringArray and numpy arrays to lists)."""
    if isinstance(value, StringArray):
        return value.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def our_inner(etype: T, values: list):
    """Nested items for our writer: typed numpy arrays carry their element type."""
    if etype == T.STRING:
        return values
    return np.array(values, dtype={T.INT32: np.int32}[etype])


def write_ours(path, alignment=32):
    w = GGUFWriter("llama", alignment=alignment)
    for key, vtype, value in SCALARS:
        w.add_key_value(key, value, vtype)
    for key, etype, values in ARRAYS:
        w.add_array(key, values, etype)
    for key, etype, values in NESTED:
        w.add_array(key, [our_inner(etype, v) for v in values], T.ARRAY)
    return w.write(path)


def write_gguf(path, alignment=32):
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment != 32:
        w.add_custom_alignment(alignment)
    for key, vtype, value in SCALARS:
        w.add_key_value(key, value, gguf.GGUFValueType(vtype))
    for key, etype, values in ARRAYS:
        w.add_key_value(key, values, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType(etype))
    for key, etype, values in NESTED:
        w.add_key_value(key, values, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.ARRAY)
    add_gguf_tensors(w, TENSORS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def check_gguf_reader_fields(reader: gguf.GGUFReader) -> None:
    fields = reader.fields
    for key, vtype, value in SCALARS:
        assert fields[key].types == [vtype], key
        assert fields[key].contents() == expected(vtype, value), key
    for key, etype, values in ARRAYS:
        assert fields[key].types == [T.ARRAY, etype], key
        assert fields[key].contents() == [expected(etype, v) for v in values], key
    for key, etype, values in NESTED:
        # gguf flattens nested arrays (its reader's FIXME); the element types must still agree
        assert fields[key].types == [T.ARRAY, T.ARRAY, etype], key
        assert fields[key].contents() == [v for inner in values for v in inner], key


def check_our_fields(f: GGUFFile) -> None:
    for key, vtype, value in SCALARS:
        assert f.fields[key].type == vtype, key
        got = f.metadata[key]
        assert got == expected(vtype, value) and type(got) is type(value), key
    for key, etype, values in ARRAYS:
        assert (f.fields[key].type, f.fields[key].element_type) == (T.ARRAY, etype), key
        assert plain(f.metadata[key]) == [expected(etype, v) for v in values], key
    for key, etype, values in NESTED:
        assert f.fields[key].element_type == T.ARRAY, key
        got = f.metadata[key]
        assert plain(got) == values, key
        if etype == T.INT32:
            assert all(inner.dtype == np.int32 for inner in got)
        else:
            assert all(isinstance(inner, StringArray) for inner in got)


def test_every_value_type_ours_to_gguf(tmp_path):
    path = write_ours(tmp_path / "ours.gguf")
    check_gguf_reader_fields(gguf.GGUFReader(path))


def test_every_value_type_gguf_to_ours(tmp_path):
    path = write_gguf(tmp_path / "theirs.gguf")
    with GGUFFile(path) as f:
        check_our_fields(f)


def test_every_value_type_ours_to_ours(tmp_path):
    path = write_ours(tmp_path / "ours.gguf")
    with GGUFFile(path) as f:
        check_our_fields(f)


def test_empty_and_deeply_nested_arrays(tmp_path):
    """Shapes the gguf writer refuses (it rejects empty arrays) but the format allows."""
    w = GGUFWriter("llama")
    w.add_array("e.str", [], T.STRING)
    w.add_array("e.f32", np.array([], dtype=np.float32))
    w.add_array("e.nested", [np.array([], dtype=np.uint16), np.array([7], dtype=np.uint16)], T.ARRAY)
    w.add_array("e.deep", [[np.array([1, 2], dtype=np.int64)], [np.array([3], dtype=np.int64)]], T.ARRAY)
    path = w.write(tmp_path / "empty.gguf")
    with GGUFFile(path) as f:
        assert f.fields["e.str"].element_type == T.STRING and len(f.metadata["e.str"]) == 0
        assert f.metadata["e.f32"].dtype == np.float32 and f.metadata["e.f32"].size == 0
        inner = f.metadata["e.nested"]
        assert [a.dtype for a in inner] == [np.uint16, np.uint16] and plain(inner) == [[], [7]]
        assert plain(f.metadata["e.deep"]) == [[[1, 2]], [[3]]]
    # the oracle agrees on the element types and counts of what it can represent
    r = gguf.GGUFReader(path)
    assert r.fields["e.str"].parts[3][0] == T.STRING and r.fields["e.str"].parts[4][0] == 0
    assert r.fields["e.f32"].parts[3][0] == T.FLOAT32 and r.fields["e.f32"].contents() == []
    assert r.fields["e.nested"].contents() == [7]
    assert r.fields["e.deep"].types == [T.ARRAY, T.ARRAY, T.ARRAY, T.INT64]
    assert r.fields["e.deep"].contents() == [1, 2, 3]


# ---------------------------------------------------------------------------------------
# tensors

RNG = np.random.default_rng(1234)
# name, ggml type, ne, raw array as each writer takes it
TENSORS = [
    ("f32.1d", GGMLType.F32, (7,), RNG.standard_normal(7).astype(np.float32)),
    ("f32.4d", GGMLType.F32, (3, 2, 2, 2), RNG.standard_normal((2, 2, 2, 3)).astype(np.float32)),
    ("f16.2d", GGMLType.F16, (5, 3), RNG.standard_normal((3, 5)).astype(np.float16)),
    ("bf16.3d", GGMLType.BF16, (4, 3, 2), RNG.integers(0, 1 << 16, (2, 3, 4), dtype=np.uint16)),
    ("q8_0.2d", GGMLType.Q8_0, (64, 3), RNG.integers(0, 256, (3, 68), dtype=np.uint8)),
    ("q8_0.4d", GGMLType.Q8_0, (32, 2, 1, 2), RNG.integers(0, 256, (2, 1, 2, 34), dtype=np.uint8)),
    ("i32.1d", GGMLType.I32, (5,), np.arange(-2, 3, dtype=np.int32)),
]


def add_our_tensors(w: GGUFWriter, tensors) -> None:
    for name, ttype, _ne, data in tensors:
        w.add_tensor(name, data, type=ttype)


def add_gguf_tensors(w: gguf.GGUFWriter, tensors) -> None:
    for name, ttype, _ne, data in tensors:
        plain_dtype = ttype in (GGMLType.F32, GGMLType.F16, GGMLType.I32)
        w.add_tensor(name, data, raw_dtype=None if plain_dtype else gguf.GGMLQuantizationType(ttype))


@pytest.mark.parametrize("alignment", [8, 32, 64])
def test_tensors_ours_to_gguf(tmp_path, alignment):
    w = GGUFWriter("llama", alignment=alignment)
    add_our_tensors(w, TENSORS)
    r = gguf.GGUFReader(w.write(tmp_path / "t.gguf"))
    assert r.alignment == alignment
    assert [t.name for t in r.tensors] == [name for name, *_ in TENSORS]
    for t, (name, ttype, ne, data) in zip(r.tensors, TENSORS):
        assert t.tensor_type == ttype, name
        assert t.shape.tolist() == list(ne), name
        assert t.data_offset % alignment == 0, name
        assert t.data.tobytes() == data.tobytes(), name


@pytest.mark.parametrize("alignment", [8, 32, 64])
def test_tensors_gguf_to_ours(tmp_path, alignment):
    path = write_gguf(tmp_path / "t.gguf", alignment)
    with GGUFFile(path) as f:
        assert f.alignment == alignment
        assert list(f.tensors) == [name for name, *_ in TENSORS]
        for name, ttype, ne, data in TENSORS:
            t = f.tensors[name]
            assert (t.type, t.ne, t.nbytes) == (ttype, ne, data.nbytes), name
            assert t.offset % alignment == 0 and t.data.dtype == np.uint8, name
            assert t.data.tobytes() == data.tobytes(), name
        check_our_fields(f)


@pytest.mark.parametrize("alignment", [32, 64])
def test_files_byte_identical_with_gguf_writer(tmp_path, alignment):
    """Both writers lay the file out the same way: header, key/values in insertion order,
    tensor infos, padding to the alignment, then every tensor padded to the alignment (the
    last one too). The content here avoids what only one of them can express: the gguf
    writer drops empty strings and arrays given to add_string/add_array and refuses empty
    arrays, and types the items of nested arrays from Python values (ints as INT32)."""
    ours = GGUFWriter("llama", alignment=alignment)
    for key, vtype, value in SCALARS:
        ours.add_key_value(key, value, vtype)
    for key, etype, values in ARRAYS:
        ours.add_array(key, values, etype)
    for key, etype, values in NESTED:
        ours.add_array(key, [our_inner(etype, v) for v in values], T.ARRAY)
    add_our_tensors(ours, TENSORS)
    ours_path = ours.write(tmp_path / "ours.gguf")
    theirs_path = write_gguf(tmp_path / "theirs.gguf", alignment)
    a, b = ours_path.read_bytes(), theirs_path.read_bytes()
    assert len(a) == len(b)
    assert a == b


def test_ours_rewrites_itself_byte_identical(tmp_path):
    """writer -> reader -> writer reproduces the file exactly: the reader loses nothing
    (declared types, key order, raw tensor bytes, invalid UTF-8 in string values)."""
    w = GGUFWriter("llama", alignment=64)
    for key, vtype, value in SCALARS:
        w.add_key_value(key, value, vtype)
    for key, etype, values in ARRAYS:
        w.add_array(key, values, etype)
    for key, etype, values in NESTED:
        w.add_array(key, [our_inner(etype, v) for v in values], T.ARRAY)
    w.add_string("s.bad_utf8", b"\xff\xfe ok".decode("utf-8", "surrogateescape"))
    add_our_tensors(w, TENSORS)
    first = w.write(tmp_path / "a.gguf")
    with GGUFFile(first) as f:
        assert f.metadata["s.bad_utf8"].encode("utf-8", "surrogateescape") == b"\xff\xfe ok"
        second = GGUFWriter.from_file(f).write(tmp_path / "b.gguf")
    assert first.read_bytes() == second.read_bytes()


@pytest.mark.parametrize("add, message", [
    (lambda w: w.add_key_value("k", 256, T.UINT8), "does not fit UINT8"),
    (lambda w: w.add_key_value("k", -1, T.UINT64), "does not fit UINT64"),
    (lambda w: w.add_key_value("k", 2, T.BOOL), "bool value must be"),
    (lambda w: w.add_array("k", [1, 2**31], T.INT32), r"do not fit INT32"),
    (lambda w: w.add_array("k", [0, 2], T.BOOL), "bool array values"),
    (lambda w: w.add_array("k", [1.5], T.UINT32), "non-integer"),
    (lambda w: w.add_array("k", []), "explicit element type"),
    (lambda w: w.add_key_value("general.alignment", 48, T.UINT32), "power of two"),
    (lambda w: w.add_key_value("general.architecture", "x"), "duplicate metadata key"),
    (lambda w: w.add_tensor("x" * 64, np.zeros(1, np.float32)), "longer than 63 bytes"),
    (lambda w: w.add_tensor("q", np.zeros((1, 33), np.uint8), type=GGMLType.Q8_0, ne=(31,)),
     "not a multiple of Q8_0's block size"),
    (lambda w: w.add_tensor("q", np.zeros(10, np.uint8), type=GGMLType.Q8_0, ne=(32,)),
     "needs 34"),
    (lambda w: w.add_tensor("t", np.zeros((1, 1, 1, 1, 1), np.float32)), "ggml allows 1..4"),
])
def test_writer_refuses_what_the_reader_would_reject(add, message):
    w = GGUFWriter("llama")
    with pytest.raises((ValueError, TypeError), match=message):
        add(w)


def test_writer_keeps_alignment_key_and_layout_in_step(tmp_path):
    w = GGUFWriter()
    w.add_key_value("general.alignment", 128, T.UINT32)
    w.add_tensor("a", np.ones(3, np.float32))
    w.add_tensor("b", np.ones(5, np.float32))
    with GGUFFile(w.write(tmp_path / "a.gguf")) as f:
        assert f.alignment == 128
        assert f.data_offset % 128 == 0
        assert f.tensors["b"].offset - f.tensors["a"].offset == 128
        assert f.file_size == f.tensors["b"].offset + 128  # the last tensor is padded too
