"""Tensor tables: what tensors an architecture expects, checked against the file.

A model file declares its tensors like llama_model::load_tensors does (`create_tensor` with
an expected shape, optional or not); `TensorTable.resolve` checks every one against the
GGUF and hands back `WeightRef`s grouped like llama.cpp's `model.layers[il].wq`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Mapping

from ggmlpy.gguf import TensorInfo
from ggmlpy.ir.types import GGMLType


class TensorLoadError(ValueError):
    """A tensor is missing, misshapen, or unexpected."""


@dataclass(frozen=True)
class WeightRef:
    """A model weight: the name the graph binds and the file tensor behind it."""

    name: str
    type: GGMLType
    ne: tuple[int, ...]


@dataclass
class _Spec:
    attr: str
    name: str
    ne: tuple[int, ...]
    optional: bool


@dataclass
class TensorTable:
    globals: list[_Spec] = field(default_factory=list)
    layers: list[list[_Spec]] = field(default_factory=list)

    def add(self, attr: str, name: str, ne: tuple[int, ...], optional: bool = False) -> None:
        self.globals.append(_Spec(attr, name, tuple(ne), optional))

    def add_layer(self, il: int, attr: str, name: str, ne: tuple[int, ...], optional: bool = False) -> None:
        while len(self.layers) <= il:
            self.layers.append([])
        self.layers[il].append(_Spec(attr, f"blk.{il}.{name}", tuple(ne), optional))

    def add_gated_ffn(self, il: int, n_embd: int, n_ff: int) -> None:
        """The gate, up and down projections of a GLU feed-forward block."""
        self.add_layer(il, "ffn_gate", "ffn_gate.weight", (n_embd, n_ff))
        self.add_layer(il, "ffn_up", "ffn_up.weight", (n_embd, n_ff))
        self.add_layer(il, "ffn_down", "ffn_down.weight", (n_ff, n_embd))

    def resolve(self, tensors: Mapping[str, TensorInfo], strict: bool = True
                ) -> tuple[SimpleNamespace, list[SimpleNamespace]]:
        used: set[str] = set()

        def one(spec: _Spec) -> WeightRef | None:
            info = tensors.get(spec.name)
            if info is None:
                if spec.optional:
                    return None
                raise TensorLoadError(f"missing tensor {spec.name!r}")
            ne = tuple(info.ne) + (1,) * (len(spec.ne) - len(info.ne))
            if ne[: len(spec.ne)] != spec.ne or any(n != 1 for n in ne[len(spec.ne):]):
                raise TensorLoadError(f"tensor {spec.name!r} has shape {list(info.ne)}, "
                                      f"expected {list(spec.ne)}")
            used.add(spec.name)
            return WeightRef(spec.name, info.type, tuple(info.ne))

        top = SimpleNamespace(**{s.attr: one(s) for s in self.globals})
        layers = [SimpleNamespace(**{s.attr: one(s) for s in specs}) for specs in self.layers]
        extra = sorted(set(tensors) - used)
        if strict and extra:
            raise TensorLoadError(f"the file has {len(extra)} tensors this architecture does not "
                                  f"use: {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
        return top, layers
