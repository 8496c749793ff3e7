"""What a model file is, as llama.cpp's loader reports it: the data behind `ggmlpy inspect`.

File type names, the file-type guess for files without `general.file_type`, model size and
bits per weight follow llama.cpp (llama_model_ftype_name, the loader's most-common-type
guess, and print_info's "model size = X MiB (Y BPW)"), so the numbers can be compared with
what llama.cpp prints for the same file.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np

from ggmlpy.gguf.constants import KEY_ARCHITECTURE, KEY_FILE_TYPE, GGUFValueType
from ggmlpy.gguf.file import GGUFFile
from ggmlpy.gguf.reader import GGUFField, TensorInfo
from ggmlpy.ir.types import GGMLType

LLAMA_FTYPE_GUESSED = 1024  # llama.cpp marks a guessed file type with this bit

# llama.cpp's llama_ftype values and the names llama_model_ftype_name gives them
FILE_TYPE_NAMES: dict[int, str] = {
    0: "all F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_1, some F16", 7: "Q8_0", 8: "Q5_0",
    9: "Q5_1", 10: "Q2_K - Medium", 11: "Q3_K - Small", 12: "Q3_K - Medium", 13: "Q3_K - Large",
    14: "Q4_K - Small", 15: "Q4_K - Medium", 16: "Q5_K - Small", 17: "Q5_K - Medium", 18: "Q6_K",
    19: "IQ2_XXS - 2.0625 bpw", 20: "IQ2_XS - 2.3125 bpw", 21: "Q2_K - Small",
    22: "IQ3_XS - 3.3 bpw", 23: "IQ3_XXS - 3.0625 bpw", 24: "IQ1_S - 1.5625 bpw",
    25: "IQ4_NL - 4.5 bpw", 26: "IQ3_S - 3.4375 bpw", 27: "IQ3_S mix - 3.66 bpw",
    28: "IQ2_S - 2.5 bpw", 29: "IQ2_M - 2.7 bpw", 30: "IQ4_XS - 4.25 bpw", 31: "IQ1_M - 1.75 bpw",
    32: "BF16", 36: "TQ1_0 - 1.69 bpw ternary", 37: "TQ2_0 - 2.06 bpw ternary", 38: "MXFP4 MoE",
    39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}

# the file type llama.cpp's loader guesses from the most common tensor type
_GUESS: dict[GGMLType, int] = {
    GGMLType.F32: 0, GGMLType.F16: 1, GGMLType.BF16: 32, GGMLType.Q4_0: 2, GGMLType.Q4_1: 3,
    GGMLType.Q5_0: 8, GGMLType.Q5_1: 9, GGMLType.Q8_0: 7, GGMLType.Q2_K: 10, GGMLType.Q3_K: 12,
    GGMLType.Q4_K: 15, GGMLType.Q5_K: 17, GGMLType.Q6_K: 18, GGMLType.TQ1_0: 36,
    GGMLType.TQ2_0: 37, GGMLType.IQ2_XXS: 19, GGMLType.IQ2_XS: 20, GGMLType.IQ2_S: 28,
    GGMLType.IQ3_XXS: 23, GGMLType.IQ1_S: 24, GGMLType.IQ1_M: 31, GGMLType.IQ4_NL: 25,
    GGMLType.IQ4_XS: 30, GGMLType.IQ3_S: 26, GGMLType.NVFP4: 39, GGMLType.Q1_0: 40,
    GGMLType.Q2_0: 41,
}

_INTEGER_TYPES = {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
                  GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64}

SHORT_ARRAY = 8  # arrays up to this length are shown in full
ARRAY_HEAD = 3  # how many strings a summarised string array shows


def file_type_name(ftype: int) -> str:
    """llama_model_ftype_name: the name of a llama_ftype, "(guessed)" when the bit is set."""
    if ftype & LLAMA_FTYPE_GUESSED:
        return file_type_name(ftype & ~LLAMA_FTYPE_GUESSED) + " (guessed)"
    return FILE_TYPE_NAMES.get(ftype, "unknown, may not work")


def guess_file_type(tensors: Iterable[TensorInfo]) -> int:
    """The loader's guess: the type held by most tensors, counted in name order with the
    first type to reach the top count winning ties (llama.cpp walks a std::map by name).
    Types without a file type of their own give "all F32", as in llama.cpp."""
    counts: Counter[GGMLType] = Counter()
    best, best_count = GGMLType.F32, 0
    for t in sorted(tensors, key=lambda t: t.name.encode("utf-8")):
        counts[t.type] += 1
        if counts[t.type] > best_count:
            best, best_count = t.type, counts[t.type]
    return _GUESS.get(best, 0) | LLAMA_FTYPE_GUESSED


def value_type_name(f: GGUFField) -> str:
    """"uint32", "string", or "array[int32,49152]" for arrays."""
    name = f.type.name.lower()
    if f.type == GGUFValueType.ARRAY and f.element_type is not None:
        return f"{name}[{f.element_type.name.lower()},{len(f.value)}]"
    return name


def _scalar(value: Any, vtype: GGUFValueType | None) -> Any:
    if vtype == GGUFValueType.FLOAT32:
        return float(str(np.float32(value)))  # the shortest decimal that is this float32
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _cut(s: str, n: int = 24) -> str:
    return s if len(s) <= n else s[:n - 3] + "..."


def summarize_value(f: GGUFField) -> Any:
    """A JSON-ready value: scalars as they are, short arrays as lists, long ones as
    "[N strings: 'a', 'b', ...]" or "[N int32]"."""
    if f.type != GGUFValueType.ARRAY:
        return _scalar(f.value, f.type)
    values, etype = f.value, f.element_type
    if etype == GGUFValueType.ARRAY:
        return f"[{len(values)} arrays]"
    if len(values) <= SHORT_ARRAY:
        return [_scalar(v, etype) for v in (values[:] if etype == GGUFValueType.STRING
                                             else values.tolist())]
    if etype == GGUFValueType.STRING:
        head = ", ".join(repr(_cut(s)) for s in values.head(ARRAY_HEAD))
        return f"[{len(values)} strings: {head}, ...]"
    return f"[{len(values)} {etype.name.lower()}]"


@dataclass
class MetadataRow:
    key: str
    type: str
    value: Any


@dataclass
class TensorRow:
    name: str
    type: str
    shape: list[int]  # ne, ggml order (innermost first), as llama.cpp prints it
    nbytes: int
    offset: int  # absolute, in its part
    part: int = 0


@dataclass
class ModelSummary:
    path: str
    version: int
    architecture: str | None
    file_type: int  # a llama_ftype, with LLAMA_FTYPE_GUESSED set when guessed
    file_type_name: str
    file_type_guessed: bool
    n_tensors: int
    n_params: int  # total elements of all tensors
    tensor_bytes: int
    size_mib: float
    bpw: float  # tensor bits per element: llama.cpp's BPW
    file_size: int
    n_parts: int
    alignment: int
    data_offset: int
    type_counts: dict[str, int] = field(default_factory=dict)
    metadata: list[MetadataRow] = field(default_factory=list)
    tensors: list[TensorRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; metadata keyed by name ({key: {"type", "value"}}, in file order)."""
        d = asdict(self)
        d["metadata"] = {m.key: {"type": m.type, "value": m.value} for m in self.metadata}
        return d


