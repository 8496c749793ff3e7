"""What llama-quantize would write, decided before a byte is written: every tensor's name and
target type (in the loader's order, or with --keep-split the input files' order), the file
each goes to and the output's metadata.

Deciding everything first lets every refusal (an importance matrix required, a quantised
input without --allow-requantize, a type ggmlpy cannot encode) name its tensor before the
output file exists, where llama-quantize fails some of them halfway through writing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ggmlpy.gguf import GGUFFile, GGUFValueType
from ggmlpy.gguf.constants import (
    DEFAULT_ALIGNMENT, KEY_ALIGNMENT, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT,
)
from ggmlpy.ir.types import GGMLType, is_quantized, row_size
from ggmlpy.quants import QUANTIZABLE, QUANTIZABLE_WITH_IMATRIX, dequantizable_types
from llama.quantize import mixes as F
from llama.quantize.choose import tensor_type
from llama.quantize.imatrix import Imatrix
from llama.quantize.mixes import ggml_name
from llama.quantize.names import allows_quantization, sort_key
from llama.quantize.prune import check_prune_layers, rename_layers
from llama.quantize.rules import ModelInfo, Params, State, requires_imatrix

V = GGUFValueType
T = GGMLType
QNT_VERSION = 2   # GGML_QNT_VERSION, written as general.quantization_version
_SPLIT_KEYS = (KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT)
_KV_OVERRIDE = re.compile(r"^([^=]+)=(int|float|bool|str):(.*)$", re.S)


KV = tuple[str, GGUFValueType, Any, GGUFValueType | None]   # key, type, value, element type


@dataclass
class TensorPlan:
    name: str                   # in the output (renumbered by --prune-layers)
    source: str                 # in the input
    ne: tuple[int, ...]
    src_type: GGMLType
    dst_type: GGMLType
    split: int = 0              # the output file it goes to (--keep-split: the input file it came from)
    # the importance matrix its encoder weighs by (ne[0] values, times n_expert for experts)
    imatrix: np.ndarray | None = None

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.ne[1:], dtype=np.int64)) if len(self.ne) > 1 else 1

    @property
    def dst_bytes(self) -> int:
        return row_size(self.dst_type, self.ne[0]) * self.n_rows

    @property
    def convert(self) -> bool:
        return self.src_type != self.dst_type


@dataclass
class Plan:
    ftype: int
    kvs: list[KV]               # the model's metadata, written in the first file
    tensors: list[TensorPlan]   # in the order they are written
    warnings: list[str] = field(default_factory=list)

    @property
    def n_split(self) -> int:
        """How many files are written: one, or with --keep-split one per input file that
        still holds a tensor (up to the last such file)."""
        return max((tp.split for tp in self.tensors), default=0) + 1

    def shard(self, i: int) -> tuple[list[KV], list[TensorPlan]]:
        """File i's metadata and tensors. The model's metadata is in the first file only; with
        more than one file each also gets split.no, split.count and split.tensors.count, set
        after the rest as llama-quantize sets them (the u16, u16, i32 of llama.cpp's loader)."""
        kvs = list(self.kvs) if i == 0 else []
        n = self.n_split
        if n > 1:
            kvs += [(KEY_SPLIT_NO, V.UINT16, i, None), (KEY_SPLIT_COUNT, V.UINT16, n, None),
                    (KEY_SPLIT_TENSORS_COUNT, V.INT32, len(self.tensors), None)]
        return kvs, [tp for tp in self.tensors if tp.split == i]


def parse_override_kv(text: str) -> tuple[str, GGUFValueType, Any]:
    """--override-kv KEY=TYPE:VALUE as llama-quantize writes it: int as UINT32 (of the absolute
    value), float as FLOAT32, bool (true/false), str (up to 127 bytes)."""
    m = _KV_OVERRIDE.match(text)
    if not m or len(m.group(1)) >= 128:
        raise ValueError(f"--override-kv {text!r}: expected KEY=TYPE:VALUE with TYPE int, float, bool or str")
    key, kind, value = m.groups()
    try:
        if kind == "int":
            return key, V.UINT32, abs(int(value)) & 0xFFFFFFFF
        if kind == "float":
            return key, V.FLOAT32, float(np.float32(float(value)))
    except ValueError:
        raise ValueError(f"--override-kv {text!r}: {value!r} is not a{'n' if kind == 'int' else ''} {kind}") from None
    if kind == "bool":
        if value not in ("true", "false"):
            raise ValueError(f"--override-kv {text!r}: a bool is true or false")
        return key, V.BOOL, value == "true"
    if len(value.encode()) > 127:
        raise ValueError(f"--override-kv {text!r}: strings are limited to 127 bytes")
    return key, V.STRING, value


def _scalar(meta: dict[str, Any], key: str, default: int = 0) -> int:
    """An integer hparam that may be stored per layer (get_key_or_arr): layer 0's value."""
    v = meta.get(key, default)
    if isinstance(v, (list, tuple, np.ndarray)):
        return int(v[0]) if len(v) else default
    return int(v)


def model_info(meta: dict[str, Any], path: str) -> ModelInfo:
    """The hparams llama-quantize's rules read, from the metadata (overrides applied)."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"{path}: general.architecture is missing: not a model file llama-quantize can read")
    if f"{arch}.block_count" not in meta:
        raise ValueError(f"{path}: key not found in model: {arch}.block_count")
    n_head = _scalar(meta, f"{arch}.attention.head_count")
    return ModelInfo(arch=arch, n_layer_all=_scalar(meta, f"{arch}.block_count"),
                     n_layer_nextn=_scalar(meta, f"{arch}.nextn_predict_layers"), n_head=n_head,
                     n_head_kv=_scalar(meta, f"{arch}.attention.head_count_kv", n_head),
                     n_expert=_scalar(meta, f"{arch}.expert_count"))


def guessed_ftype(f: GGUFFile, order: list[str]) -> int:
    """llama_model_loader's ftype: general.file_type, else guessed from the most common type."""
    if "general.file_type" in f.metadata:
        return int(f.metadata["general.file_type"]) & 0xFFFFFFFF
    counts: dict[GGMLType, int] = {}
    best, best_n = T.F32, 0
    for name in order:
        t = f.tensors[name].type
        counts[t] = counts.get(t, 0) + 1
        if counts[t] > best_n:
            best, best_n = t, counts[t]
    return F.GUESSED_FTYPES.get(best, F.ALL_F32) | F.FTYPE_GUESSED


def _metadata(f: GGUFFile, ftype: int, overrides: list[tuple[str, GGUFValueType, Any]],
              warnings: list[str]) -> list[KV]:
    """gguf_set_kv of the input's keys, then quantization_version and file_type set (moved to
    the end), the split keys removed, and the overrides (then, with --prune-layers, the new
    block_count) set, each also moved to the end."""
    kvs = {k: (k, fl.type, fl.value, fl.element_type) for k, fl in f.fields.items()}
    if KEY_ALIGNMENT in kvs and kvs[KEY_ALIGNMENT][2] != DEFAULT_ALIGNMENT:
        # llama-quantize copies the key but lays the file out at 32 bytes regardless
        warnings.append(f"{KEY_ALIGNMENT} {kvs[KEY_ALIGNMENT][2]} of the input is written as {DEFAULT_ALIGNMENT}, "
                        f"the alignment the output is laid out with")
        kvs[KEY_ALIGNMENT] = (KEY_ALIGNMENT, V.UINT32, DEFAULT_ALIGNMENT, None)
    for key, vtype, value in [("general.quantization_version", V.UINT32, QNT_VERSION),
                              ("general.file_type", V.UINT32, ftype), *overrides]:
        kvs.pop(key, None)
        kvs[key] = (key, vtype, value, None)
    for key in _SPLIT_KEYS:
        kvs.pop(key, None)
    return list(kvs.values())


def make_plan(f: GGUFFile, params: Params, imatrix: Imatrix | None, allow_requantize: bool,
              overrides: list[tuple[str, GGUFValueType, Any]], prune: Sequence[int] = (),
              keep_split: bool = False) -> Plan:
    """Every tensor's name, type and file and the output metadata, or a ValueError naming what
    llama-quantize (or ggmlpy's quantisers) cannot do.

    The type rules see the output names and count tensors in the order they are written, as
    llama.cpp's do: with --prune-layers the renumbered layers, with --keep-split the input
    files' order (file, then offset) instead of the loader's. Their layer count stays the
    input's block_count, pruned layers included (llama.cpp reads it before pruning)."""
    meta = dict(f.metadata)
    meta.update({k: v for k, _, v in overrides})
    info = model_info(meta, str(f.path))
    default = F.DEFAULT_TYPES.get(params.ftype)
    if default is None:
        raise ValueError(f"invalid output file type {params.ftype}")
    order = sorted(f.tensors, key=sort_key)
    ftype = guessed_ftype(f, order) if params.only_copy else params.ftype
    if prune:
        check_prune_layers(prune, info.n_layer_all)
    names, n_blocks = rename_layers(order, prune)
    kept = [src for src in order if names[src] is not None]
    if keep_split:
        kept.sort(key=lambda src: (f.tensors[src].file_index, f.tensors[src].offset))
    has_imatrix = imatrix is not None and bool(imatrix.data)
    state = State(info, params, has_imatrix=has_imatrix)
    state.count([names[src] for src in kept])
    tensors = []
    for src in kept:
        t, name = f.tensors[src], names[src]
        ne = tuple(int(n) for n in t.ne)
        allowed = allows_quantization(params, info.arch, name, ne)
        dst = tensor_type(state, name, ne, t.type, default) if allowed else t.type
        if allowed and not has_imatrix and requires_imatrix(name, dst, params.ftype):
            raise ValueError(f"this quantization requires an importance matrix (--imatrix): tensor {name} would be "
                             f"{ggml_name(dst)}, which llama-quantize refuses to write without one")
        tensors.append(TensorPlan(name, src, ne, t.type, dst, t.file_index if keep_split else 0))
    for tp in tensors:
        if tp.convert:
            if has_imatrix:
                tp.imatrix = _tensor_imatrix(tp, imatrix, params.ftype)
            _check_conversion(tp, allow_requantize)
    warnings = state.warnings
    if state.n_fallback:
        warnings.append(f"{state.n_fallback} of {len(f.tensors)} tensor(s) required fallback quantization")
    sets = list(overrides)
    if n_blocks is not None:
        sets.append((f"{info.arch}.block_count", V.UINT32, n_blocks))
    plan = Plan(ftype, _metadata(f, ftype, sets, warnings), tensors, warnings)
    _check_shards(plan, f)
    return plan


def _check_shards(plan: Plan, f: GGUFFile) -> None:
    """--keep-split with an input file whose every tensor was pruned, before the last file
    that keeps one: llama-quantize has no output for it and crashes; ggmlpy refuses."""
    used = {tp.split for tp in plan.tensors}
    empty = [i for i in range(1, plan.n_split) if i not in used]
    if empty:
        raise ValueError(f"--keep-split: --prune-layers leaves no tensor in {f.paths[empty[0]]}, "
                         f"so the output cannot keep the input's files")


def _check_conversion(tp: TensorPlan, allow_requantize: bool) -> None:
    """What llama_tensor_dequantize_impl and ggmlpy's encoders can do, and --allow-requantize."""
    if tp.dst_type not in (QUANTIZABLE if tp.imatrix is None else QUANTIZABLE_WITH_IMATRIX):
        why = " without an importance matrix" if tp.dst_type in QUANTIZABLE_WITH_IMATRIX else ""
        raise ValueError(f"tensor {tp.name}: ggmlpy cannot quantize to {ggml_name(tp.dst_type)}{why}")
    readable = tp.src_type in (T.F32, T.F16, T.BF16) or is_quantized(tp.src_type)
    if not readable or tp.src_type not in dequantizable_types():
        raise ValueError(f"tensor {tp.name}: cannot dequantize/convert tensor type {ggml_name(tp.src_type)}")
    if is_quantized(tp.src_type) and not allow_requantize:
        raise ValueError(f"tensor {tp.name}: requantizing from type {ggml_name(tp.src_type)} is disabled "
                         f"(pass --allow-requantize)")


def _tensor_imatrix(tp: TensorPlan, imatrix: Imatrix, ftype: int) -> np.ndarray | None:
    """The importance matrix llama.cpp quantises this tensor with (looked up under its input
    name, as remap_imatrix maps a renumbered layer back), or None where it has no usable data
    (then quantised without, as llama.cpp does, but for the very low-bit types, which it
    refuses)."""
    values = imatrix.data.get(tp.source)
    n_expert = tp.ne[2] if len(tp.ne) > 2 else 1
    if values is not None and len(values) != tp.ne[0] * n_expert:
        if tp.name not in ("token_embd.weight", "per_layer_token_embd.weight"):
            raise ValueError(f"imatrix {imatrix.path}: imatrix size {len(values)} is different from tensor size "
                             f"{tp.ne[0] * n_expert} for {tp.name}")
        values = None   # ignored with a note, as llama.cpp does: the embeddings never match
    if values is None and requires_imatrix(tp.name, tp.dst_type, ftype):
        raise ValueError(f"missing importance matrix for tensor {tp.name} in a very low-bit quantization "
                         f"({ggml_name(tp.dst_type)}): the result would be garbage")
    return None if values is None else np.asarray(values, dtype=np.float32)
