"""The memory of hybrid models (llama.cpp's llama_memory_hybrid): a KV cache for the
attention layers beside recurrent states for the others (Qwen3.5, Qwen3-Next).

Both halves see the same ubatches and the same sequence operations. As llama.cpp's, a
removal is tried on the recurrent half first, which may refuse it (a partial range), so a
refused seq_rm changes neither; a sequence's first and last positions are the narrower of
the two halves'. The ubatches are equal splits the recurrent layers can take
(recurrent.split_blocks).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggmlpy.ir.types import GGMLType
from llama.batch import UBatch
from llama.graph import KVLayout
from llama.graph_inputs import InputState
from llama.hparams import HParams
from llama.kv_cache import KVCache
from llama.kv_cells import KVCellsState, KVCellsUndo, SlotInfo
from llama.recurrent import RecurrentMemory, RSSeqState, RSSlot, RSState


@dataclass(frozen=True)
class HybridSlot:
    attn: SlotInfo
    rs: RSSlot

    @property
    def n_tokens(self) -> int:
        return self.attn.n_tokens


@dataclass(frozen=True)
class HybridState:
    attn: KVCellsState | KVCellsUndo
    rs: RSState


class HybridMemory:
    def __init__(self, hp: HParams, kv_size: int, n_seq_max: int = 1, *, type_k: GGMLType = GGMLType.F16,
                 type_v: GGMLType = GGMLType.F16, n_pad: int = 32, seq_block: int = 0):
        recurrent = [il for il in range(hp.n_layer) if hp.is_recurrent(il)]
        attention = [il for il in range(hp.n_layer) if not hp.is_recurrent(il)]
        self.hp = hp
        self.size = kv_size
        self.attn = KVCache(hp, kv_size, n_seq_max, type_k=type_k, type_v=type_v, n_pad=n_pad,
                            layers=attention, seq_block=seq_block)
        self.rs = RecurrentMemory(hp, n_seq_max, layers=recurrent)
        self._bindings = {**self.attn.bindings(), **self.rs.bindings()}

    @property
    def nbytes(self) -> int:
        return self.attn.nbytes + self.rs.nbytes

    def bindings(self) -> dict[str, np.ndarray]:
        return self._bindings

    def layout(self) -> KVLayout:
        return KVLayout(self.size, self.attn.type_k, self.attn.type_v, rs_rows=self.rs.size,
                        rot_k=self.attn.rot_k, rot_v=self.attn.rot_v)

    # decode -----------------------------------------------------------------------------------
    def prepare(self, ubatches: list[UBatch]) -> list[HybridSlot] | None:
        rs = self.rs.prepare(ubatches)
        if rs is None:
            return None
        attn = self.attn.prepare(ubatches)
        if attn is None:
            return None
        return [HybridSlot(a, r) for a, r in zip(attn, rs)]

    def apply_ubatch(self, slot: HybridSlot, ubatch: UBatch) -> None:
        self.attn.apply_ubatch(slot.attn, ubatch)
        self.rs.begin_ubatch(slot.rs)

    def commit_ubatch(self, slot: HybridSlot) -> None:
        """The ubatch computed: its sequences' states are the ones it wrote."""
        self.rs.commit_ubatch(slot.rs)

    def input_state(self, slot: HybridSlot) -> InputState:
        state = self.attn.input_state(slot.attn)
        state.rs = slot.rs
        return state

    @property
    def has_shift(self) -> bool:
        return self.attn.has_shift

    def k_shift_inputs(self) -> dict[str, np.ndarray]:
        return self.attn.k_shift_inputs()

    def reset_shift(self) -> None:
        self.attn.reset_shift()

    @property
    def can_shift(self) -> bool:
        """As llama.cpp's: the attention half's answer (no for multi-section RoPE)."""
        return self.attn.can_shift

    # the memory interface ---------------------------------------------------------------------
    def clear(self, data: bool = True) -> None:
        self.attn.clear(data)
        self.rs.clear(data)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        if not self.rs.seq_rm(seq_id, p0, p1):
            return False
        return self.attn.seq_rm(seq_id, p0, p1)

    def seq_cp(self, seq_src: int, seq_dst: int, p0: int = -1, p1: int = -1) -> None:
        self.attn.seq_cp(seq_src, seq_dst, p0, p1)
        self.rs.seq_cp(seq_src, seq_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.attn.seq_keep(seq_id)
        self.rs.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.attn.seq_add(seq_id, p0, p1, delta)
        self.rs.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self.attn.seq_div(seq_id, p0, p1, d)
        self.rs.seq_div(seq_id, p0, p1, d)

    def seq_shared(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return self.attn.seq_shared(seq_id, p0, p1)

    def seq_pos_min(self, seq_id: int) -> int:
        return max(self.attn.seq_pos_min(seq_id), self.rs.seq_pos_min(seq_id))

    def seq_pos_max(self, seq_id: int) -> int:
        return min(self.attn.seq_pos_max(seq_id), self.rs.seq_pos_max(seq_id))

    def seq_state(self, seq_id: int) -> RSSeqState:
        """The part of a sequence's memory that cannot be rolled back: its recurrent states
        (llama.cpp's state_seq with LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)."""
        return self.rs.seq_state(seq_id)

    def restore_seq_state(self, seq_id: int, state: RSSeqState) -> None:
        """Back to a checkpoint: the recurrent states as saved, the KV cells after its
        position dropped."""
        self.rs.set_seq_state(seq_id, state)
        self.attn.seq_rm(seq_id, state.pos + 1, -1)

    def snapshot(self) -> HybridState:
        return HybridState(self.attn.snapshot(), self.rs.snapshot())

    def checkpoint(self, slot: HybridSlot) -> HybridState:
        return HybridState(self.attn.checkpoint(slot.attn), self.rs.checkpoint(slot.rs))

    def restore(self, state: HybridState) -> None:
        self.attn.restore(state.attn)
        self.rs.restore(state.rs)
