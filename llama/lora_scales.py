"""Which LoRA adapters a context applies, with what scale, for which sequence.

llama.cpp applies a context's adapters to every token (llama_set_adapter_lora), and
llama-server batches together only the slots whose adapters and scales are equal. Here the
scale reaches the graph as an input of one value per token (`inp_lora_scale.<id>`, and
`inp_lora_scale_out.<id>` for the rows after the output selection), so a sequence may have
scales of its own (`set_seq`) and one decode serves sequences with different adapters: a
token without the adapter gets 0. Changing a scale changes an input, not the graph; the
graph does change with the set of adapters the ubatch uses (`active`), so a ubatch that
uses none runs the model's plain graph.

A sequence's cached keys and values were computed with the scales it had then: whoever
changes them (the server, on a new request) decides whether the cache still holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llama.adapter import LoraAdapter
from llama.graph_inputs import GraphInput, fill_input

if TYPE_CHECKING:
    from llama.batch import UBatch


class LoraScales:
    """A context's adapter scales: one set for every sequence, and overrides per sequence."""

    def __init__(self) -> None:
        self.context: dict[LoraAdapter, float] = {}
        self.per_seq: dict[int, dict[LoraAdapter, float]] = {}

    def set(self, adapter: LoraAdapter, scale: float) -> None:
        self.context[adapter] = float(scale)

    def remove(self, adapter: LoraAdapter) -> bool:
        return self.context.pop(adapter, None) is not None

    def clear(self) -> None:
        self.context.clear()

    def set_seq(self, seq_id: int, scales: dict[LoraAdapter, float] | None) -> None:
        """The scales of one sequence (an adapter it leaves out gets 0); None: the context's."""
        if scales is None:
            self.per_seq.pop(seq_id, None)
        else:
            self.per_seq[seq_id] = {a: float(s) for a, s in scales.items()}

    def of_seq(self, seq_id: int) -> dict[LoraAdapter, float]:
        return self.per_seq.get(seq_id, self.context)

    @property
    def empty(self) -> bool:
        return not self.context and not self.per_seq

    def active(self, ub: "UBatch") -> tuple[int, ...]:
        """The ids of the adapters some token of the ubatch uses (a scale other than 0)."""
        if self.empty:
            return ()
        ids: set[int] = set()
        for seq_id in {s[0] for s in ub.seq_ids}:
            ids.update(a.id for a, s in self.of_seq(seq_id).items() if s != 0.0)
        return tuple(sorted(ids))

    def token_scales(self, adapter: LoraAdapter, ub: "UBatch") -> np.ndarray:
        """The adapter's scale for every token of the ubatch (a token of several sequences,
        a shared prompt, takes its first sequence's)."""
        firsts = np.fromiter((s[0] for s in ub.seq_ids), np.int64, ub.n_tokens)
        seqs, where = np.unique(firsts, return_inverse=True)
        per_seq = np.array([self.of_seq(int(s)).get(adapter, 0.0) for s in seqs], np.float32)
        return per_seq[where]


@dataclass
class InpLoraScale(GraphInput):
    """The per-token scales of one adapter, for the rows of every token and, when the
    graph adapts a product after the output selection, for the output rows."""

    adapter: LoraAdapter
    scales: LoraScales
    outputs: bool = False  # also the `_out` leaf

    @property
    def names(self) -> tuple[str, ...]:  # type: ignore[override]
        return (token_leaf(self.adapter.id),) + ((output_leaf(self.adapter.id),) if self.outputs else ())

    def set_input(self, ub, state, bufs=None):
        values = self.scales.token_scales(self.adapter, ub)
        out = {token_leaf(self.adapter.id): fill_input(bufs, token_leaf(self.adapter.id), np.float32,
                                                  values.reshape(ub.n_tokens, 1))}
        if self.outputs:
            rows = values[ub.output].reshape(-1, 1)
            out[output_leaf(self.adapter.id)] = fill_input(bufs, output_leaf(self.adapter.id), np.float32, rows)
        return out

    def can_reuse(self, params):
        return self.adapter.id in params.loras


def token_leaf(adapter_id: int) -> str:
    return f"inp_lora_scale.{adapter_id}"


def output_leaf(adapter_id: int) -> str:
    return f"inp_lora_scale_out.{adapter_id}"
