"""A corpus of malformed GGUF files, one case per validation rule of the reader.

Each file is built byte by byte here (the writer refuses to make them), and each case asserts
the specific `GGUFError`: its message and, where the rule points at a field, the byte offset
of that field.
"""
from __future__ import annotations

import re
import struct

import pytest

from ggmlpy.gguf import GGUFError, GGUFFile

HEADER = 24  # magic, version, tensor count, metadata count
T_U8, T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY, T_U64 = 0, 4, 5, 6, 7, 8, 9, 10
F32, Q8_0, Q4_K = 0, 8, 12


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def i64(v: int) -> bytes:
    return struct.pack("<q", v)


def gstr(raw: bytes | str) -> bytes:
    raw = raw.encode() if isinstance(raw, str) else raw
    return u64(len(raw)) + raw


def kv(key: bytes | str, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + u32(vtype) + payload


def tensor(name: bytes | str, ne: tuple[int, ...], ttype: int = F32, offset: int = 0,
           n_dims: int | None = None) -> bytes:
    return (gstr(name) + u32(len(ne) if n_dims is None else n_dims) + b"".join(i64(n) for n in ne)
            + u32(ttype) + u64(offset))


def gguf_bytes(kvs=(), tensors=(), data=b"", *, magic=b"GGUF", version=3, n_tensors=None,
               n_kv=None, alignment=32) -> bytes:
    head = (magic + u32(version) + u64(len(tensors) if n_tensors is None else n_tensors)
            + u64(len(kvs) if n_kv is None else n_kv))
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % alignment) + data


def kv_value_at(key: str) -> int:
    """Offset of the value of a file's first key/value."""
    return HEADER + 8 + len(key) + 4


def tensor_field_at(kvs_len: int, name: str, n_dims: int, field: str) -> int:
    """Offset of a field of the first tensor info, after `kvs_len` bytes of key/values."""
    at = HEADER + kvs_len + 8 + len(name)
    return {"n_dims": at, "type": at + 4 + 8 * n_dims, "offset": at + 8 + 8 * n_dims}[field]


def rejects(tmp_path, raw: bytes, pattern: str, offset: int | None = None) -> GGUFError:
    path = tmp_path / "bad.gguf"
    path.write_bytes(raw)
    with pytest.raises(GGUFError) as info:
        GGUFFile(path)
    err = info.value
    assert re.search(pattern, err.reason), f"{err.reason!r} does not match {pattern!r}"
    assert err.path == str(path)
    if offset is not None:
        assert err.offset == offset, err
    return err


def opens(tmp_path, raw: bytes) -> GGUFFile:
    path = tmp_path / "ok.gguf"
    path.write_bytes(raw)
    return GGUFFile(path)


DATA32 = bytes(range(32))  # the data of an 8-element F32 tensor, exactly one alignment unit


def valid_file() -> bytes:
    """Small and valid; the tensor data ends the file, so every shorter prefix is invalid."""
    return gguf_bytes(
        [kv("general.architecture", T_STRING, gstr("llama")),
         kv("tokens", T_ARRAY, u32(T_STRING) + u64(3) + gstr("a") + gstr("bc") + gstr("")),
         kv("ids", T_ARRAY, u32(T_I32) + u64(2) + i64(-1)),
         kv("flag", T_BOOL, b"\x01")],
        [tensor("w", (8,), F32, 0)], DATA32)


def test_valid_file_opens(tmp_path):
    """The corpus's builder makes files the reader accepts, so each rejection below is due to
    the one thing the case breaks."""
    with opens(tmp_path, valid_file()) as f:
        assert f.metadata["tokens"].tolist() == ["a", "bc", ""]
        assert f.metadata["ids"].tolist() == [-1, -1]
        assert f.tensors["w"].data.tobytes() == DATA32
    with opens(tmp_path, gguf_bytes([kv("general.alignment", T_U32, u32(64))],
                                    [tensor("n" * 63, (8,), F32, 0)], DATA32, alignment=64)) as f:
        assert f.alignment == 64 and f.tensors["n" * 63].nbytes == 32


def test_empty_file(tmp_path):
    rejects(tmp_path, b"", r"^empty file", 0)


