"""Strict, zero-copy GGUF reader.

Every length read from the file is checked against the bytes that remain before anything is
allocated for it, so a hostile file fails with a `GGUFError` naming the field and offset
instead of hanging, crashing or asking for gigabytes. Tensor data is never read at open:
`TensorInfo.data` is a numpy view into a read-only memory map. Without a map (use_mmap=False,
or when mapping fails, as llama.cpp falls back) the file is read into memory in one pass and
the views point into that read-only buffer instead: everything downstream is the same.
"""
from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ggmlpy.gguf.constants import (
    DEFAULT_ALIGNMENT, GGML_MAX_DIMS, GGML_MAX_NAME, GGUF_MAGIC, KEY_ALIGNMENT, MAX_ARRAY_NESTING,
    MAX_KEY_LENGTH, MAX_KV, MAX_TENSORS, SCALAR_DTYPES, STRUCT_FORMATS, SUPPORTED_VERSIONS, GGUFValueType,
)
from ggmlpy.gguf.errors import GGUFError
from ggmlpy.gguf.file_map import FileMap
from ggmlpy.gguf.strings import StringArray, string_array_end
from ggmlpy.ir.types import GGMLType, REMOVED_TYPES, block_size, type_name, type_size

_INT64_MAX = (1 << 63) - 1
_READ_CHUNK = 1 << 26  # bytes per read() call: one call may return less than asked for

log = logging.getLogger("ggmlpy.gguf")


@dataclass
class GGUFField:
    """One metadata entry with its declared types (what the writer needs to round-trip it)."""

    key: str
    type: GGUFValueType
    value: Any
    offset: int
    element_type: GGUFValueType | None = None  # for arrays


