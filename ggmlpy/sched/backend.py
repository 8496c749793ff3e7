"""The backend protocol: what the scheduler needs from a device's code generator."""
from __future__ import annotations

from typing import Mapping, Protocol

import numpy as np

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.tensor import Tensor

Bindings = Mapping[str, np.ndarray]  # leaf name -> data (weights, KV cache layers, inputs)


class CompiledSplit(Protocol):
    def run(self, store: "TensorStoreLike", env: Mapping[str, int]) -> None:
        """Compute this split's nodes; symbol values (n_tokens, n_kv, n_outputs) in `env`."""


class TensorStoreLike(Protocol):
    def array(self, t: Tensor, env: Mapping[str, int]) -> np.ndarray: ...


class Backend(Protocol):
    name: str

    def supports_op(self, node: Tensor) -> bool:
        """Whether this backend can compute `node` (the scheduler's fallback decision)."""

    def compile(self, graph: Graph, nodes: list[Tensor]) -> CompiledSplit:
        """Prepare `nodes` (a split of `graph`, in order) for repeated runs."""