@pytest.mark.parametrize("magic", [b"GGML", b"FUGG", b"\0\0\0\0", b"gguf"])
def test_bad_magic(tmp_path, magic):
    rejects(tmp_path, gguf_bytes(magic=magic), r"^bad magic .*not a GGUF file", 0)


@pytest.mark.parametrize("version, pattern", [
    (1, r"unsupported GGUF version 1 "), (4, r"unsupported GGUF version 4 "),
    (0, r"unsupported GGUF version 0 "), (0x03000000, r"big-endian GGUF files are not supported"),
])
def test_unsupported_version(tmp_path, version, pattern):
    rejects(tmp_path, gguf_bytes(version=version), pattern, 4)


@pytest.mark.parametrize("length", range(len(valid_file())))
def test_truncation_anywhere(tmp_path, length):
    """Whichever rule notices first (a field that runs past the end, a count the remaining
    bytes cannot hold, tensor data outside the file), it is a GGUFError at an offset inside
    what is left of the file."""
    err = rejects(tmp_path, valid_file()[:length], r"^(empty file|truncated file|tensor count|"
                                                   r"metadata count|array .* claims|string \d+ of|tensor w data)")
    assert err.offset is not None and 0 <= err.offset <= length


LENGTH_CASES = [
    ("key over the cap", u64(1 << 63), r"metadata key is \d+ bytes long, more than the cap of 65536",
     HEADER),
    ("key past the end", u64(100) + b"abc", r"truncated file: metadata key needs 100 bytes",
     HEADER + 8),
    ("string value", gstr("k") + u32(T_STRING) + u64(2**64 - 1),
     r"truncated file: string value of k needs 18446744073709551615 bytes", kv_value_at("k") + 8),
    ("u32 array", gstr("k") + u32(T_ARRAY) + u32(T_U32) + u64(1 << 62),
     r"array k claims 4611686018427387904 elements of UINT32, which cannot fit", kv_value_at("k") + 4),
    ("string array count", gstr("k") + u32(T_ARRAY) + u32(T_STRING) + u64(1 << 40),
     r"array k claims 1099511627776 strings, which cannot fit", kv_value_at("k") + 4),
    ("string element near 2**64", gstr("k") + u32(T_ARRAY) + u32(T_STRING) + u64(3) + gstr("a")
     + u64(2**64 - 1) + gstr("b") + b"\0" * 16,
     r"string 1 of array k runs past the end", kv_value_at("k") + 12),
    ("string element past the end", gstr("k") + u32(T_ARRAY) + u32(T_STRING) + u64(2) + gstr("a")
     + u64(1000) + b"\0" * 32, r"string 1 of array k runs past the end", kv_value_at("k") + 12),
    ("nested array count", gstr("k") + u32(T_ARRAY) + u32(T_ARRAY) + u64(1 << 50),
     r"array k claims 1125899906842624 nested arrays, which cannot fit", kv_value_at("k") + 4),
    ("nesting depth", gstr("k") + u32(T_ARRAY) + (u32(T_ARRAY) + u64(1)) * 9 + u32(T_U8) + u64(0),
     r"array k is nested deeper than 8 levels", None),
]


@pytest.mark.parametrize("name, raw, pattern, offset", LENGTH_CASES, ids=[c[0] for c in LENGTH_CASES])
def test_lengths_that_cannot_fit_or_exceed_caps(tmp_path, name, raw, pattern, offset):
    rejects(tmp_path, gguf_bytes([raw + b"\0" * 64]), pattern, offset)


@pytest.mark.parametrize("field, count, pattern, offset", [
    ("tensors", 1 << 40, r"tensor count 1099511627776 is impossible for a file of \d+ bytes", 8),
    ("tensors", 2**64 - 1, r"tensor count \d+ is impossible", 8),
    ("metadata", 1 << 40, r"metadata count 1099511627776 is impossible for a file of \d+ bytes", 16),
])
def test_counts_that_cannot_fit(tmp_path, field, count, pattern, offset):
    raw = gguf_bytes(n_tensors=count) if field == "tensors" else gguf_bytes(n_kv=count)
    rejects(tmp_path, raw + b"\0" * 100, pattern, offset)


