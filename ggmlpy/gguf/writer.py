"""GGUF writer: metadata of every value type and tensors, laid out as llama.cpp writes them.

Used by tests to build tiny models and by tools that rewrite files. Values are encoded when
they are added, so a value that does not fit its type fails at `add_*` naming the key, and
the writer never produces a file the reader would reject. The file appears under its final
name only once fully written (a temporary file is renamed), so an interrupted write never
leaves a truncated model behind.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterable

import numpy as np

from ggmlpy.gguf.constants import (
    DEFAULT_ALIGNMENT, GGML_MAX_DIMS, GGML_MAX_NAME, GGUF_MAGIC, KEY_ALIGNMENT, KEY_ARCHITECTURE,
    KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT, MAX_ARRAY_NESTING, MAX_KEY_LENGTH,
    SCALAR_DTYPES, STRUCT_FORMATS, SUPPORTED_VERSIONS, GGUFValueType,
)
from ggmlpy.gguf.file import GGUFFile, split_path
from ggmlpy.gguf.strings import StringArray
from ggmlpy.ir.types import GGMLType, block_size, row_size, type_size

_NUMPY_TO_VALUE = {
    np.dtype(np.uint8): GGUFValueType.UINT8, np.dtype(np.int8): GGUFValueType.INT8,
    np.dtype(np.uint16): GGUFValueType.UINT16, np.dtype(np.int16): GGUFValueType.INT16,
    np.dtype(np.uint32): GGUFValueType.UINT32, np.dtype(np.int32): GGUFValueType.INT32,
    np.dtype(np.float32): GGUFValueType.FLOAT32, np.dtype(np.bool_): GGUFValueType.BOOL,
    np.dtype(np.uint64): GGUFValueType.UINT64, np.dtype(np.int64): GGUFValueType.INT64,
    np.dtype(np.float64): GGUFValueType.FLOAT64,
}

_NUMPY_TO_GGML = {
    np.dtype(np.float32): GGMLType.F32, np.dtype(np.float16): GGMLType.F16,
    np.dtype(np.float64): GGMLType.F64, np.dtype(np.int8): GGMLType.I8,
    np.dtype(np.int16): GGMLType.I16, np.dtype(np.int32): GGMLType.I32,
    np.dtype(np.int64): GGMLType.I64,
}


def infer_value_type(value: Any) -> GGUFValueType:
    """The GGUF type a Python value gets when none is given (ints: UINT32 when they fit)."""
    if isinstance(value, (bool, np.bool_)):
        return GGUFValueType.BOOL
    if isinstance(value, np.generic) and value.dtype in _NUMPY_TO_VALUE:
        return _NUMPY_TO_VALUE[value.dtype]
    if isinstance(value, int):
        if 0 <= value < 1 << 32:
            return GGUFValueType.UINT32
        if -(1 << 31) <= value < 0:
            return GGUFValueType.INT32
        return GGUFValueType.INT64 if value < 1 << 63 else GGUFValueType.UINT64
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, (str, bytes)):
        return GGUFValueType.STRING
    if isinstance(value, (list, tuple, np.ndarray, StringArray)):
        return GGUFValueType.ARRAY
    raise TypeError(f"no GGUF value type for {type(value).__name__}")


def infer_element_type(values: Any) -> GGUFValueType:
    """Element type of an array: a numpy array's dtype, else the type of its first item."""
    if isinstance(values, np.ndarray):
        if values.dtype not in _NUMPY_TO_VALUE:
            raise TypeError(f"no GGUF element type for numpy dtype {values.dtype}")
        return _NUMPY_TO_VALUE[values.dtype]
    if isinstance(values, StringArray):
        return GGUFValueType.STRING
    if not len(values):
        raise TypeError("an empty array needs an explicit element type (or a typed numpy array)")
    return infer_value_type(values[0])


