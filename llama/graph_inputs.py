"""Graph inputs, as llama.cpp's llm_graph_input_*: each owns some input leaves, fills them for
a ubatch (`set_input`) and says whether a graph built earlier can serve new params
(`can_reuse`). Together they decide graph reuse (SPEC step 13)."""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llama.batch import UBatch
    from llama.kv_cells import KVCells, SlotInfo


@dataclass(frozen=True)
class GraphParams:
    """Everything about a ubatch that shapes the graph's topology (not its sizes)."""

    tokens_class: str  # "single" (decode: one token) or "multi" (prompt); see README
    use_embd: bool     # embeddings instead of token ids
    kv_size: int

    @staticmethod
    def for_ubatch(ub: "UBatch", kv_size: int) -> "GraphParams":
        return GraphParams("single" if ub.n_tokens == 1 else "multi", ub.embd is not None, kv_size)


@dataclass
class InputState:
    """What set_input needs besides the ubatch: the cache cells and this ubatch's slot.

    `swa` is the same for the separate sliding-window cache of an iSWA memory."""

    cells: "KVCells"
    slot: "SlotInfo"
    n_kv: int
    swa: "InputState | None" = None

    def symbols(self) -> dict[str, int]:
        """The values of the cache-size symbols for this ubatch (n_kv, n_kv_swa)."""
        out = {"n_kv": self.n_kv}
        if self.swa is not None:
            out["n_kv_swa"] = self.swa.n_kv
        return out


class GraphInput(abc.ABC):
    names: tuple[str, ...] = ()

    @abc.abstractmethod
    def set_input(self, ub: "UBatch", state: InputState) -> dict[str, np.ndarray]:
        """The arrays of this input's leaves for the ubatch, by leaf name."""

    def can_reuse(self, params: GraphParams) -> bool:
        return True


class InpTokens(GraphInput):
    names = ("inp_tokens",)

    def set_input(self, ub, state):
        return {"inp_tokens": np.ascontiguousarray(ub.tokens, dtype=np.int32)}

    def can_reuse(self, params):
        return not params.use_embd


class InpEmbd(GraphInput):
    names = ("inp_embd",)

    def set_input(self, ub, state):
        return {"inp_embd": np.ascontiguousarray(ub.embd, dtype=np.float32)}

    def can_reuse(self, params):
        return params.use_embd


class InpPos(GraphInput):
    names = ("inp_pos",)

    def set_input(self, ub, state):
        return {"inp_pos": np.ascontiguousarray(ub.pos, dtype=np.int32)}


class InpOutIds(GraphInput):
    """Rows of the ubatch whose logits are wanted; the last layer keeps only those."""

    names = ("inp_out_ids",)

    def set_input(self, ub, state):
        return {"inp_out_ids": np.flatnonzero(ub.output).astype(np.int32)}


@dataclass
class InpAttnKV(GraphInput):
    """KV write indices and the attention mask, plus the sliding-window mask when used.

    iswa: the SWA layers have their own cache, so they get their own write indices and a
    mask over that cache's cells (from `state.swa`); otherwise the SWA mask covers the
    same cells as the main one."""

    n_swa: int = 0
    swa_type: int = 0
    causal: bool = True
    iswa: bool = False

    @property
    def names(self) -> tuple[str, ...]:  # type: ignore[override]
        if self.iswa:
            return ("inp_k_idxs", "inp_kq_mask", "inp_k_idxs_swa", "inp_kq_mask_swa")
        return ("inp_k_idxs", "inp_kq_mask") + (("inp_kq_mask_swa",) if self.n_swa else ())

    def set_input(self, ub, state):
        from llama.kv_cells import SWAType

        cells = state.cells
        out = {
            "inp_k_idxs": cells.k_idxs(state.slot).astype(np.int64),
            "inp_kq_mask": cells.kq_mask(ub, state.n_kv, causal=self.causal, swa_type=SWAType.NONE),
        }
        if self.iswa:
            swa = state.swa
            if swa is None:
                raise ValueError("the graph was built for a separate SWA cache, but the memory has none")
            out["inp_k_idxs_swa"] = swa.cells.k_idxs(swa.slot).astype(np.int64)
            # the SWA cache's cells know their own window (swa_type None)
            out["inp_kq_mask_swa"] = swa.cells.kq_mask(ub, swa.n_kv, causal=self.causal)
        elif self.n_swa:
            out["inp_kq_mask_swa"] = cells.kq_mask(ub, state.n_kv, causal=self.causal,
                                                   swa_type=SWAType(self.swa_type), n_swa=self.n_swa)
        return out

    def can_reuse(self, params):
        return True