def test_tensor_name_too_long(tmp_path):
    raw = gguf_bytes([], [tensor("n" * 64, (8,), F32, 0)], DATA32)
    rejects(tmp_path, raw, r"name of tensor 0 is 64 bytes long, more than the cap of 63", HEADER)


@pytest.mark.parametrize("where, raw_type", [("value", 13), ("value", 2**32 - 1),
                                             ("element", 13), ("element", 1000)])
def test_unknown_value_or_element_type(tmp_path, where, raw_type):
    if where == "value":
        entry = kv("k", raw_type, b"\0" * 8)
        pattern, at = rf"type of k has unknown value type {raw_type}", HEADER + 9
    else:
        entry = kv("k", T_ARRAY, u32(raw_type) + u64(0))
        pattern, at = rf"element type of array k has unknown value type {raw_type}", kv_value_at("k")
    rejects(tmp_path, gguf_bytes([entry]), pattern, at)


@pytest.mark.parametrize("raw_type, pattern", [
    (4, r"Q4_2 \(removed from ggml\)"), (5, r"Q4_3 \(removed from ggml\)"),
    (31, r"Q4_0_4_4 \(removed from ggml\)"), (33, r"Q4_0_8_8 \(removed from ggml\)"),
    (37, r"IQ4_NL_4_8 \(removed from ggml\)"), (43, r"unknown type 43"),
    (2**32 - 1, r"unknown type 4294967295"),
])
def test_removed_and_unknown_ggml_types(tmp_path, raw_type, pattern):
    raw = gguf_bytes([], [tensor("w", (32,), raw_type, 0)], b"\0" * 128)
    rejects(tmp_path, raw, r"tensor w has " + pattern, tensor_field_at(0, "w", 1, "type"))


@pytest.mark.parametrize("n_dims", [0, 5, 2**32 - 1])
def test_n_dims_outside_1_to_4(tmp_path, n_dims):
    raw = gguf_bytes([], [tensor("w", (8,) * min(n_dims, 5), F32, 0, n_dims=n_dims)], b"\0" * 256)
    rejects(tmp_path, raw, rf"tensor w has n_dims {n_dims}, outside 1..4",
            tensor_field_at(0, "w", 0, "n_dims"))


@pytest.mark.parametrize("ne, pattern", [
    ((-1,), r"tensor w has negative dimension 0: -1"),
    ((4, -(2**63)), r"tensor w has negative dimension 1: -9223372036854775808"),
    ((2**62, 2**62), r"tensor w shape \[\d+, \d+\] overflows 64-bit element counts"),
    ((2**32, 2**31, 2), r"overflows 64-bit element counts"),
    ((2**62,), r"tensor w byte size overflows 64 bits"),
])
def test_negative_and_overflowing_dimensions(tmp_path, ne, pattern):
    raw = gguf_bytes([], [tensor("w", ne, F32, 0)], DATA32)
    rejects(tmp_path, raw, pattern, tensor_field_at(0, "w", 0, "n_dims"))


@pytest.mark.parametrize("ttype, ne0, pattern", [
    (Q8_0, 31, r"row length 31 is not a multiple of Q8_0's block size 32"),
    (Q8_0, 48, r"row length 48 is not a multiple of Q8_0's block size 32"),
    (Q4_K, 32, r"row length 32 is not a multiple of Q4_K's block size 256"),
])
def test_rows_not_a_multiple_of_the_block_size(tmp_path, ttype, ne0, pattern):
    raw = gguf_bytes([], [tensor("w", (ne0, 2), ttype, 0)], b"\0" * 1024)
    rejects(tmp_path, raw, r"tensor w: " + pattern, tensor_field_at(0, "w", 0, "n_dims"))


@pytest.mark.parametrize("ne, offset", [((8,), 1 << 40), ((8,), 32), ((9,), 0), ((8, 2**40), 0)])
def test_data_out_of_the_file(tmp_path, ne, offset):
    raw = gguf_bytes([], [tensor("w", ne, F32, offset)], DATA32)
    rejects(tmp_path, raw, r"tensor w data \[\d+, \d+\) lies outside the file of \d+ bytes",
            tensor_field_at(0, "w", len(ne), "offset"))