def summarize(f: GGUFFile) -> ModelSummary:
    """Everything inspect shows about an open model; reads no tensor data."""
    tensors = list(f.tensors.values())
    n_params = sum(t.n_elements for t in tensors)
    tensor_bytes = sum(t.nbytes for t in tensors)
    ftype_field = f.fields.get(KEY_FILE_TYPE)
    if ftype_field is not None and ftype_field.type in _INTEGER_TYPES:
        ftype = int(ftype_field.value)
    else:
        ftype = guess_file_type(tensors)
    arch = f.fields.get(KEY_ARCHITECTURE)
    counts = Counter(t.type for t in tensors)
    return ModelSummary(
        path=str(f.path),
        version=f.version,
        architecture=arch.value if arch is not None and arch.type == GGUFValueType.STRING else None,
        file_type=ftype,
        file_type_name=file_type_name(ftype),
        file_type_guessed=bool(ftype & LLAMA_FTYPE_GUESSED),
        n_tensors=len(tensors),
        n_params=n_params,
        tensor_bytes=tensor_bytes,
        size_mib=tensor_bytes / (1 << 20),
        bpw=tensor_bytes * 8 / n_params if n_params else 0.0,
        file_size=f.file_size,
        n_parts=len(f.paths),
        alignment=f.alignment,
        data_offset=f.data_offset,
        type_counts={t.name: counts[t] for t in sorted(counts)},
        metadata=[MetadataRow(k, value_type_name(fl), summarize_value(fl)) for k, fl in f.fields.items()],
        tensors=[TensorRow(t.name, t.type.name, list(t.ne), t.nbytes, t.offset, t.file_index)
                 for t in tensors],
    )
