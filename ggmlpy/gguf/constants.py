"""GGUF format constants and the reader's safety caps."""
from __future__ import annotations

import enum

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64  # tensor names are shorter than this (ggml's fixed-size name field)

# Caps beyond "must fit in the remaining bytes": they keep a crafted file from making the
# reader build huge Python structures, and are far above anything a real model carries.
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 20
MAX_KEY_LENGTH = 1 << 16
MAX_ARRAY_NESTING = 8


class GGUFValueType(enum.IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# numpy dtype (little-endian) of each fixed-size value type
SCALAR_DTYPES: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "<u1",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}

# struct format (little-endian) of each fixed-size value type
STRUCT_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<B",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}

KEY_ALIGNMENT = "general.alignment"
KEY_ARCHITECTURE = "general.architecture"
KEY_FILE_TYPE = "general.file_type"
KEY_SPLIT_NO = "split.no"
KEY_SPLIT_COUNT = "split.count"
KEY_SPLIT_TENSORS_COUNT = "split.tensors.count"