@dataclass
class TensorInfo:
    """Where a tensor lives; `data` is a zero-copy uint8 view of its bytes."""

    name: str
    type: GGMLType
    ne: tuple[int, ...]  # ggml order: ne[0] is the innermost (contiguous) dimension
    offset: int  # absolute byte offset in its file
    nbytes: int
    file_index: int = 0
    _buffer: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy shape (ne reversed)."""
        return tuple(reversed(self.ne))

    @property
    def data(self) -> np.ndarray:
        if self._buffer is None:
            raise ValueError(f"tensor {self.name}: its file is closed")
        return self._buffer[self.offset:self.offset + self.nbytes]


class _Cursor:
    """Bounds-checked little-endian reads over a uint8 buffer."""

    def __init__(self, buf: np.ndarray, path: str):
        self.buf = buf
        self.mem = memoryview(buf)
        self.pos = 0
        self.size = len(buf)
        self.path = path

    def error(self, message: str, offset: int | None = None) -> GGUFError:
        return GGUFError(message, path=self.path, offset=self.pos if offset is None else offset)

    def need(self, n: int, what: str) -> None:
        if n < 0 or n > self.size - self.pos:
            raise self.error(f"truncated file: {what} needs {n} bytes, {self.size - self.pos} remain")

    def unpack(self, fmt: str, what: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size, what)
        value = struct.unpack_from(fmt, self.mem, self.pos)[0]
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return self.unpack("<I", what)

    def u64(self, what: str) -> int:
        return self.unpack("<Q", what)

    def raw_string(self, what: str, max_length: int | None = None) -> bytes:
        start = self.pos
        length = self.u64(f"length of {what}")
        if max_length is not None and length > max_length:
            raise self.error(f"{what} is {length} bytes long, more than the cap of {max_length}", start)
        self.need(length, what)
        data = self.mem[self.pos:self.pos + length].tobytes()
        self.pos += length
        return data

    def text(self, what: str, max_length: int | None = None) -> str:
        start = self.pos
        raw = self.raw_string(what, max_length)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.error(f"{what} is not valid UTF-8 ({e.reason})", start) from None


def _value_type(cur: _Cursor, what: str) -> GGUFValueType:
    start = cur.pos
    raw = cur.u32(what)
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cur.error(f"{what} has unknown value type {raw}", start) from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, key: str, depth: int = 0) -> tuple[Any, GGUFValueType | None]:
    if vtype == GGUFValueType.STRING:
        return cur.raw_string(f"string value of {key}").decode("utf-8", "surrogateescape"), None
    if vtype == GGUFValueType.ARRAY:
        return _read_array(cur, key, depth)
    value = cur.unpack(STRUCT_FORMATS[vtype], f"value of {key}")
    if vtype == GGUFValueType.BOOL:
        if value > 1:
            raise cur.error(f"bool value of {key} is {value}, not 0 or 1", cur.pos - 1)
        value = bool(value)
    return value, None


def _read_array(cur: _Cursor, key: str, depth: int) -> tuple[Any, GGUFValueType]:
    if depth >= MAX_ARRAY_NESTING:
        raise cur.error(f"array {key} is nested deeper than {MAX_ARRAY_NESTING} levels")
    etype = _value_type(cur, f"element type of array {key}")
    count_at = cur.pos
    count = cur.u64(f"element count of array {key}")
    remaining = cur.size - cur.pos
    if etype == GGUFValueType.STRING:
        if count > remaining // 8:
            raise cur.error(f"array {key} claims {count} strings, which cannot fit in the "
                            f"{remaining} bytes that remain", count_at)
        end = string_array_end(cur.buf, cur.pos, count)
        if end < 0:
            raise cur.error(f"truncated file: string {-end - 1} of array {key} runs past the end")
        strings = StringArray(cur.buf, cur.pos, count, end)
        cur.pos = end
        return strings, etype
    if etype == GGUFValueType.ARRAY:
        # every nested array needs at least its 12-byte header
        if count > remaining // 12:
            raise cur.error(f"array {key} claims {count} nested arrays, which cannot fit in the "
                            f"{remaining} bytes that remain", count_at)
        return [_read_array(cur, key, depth + 1)[0] for _ in range(count)], etype
    dtype = np.dtype(SCALAR_DTYPES[etype])
    if count > remaining // dtype.itemsize:
        raise cur.error(f"array {key} claims {count} elements of {etype.name}, which cannot fit "
                        f"in the {remaining} bytes that remain", count_at)
    # a read-only view into the map, like tensor data: opening touches none of its pages
    values = np.frombuffer(cur.buf, dtype=dtype, count=count, offset=cur.pos)
    if etype == GGUFValueType.BOOL:
        bad = np.flatnonzero(values > 1)
        if bad.size:
            raise cur.error(f"bool array {key} holds {values[bad[0]]} at index {bad[0]}, not 0 "
                            f"or 1", cur.pos + int(bad[0]))
        values = values.view(np.bool_)
    cur.pos += count * dtype.itemsize
    return values, etype


def _read_all(f, size: int, path: Path) -> np.ndarray:
    """The whole file as a read-only uint8 array (the no-mmap load mode)."""
    buf = np.empty(size, dtype=np.uint8)
    view = memoryview(buf)
    pos = 0
    while pos < size:
        n = f.readinto(view[pos:pos + _READ_CHUNK])
        if not n:
            raise GGUFError(f"read stopped after {pos} of {size} bytes (the file shrank?)",
                            path=str(path), offset=pos)
        pos += n
    buf.flags.writeable = False  # tensor views are read-only, as with a map
    return buf


class GGUFPart:
    """One parsed file: header, metadata and tensor infos, over its memory map or, without
    one, over its bytes read into memory (`mapped` says which)."""

    def __init__(self, path: Path, file_index: int = 0, use_mmap: bool = True):
        self.path = path
        self.file_index = file_index
        self._map = None
        with open(path, "rb", buffering=0) as f:  # a map keeps its own descriptor; ours closes here
            self.size = os.fstat(f.fileno()).st_size
            if self.size == 0:
                raise GGUFError("empty file, not a GGUF file", path=str(path), offset=0)
            if use_mmap:
                try:
                    self._map = FileMap.of(f.fileno(), path)
                except (OSError, ValueError) as e:  # e.g. a file system without mmap
                    log.warning("%s: mmap failed (%s); reading the file into memory instead", path, e)
            self.mapped = self._map is not None
            if self.mapped:
                buffer = np.frombuffer(self._map, dtype=np.uint8)
            else:
                buffer = _read_all(f, self.size, path)
        try:
            self.buffer = buffer
            self._parse()
        except BaseException:
            self.close()
            raise

    def _parse(self) -> None:
        cur = _Cursor(self.buffer, str(self.path))
        cur.need(4, "magic")
        magic = cur.mem[0:4].tobytes()
        if magic != GGUF_MAGIC:
            raise cur.error(f"bad magic {magic!r}, expected {GGUF_MAGIC!r}: not a GGUF file", 0)
        cur.pos = 4
        version = cur.u32("version")
        if version not in SUPPORTED_VERSIONS:
            if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
                raise cur.error("big-endian GGUF files are not supported", 4)
            raise cur.error(f"unsupported GGUF version {version} (supported: 2, 3)", 4)
        self.version = version
        n_tensors_at = cur.pos
        n_tensors = cur.u64("tensor count")
        n_kv_at = cur.pos
        n_kv = cur.u64("metadata count")
        # the smallest tensor info is 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 + 8 bytes
        if n_tensors > MAX_TENSORS or n_tensors > (cur.size - cur.pos) // 32:
            raise cur.error(f"tensor count {n_tensors} is impossible for a file of {cur.size} bytes "
                            f"(cap {MAX_TENSORS})", n_tensors_at)
        # the smallest metadata entry is 8 (key length) + 4 (type) + 1 (a uint8 value)
        if n_kv > MAX_KV or n_kv > (cur.size - cur.pos) // 13:
            raise cur.error(f"metadata count {n_kv} is impossible for a file of {cur.size} bytes "
                            f"(cap {MAX_KV})", n_kv_at)

        self.fields: dict[str, GGUFField] = {}
        for _ in range(n_kv):
            at = cur.pos
            key = cur.text("metadata key", MAX_KEY_LENGTH)
            if key in self.fields:
                raise cur.error(f"duplicate metadata key {key!r}", at)
            vtype = _value_type(cur, f"type of {key}")
            value, etype = _read_value(cur, vtype, key)
            self.fields[key] = GGUFField(key, vtype, value, at, etype)

        self.alignment = DEFAULT_ALIGNMENT
        if KEY_ALIGNMENT in self.fields:
            f = self.fields[KEY_ALIGNMENT]
            if f.type != GGUFValueType.UINT32:
                raise cur.error(f"{KEY_ALIGNMENT} must be a UINT32, not {f.type.name}", f.offset)
            if f.value == 0 or f.value & (f.value - 1):
                raise cur.error(f"{KEY_ALIGNMENT} is {f.value}, not a power of two", f.offset)
            self.alignment = f.value

        infos: list[tuple[str, int, tuple[int, ...], int, int]] = []
        names: set[str] = set()
        for i in range(n_tensors):
            at = cur.pos
            name = cur.text(f"name of tensor {i}", GGML_MAX_NAME - 1)
            if name in names:
                raise cur.error(f"duplicate tensor name {name!r}", at)
            names.add(name)
            dims_at = cur.pos
            n_dims = cur.u32(f"n_dims of tensor {name}")
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                raise cur.error(f"tensor {name} has n_dims {n_dims}, outside 1..{GGML_MAX_DIMS}", dims_at)
            ne = tuple(cur.unpack("<q", f"dimension {d} of tensor {name}") for d in range(n_dims))
            type_at = cur.pos
            raw_type = cur.u32(f"type of tensor {name}")
            offset_at = cur.pos
            offset = cur.u64(f"data offset of tensor {name}")
            infos.append((name, raw_type, ne, offset, offset_at))
            self._check_shape(cur, name, raw_type, ne, dims_at, type_at)

        data_start = -(-cur.pos // self.alignment) * self.alignment
        self.data_offset = data_start
        self.tensors: dict[str, TensorInfo] = {}
        for name, raw_type, ne, offset, offset_at in infos:
            ttype = GGMLType(raw_type)
            nbytes = ne[0] // block_size(ttype) * type_size(ttype)
            for d in ne[1:]:
                nbytes *= d
            if offset % self.alignment:
                raise cur.error(f"tensor {name} data offset {offset} is not a multiple of the "
                                f"alignment {self.alignment}", offset_at)
            if data_start + offset + nbytes > cur.size:
                raise cur.error(f"tensor {name} data [{data_start + offset}, "
                                f"{data_start + offset + nbytes}) lies outside the file of "
                                f"{cur.size} bytes", offset_at)
            self.tensors[name] = TensorInfo(name, ttype, ne, data_start + offset, nbytes,
                                            self.file_index, self.buffer)

    @staticmethod
    def _check_shape(cur: _Cursor, name: str, raw_type: int, ne: tuple[int, ...],
                     dims_at: int, type_at: int) -> None:
        if raw_type in REMOVED_TYPES or raw_type not in GGMLType._value2member_map_:
            raise cur.error(f"tensor {name} has {type_name(raw_type)}", type_at)
        for d, n in enumerate(ne):
            if n < 0:
                raise cur.error(f"tensor {name} has negative dimension {d}: {n}", dims_at)
        total = 1
        for n in ne:
            total *= n
        if total > _INT64_MAX:
            raise cur.error(f"tensor {name} shape {list(ne)} overflows 64-bit element counts", dims_at)
        ttype = GGMLType(raw_type)
        if ne[0] % block_size(ttype):
            raise cur.error(f"tensor {name}: row length {ne[0]} is not a multiple of "
                            f"{ttype.name}'s block size {block_size(ttype)}", dims_at)
        if total // max(block_size(ttype), 1) * type_size(ttype) > _INT64_MAX:
            raise cur.error(f"tensor {name} byte size overflows 64 bits", dims_at)

    def close(self) -> None:
        """Drop our references. The mapping (and its descriptor) closes now if nothing else
        uses it, else once the last view of it (tensor data, metadata arrays) is collected:
        views stay valid instead of pointing at unmapped memory."""
        self.buffer = None  # type: ignore[assignment]
        m = self._map
        if m is not None:
            self._map = None
            try:
                m.close()
            except BufferError:
                pass  # views still alive: the OS unmaps it when they are collected
