"""Kernel specifications: one rendered CUDA kernel, named by its own signature.

A `KernelSpec` is a template (the kernel family), the compile-time choices that specialise
it (types, fused epilogue, mode) and the fields of its parameter struct. Its name is a hash
of all three, so the 30 identical layers of a model share one kernel (docs/architecture.md, decision
7's deduplication), and a module is the set of distinct specs its graph needs.

Every runtime value (sizes, strides, pointers, scalars) travels in one struct passed by
value; all fields are 8 bytes, so the host packs it with `struct.pack` and the layout has
no padding on either side.
"""
from __future__ import annotations

import functools
import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ggmlpy.codegen_cuda.render import render
from ggmlpy.quants import iq_grids

FIELD_CODES = {"ptr": "Q", "i64": "q", "f64": "d"}
MAX_PARAM_BYTES = 4096  # CUDA's limit for kernel parameters


@dataclass(frozen=True)
class KernelSpec:
    family: str                               # template stem: "matvec" -> matvec.cu.j2
    variant: tuple[tuple[str, Any], ...]      # compile-time choices, sorted by key
    fields: tuple[tuple[str, str], ...]       # parameter struct: (name, "ptr" | "i64" | "f64")
    cooperative: bool = True                  # uses barriers or shuffles (the emulator asks)

    @staticmethod
    def make(family: str, fields: Iterable[tuple[str, str]], cooperative: bool = True,
             **variant: Any) -> "KernelSpec":
        fields = tuple(fields)
        names = [f for f, _ in fields]
        if len(set(names)) != len(names):
            raise ValueError(f"{family}: duplicate parameter fields in {names}")
        if len(fields) * 8 > MAX_PARAM_BYTES:
            raise ValueError(f"{family}: {len(fields)} parameters exceed CUDA's {MAX_PARAM_BYTES} bytes")
        return KernelSpec(family, tuple(sorted(variant.items())), fields, cooperative)

    @functools.cached_property
    def name(self) -> str:
        digest = hashlib.sha1(repr((self.family, self.variant, self.fields)).encode()).hexdigest()
        return f"gg_{self.family}_{digest[:12]}"

    @property
    def template(self) -> str:
        return f"{self.family}.cu.j2"

    def source(self) -> str:
        return render(self.template, name=self.name, fields=self.fields, **dict(self.variant))

    @functools.cached_property
    def _packer(self) -> struct.Struct:
        return struct.Struct("<" + "".join(FIELD_CODES[k] for _, k in self.fields))

    def pack(self, values: Mapping[str, int | float]) -> bytes:
        """The parameter struct's bytes; every field must be given."""
        try:
            vals = [float(values[f]) if k == "f64" else int(values[f]) for f, k in self.fields]
        except KeyError:
            missing = [f for f, _ in self.fields if f not in values]
            raise KeyError(f"{self.family}: no value for parameter(s) {missing}") from None
        return self._packer.pack(*vals)


@functools.lru_cache(maxsize=1)
def common_tables() -> dict[str, tuple[str, ...]]:
    """The lookup tables common.cu.j2 renders into C initialisers, from ggml's tables in
    ggmlpy/quants/iq_grids.py (the one copy of them): name -> the entries as C literals."""
    def ints(a) -> tuple[str, ...]:
        return tuple(str(int(v)) for v in a)

    def hexes(a, digits: int, suffix: str) -> tuple[str, ...]:
        return tuple(f"0x{int(v):0{digits}x}{suffix}" for v in a)

    g = iq_grids
    return {
        "kvalues_iq4nl": ints(g.KVALUES_IQ4NL),
        "ksigns_iq2xs": ints(g.KSIGNS_IQ2XS),
        "iq2xxs_grid": hexes(g.IQ2XXS_GRID, 16, "ull"),
        "iq2xs_grid": hexes(g.IQ2XS_GRID, 16, "ull"),
        "iq2s_grid": hexes(g.IQ2S_GRID, 16, "ull"),
        "iq1s_grid": hexes(g.IQ1S_GRID, 16, "ull"),
        "iq3xxs_grid": hexes(g.IQ3XXS_GRID, 8, "u"),
        "iq3s_grid": hexes(g.IQ3S_GRID, 8, "u"),
    }


def module_source(specs: Iterable[KernelSpec]) -> str:
    """One translation unit: the shared helpers, then each distinct kernel once."""
    unique = {s.name: s for s in specs}
    parts = [render("common.cu.j2", **common_tables())]
    parts += [unique[name].source() for name in sorted(unique)]
    return "\n".join(parts)


def tensor_fields(prefix: str, ne: bool = True, nb: bool = True, ptr: bool = True) -> list[tuple[str, str]]:
    """The usual fields of a tensor operand: pointer, ne0..3, nb0..3."""
    out: list[tuple[str, str]] = [(prefix, "ptr")] if ptr else []
    if ne:
        out += [(f"{prefix}ne{i}", "i64") for i in range(4)]
    if nb:
        out += [(f"{prefix}nb{i}", "i64") for i in range(4)]
    return out