def _string_bytes(value: str | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value.encode("utf-8", "surrogateescape")  # the reader's lossless decoding, reversed


def _length_prefixed(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


def _numbers(values: Any, etype: GGUFValueType) -> bytes:
    """Little-endian elements; values outside the element type's range are an error, not
    silently wrapped."""
    dtype = np.dtype(SCALAR_DTYPES[etype])
    if not isinstance(values, np.ndarray):
        # Python numbers: np.asarray would turn [2**64 - 1, 0] into floats, so check them here
        values = list(values)
        if dtype.kind in "iu" and not all(isinstance(v, (int, np.integer)) for v in values):
            raise TypeError(f"{etype.name} array holds non-integer values")
        values = np.array(values, dtype=object if dtype.kind in "iu" else None)
    if values.ndim != 1:
        raise ValueError(f"array of {etype.name} must be one-dimensional, got shape {values.shape}")
    if values.size and etype == GGUFValueType.BOOL:
        if not np.isin(values, (0, 1)).all():
            raise ValueError("bool array values must be 0/1 or False/True")
    elif values.size and dtype.kind in "iu":
        if values.dtype.kind not in "iubO":
            raise TypeError(f"{etype.name} array given {values.dtype} values")
        info = np.iinfo(dtype)
        low, high = int(values.min()), int(values.max())  # Python ints compare exactly
        if low < info.min or high > info.max:
            raise ValueError(f"values [{low}, {high}] do not fit {etype.name}")
    return values.astype(dtype).tobytes()


def encode_value(vtype: GGUFValueType, value: Any, element_type: GGUFValueType | None = None,
                 depth: int = 0) -> bytes:
    """The bytes of one metadata value (without its key and type tag)."""
    if vtype == GGUFValueType.STRING:
        return _length_prefixed(_string_bytes(value))
    if vtype != GGUFValueType.ARRAY:
        if vtype == GGUFValueType.BOOL and value not in (0, 1):
            raise ValueError(f"bool value must be 0/1 or False/True, got {value!r}")
        try:
            return struct.pack(STRUCT_FORMATS[vtype], value)
        except (struct.error, OverflowError) as e:
            raise ValueError(f"{value!r} does not fit {vtype.name}: {e}") from None
    if depth >= MAX_ARRAY_NESTING:
        raise ValueError(f"arrays nested deeper than {MAX_ARRAY_NESTING} levels")
    etype = infer_element_type(value) if element_type is None else GGUFValueType(element_type)
    head = struct.pack("<IQ", etype, len(value))
    if etype == GGUFValueType.STRING:
        return head + b"".join(_length_prefixed(_string_bytes(s)) for s in value)
    if etype == GGUFValueType.ARRAY:
        # each nested array carries its own element type, taken from the item itself
        return head + b"".join(encode_value(GGUFValueType.ARRAY, item, None, depth + 1)
                               for item in value)
    return head + _numbers(value, etype)


@dataclass
class _KV:
    key: str
    type: GGUFValueType
    value: Any
    element_type: GGUFValueType | None
    payload: bytes  # the encoded value


@dataclass
class _Tensor:
    name: str
    type: GGMLType
    ne: tuple[int, ...]
    data: np.ndarray  # raw bytes, uint8


class GGUFWriter:
    """Collects metadata and tensors, then `write(path)` lays out the file in one pass.

    The key order is the order of the `add_*` calls, after `general.architecture` and then
    `general.alignment` (when not the default), which is what the `gguf` package writes.
    """

    def __init__(self, arch: str | None = None, *, alignment: int = DEFAULT_ALIGNMENT, version: int = 3):
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment} is not a power of two")
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"GGUF version {version} is not supported (use 2 or 3)")
        self.alignment = alignment
        self.version = version
        self._kv: dict[str, _KV] = {}
        self._tensors: dict[str, _Tensor] = {}
        if arch is not None:
            self.add_key_value(KEY_ARCHITECTURE, arch, GGUFValueType.STRING)
        if alignment != DEFAULT_ALIGNMENT:
            self.add_key_value(KEY_ALIGNMENT, alignment, GGUFValueType.UINT32)

    @classmethod
    def from_file(cls, f: GGUFFile) -> "GGUFWriter":
        """A writer holding everything an open file holds, in the same order and with the
        same declared types, so `write` reproduces the file (split keys are left out: the
        result is one file)."""
        w = cls(version=f.version)
        for key, fl in f.fields.items():
            if not key.startswith("split."):
                w.add_key_value(key, fl.value, fl.type, fl.element_type)
        for t in f.tensors.values():
            w.add_tensor(t.name, t.data, type=t.type, ne=t.ne)
        return w

    # metadata -------------------------------------------------------------------------------
    def add_key_value(self, key: str, value: Any, vtype: GGUFValueType | None = None,
                      element_type: GGUFValueType | None = None) -> None:
        if key in self._kv:
            raise ValueError(f"duplicate metadata key {key!r}")
        if len(key.encode("utf-8")) > MAX_KEY_LENGTH:
            raise ValueError(f"metadata key {key[:40]!r}... is longer than {MAX_KEY_LENGTH} bytes")
        vtype = infer_value_type(value) if vtype is None else GGUFValueType(vtype)
        if vtype == GGUFValueType.ARRAY and element_type is None:
            element_type = infer_element_type(value)
        try:
            payload = encode_value(vtype, value, element_type)
        except (TypeError, ValueError) as e:
            raise type(e)(f"metadata {key}: {e}") from None
        if key == KEY_ALIGNMENT:
            # the key and the layout must agree: the key sets the alignment the writer uses
            if vtype != GGUFValueType.UINT32 or value <= 0 or value & (value - 1):
                raise ValueError(f"{KEY_ALIGNMENT} must be a UINT32 power of two, got {value!r}")
            self.alignment = int(value)
        self._kv[key] = _KV(key, vtype, value, element_type, payload)

    def add_array(self, key: str, values: Any, element_type: GGUFValueType | None = None) -> None:
        self.add_key_value(key, values, GGUFValueType.ARRAY, element_type)

    def add_string(self, key: str, value: str) -> None:
        self.add_key_value(key, value, GGUFValueType.STRING)

    def add_uint32(self, key: str, value: int) -> None:
        self.add_key_value(key, value, GGUFValueType.UINT32)

    def add_int32(self, key: str, value: int) -> None:
        self.add_key_value(key, value, GGUFValueType.INT32)

    def add_uint64(self, key: str, value: int) -> None:
        self.add_key_value(key, value, GGUFValueType.UINT64)

    def add_float32(self, key: str, value: float) -> None:
        self.add_key_value(key, value, GGUFValueType.FLOAT32)

    def add_bool(self, key: str, value: bool) -> None:
        self.add_key_value(key, value, GGUFValueType.BOOL)

    # tensors --------------------------------------------------------------------------------
    def add_tensor(self, name: str, data: np.ndarray, *, type: GGMLType | None = None,
                   ne: Iterable[int] | None = None) -> None:
        """Add a tensor. Plain numpy arrays give their own type and shape (ne = shape
        reversed); quantised (or BF16) data is passed as raw bytes with `type` and `ne`."""
        if name in self._tensors:
            raise ValueError(f"duplicate tensor name {name!r}")
        if len(name.encode()) >= GGML_MAX_NAME:
            raise ValueError(f"tensor name {name!r} is longer than {GGML_MAX_NAME - 1} bytes")
        data = np.ascontiguousarray(data)
        if type is None:
            if data.dtype not in _NUMPY_TO_GGML:
                raise TypeError(f"tensor {name}: pass type= for numpy dtype {data.dtype}")
            type = _NUMPY_TO_GGML[data.dtype]
        type = GGMLType(type)
        if ne is None:
            if data.dtype == np.uint8 and type_size(type) != 1:
                # raw bytes shaped (..., row bytes): recover the row length in elements
                row_bytes = data.shape[-1]
                ne = (row_bytes // type_size(type) * block_size(type), *reversed(data.shape[:-1]))
            else:
                ne = tuple(reversed(data.shape)) or (1,)
        ne = tuple(int(n) for n in ne)
        if not 1 <= len(ne) <= GGML_MAX_DIMS:
            raise ValueError(f"tensor {name}: {len(ne)} dimensions, ggml allows 1..{GGML_MAX_DIMS}")
        if any(n < 0 for n in ne):
            raise ValueError(f"tensor {name}: negative dimension in {list(ne)}")
        nbytes = row_size(type, ne[0])
        for n in ne[1:]:
            nbytes *= n
        raw = data.reshape(-1).view(np.uint8)
        if raw.nbytes != nbytes:
            raise ValueError(f"tensor {name}: {raw.nbytes} bytes of data, {type.name} {list(ne)} "
                             f"needs {nbytes}")
        self._tensors[name] = _Tensor(name, type, ne, raw)

    # output ---------------------------------------------------------------------------------
    def write(self, path: str | os.PathLike) -> Path:
        return _write_file(Path(path), self.version, self.alignment, list(self._kv.values()),
                           list(self._tensors.values()))

    def write_split(self, prefix: str | os.PathLike, n_parts: int) -> list[Path]:
        """Write the model as `n_parts` files PREFIX-0000i-of-0000N.gguf, as llama.cpp's
        gguf-split lays them out: all metadata in the first part, tensors spread over the
        parts in order, and every part carrying split.no (u16), split.count (u16) and
        split.tensors.count (i32)."""
        if not 1 <= n_parts <= min(99999, 0xFFFF):
            raise ValueError(f"cannot split into {n_parts} parts")
        tensors = list(self._tensors.values())
        if len(tensors) >= 1 << 31:
            raise ValueError("too many tensors for split.tensors.count")
        per, extra = divmod(len(tensors), n_parts)
        paths = []
        first = 0
        for i in range(n_parts):
            count = per + (i < extra)
            kvs = [kv for kv in self._kv.values() if kv.key != KEY_ALIGNMENT] if i == 0 else []
            if self.alignment != DEFAULT_ALIGNMENT:
                kvs.insert(0, _kv(KEY_ALIGNMENT, self.alignment, GGUFValueType.UINT32))
            kvs += [_kv(KEY_SPLIT_NO, i, GGUFValueType.UINT16),
                    _kv(KEY_SPLIT_COUNT, n_parts, GGUFValueType.UINT16),
                    _kv(KEY_SPLIT_TENSORS_COUNT, len(tensors), GGUFValueType.INT32)]
            path = split_path(prefix, i, n_parts)
            paths.append(_write_file(path, self.version, self.alignment, kvs,
                                     tensors[first:first + count]))
            first += count
        return paths


def _kv(key: str, value: Any, vtype: GGUFValueType) -> _KV:
    return _KV(key, vtype, value, None, encode_value(vtype, value))


def _padded(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _write_file(path: Path, version: int, alignment: int, kvs: list[_KV],
                tensors: list[_Tensor]) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            _write_to(f, version, alignment, kvs, tensors)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _write_to(f: BinaryIO, version: int, alignment: int, kvs: list[_KV],
              tensors: list[_Tensor]) -> None:
    f.write(GGUF_MAGIC)
    f.write(struct.pack("<IQQ", version, len(tensors), len(kvs)))
    for kv in kvs:
        f.write(_length_prefixed(kv.key.encode("utf-8")))
        f.write(struct.pack("<I", kv.type))
        f.write(kv.payload)
    offset = 0
    for t in tensors:
        f.write(_length_prefixed(t.name.encode("utf-8")))
        f.write(struct.pack("<I", len(t.ne)))
        f.write(struct.pack(f"<{len(t.ne)}q", *t.ne))
        f.write(struct.pack("<IQ", t.type, offset))
        offset += _padded(t.data.nbytes, alignment)
    f.write(b"\0" * (_padded(f.tell(), alignment) - f.tell()))
    # every tensor, the last one included, is padded to the alignment (as llama.cpp does)
    for t in tensors:
        f.write(t.data.tobytes())
        f.write(b"\0" * (_padded(t.data.nbytes, alignment) - t.data.nbytes))