@pytest.mark.parametrize("alignment, offset", [(32, 4), (32, 16), (64, 32)])
def test_data_offset_not_aligned(tmp_path, alignment, offset):
    kvs = [kv("general.alignment", T_U32, u32(alignment))] if alignment != 32 else []
    raw = gguf_bytes(kvs, [tensor("w", (8,), F32, offset)], b"\0" * 256, alignment=alignment)
    rejects(tmp_path, raw, rf"tensor w data offset {offset} is not a multiple of the alignment {alignment}",
            tensor_field_at(len(b"".join(kvs)), "w", 1, "offset"))


def test_duplicate_keys(tmp_path):
    first = kv("k", T_U32, u32(1))
    rejects(tmp_path, gguf_bytes([first, kv("k", T_U32, u32(2))]), r"duplicate metadata key 'k'",
            HEADER + len(first))


def test_duplicate_tensor_names(tmp_path):
    first = tensor("w", (8,), F32, 0)
    raw = gguf_bytes([], [first, tensor("w", (8,), F32, 32)], DATA32 * 2)
    rejects(tmp_path, raw, r"duplicate tensor name 'w'", HEADER + len(first))


@pytest.mark.parametrize("vtype, payload, pattern", [
    (T_U32, u32(0), r"general.alignment is 0, not a power of two"),
    (T_U32, u32(3), r"general.alignment is 3, not a power of two"),
    (T_U32, u32(48), r"general.alignment is 48, not a power of two"),
    (T_U64, u64(32), r"general.alignment must be a UINT32, not UINT64"),
    (T_I32, u32(32), r"general.alignment must be a UINT32, not INT32"),
    (T_STRING, gstr("32"), r"general.alignment must be a UINT32, not STRING"),
])
def test_bad_alignment(tmp_path, vtype, payload, pattern):
    rejects(tmp_path, gguf_bytes([kv("general.alignment", vtype, payload)]), pattern, HEADER)


@pytest.mark.parametrize("where", ["key", "tensor name"])
def test_invalid_utf8_names(tmp_path, where):
    bad = b"ab\xff\xfe"
    if where == "key":
        rejects(tmp_path, gguf_bytes([kv(bad, T_U8, b"\0")]), r"metadata key is not valid UTF-8", HEADER)
    else:
        raw = gguf_bytes([], [tensor(bad, (8,), F32, 0)], DATA32)
        rejects(tmp_path, raw, r"name of tensor 0 is not valid UTF-8", HEADER)


@pytest.mark.parametrize("shape", ["scalar", "array"])
def test_bool_values_not_0_or_1(tmp_path, shape):
    if shape == "scalar":
        raw = gguf_bytes([kv("b", T_BOOL, b"\x02")])
        rejects(tmp_path, raw, r"bool value of b is 2, not 0 or 1", kv_value_at("b"))
    else:
        raw = gguf_bytes([kv("b", T_ARRAY, u32(T_BOOL) + u64(3) + b"\x00\x01\x05")])
        rejects(tmp_path, raw, r"bool array b holds 5 at index 2", kv_value_at("b") + 12 + 2)


@pytest.mark.parametrize("cap, raw, pattern", [
    ("MAX_TENSORS", gguf_bytes([], [tensor(f"w{i}", (8,), F32, 32 * i) for i in range(3)], DATA32 * 3),
     r"tensor count 3 is impossible for a file of \d+ bytes \(cap 2\)"),
    ("MAX_KV", gguf_bytes([kv(f"k{i}", T_U8, b"\0") for i in range(3)]),
     r"metadata count 3 is impossible for a file of \d+ bytes \(cap 2\)"),
])
def test_counts_over_the_caps(tmp_path, monkeypatch, cap, raw, pattern):
    """Counts that would fit in the file but exceed the sanity caps (lowered here to 2, as
    real caps need files of tens of megabytes to exceed them)."""
    monkeypatch.setattr(f"ggmlpy.gguf.reader.{cap}", 2)
    rejects(tmp_path, raw, pattern, 8 if cap == "MAX_TENSORS" else 16)
    monkeypatch.setattr(f"ggmlpy.gguf.reader.{cap}", 3)
    opens(tmp_path, raw).close()
