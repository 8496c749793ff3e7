"""The interleaved sliding-window KV cache (llama.cpp's llama_kv_cache_iswa).

Models such as Gemma 3 mix global layers, which attend every earlier token, with layers
that only see the last `n_swa` positions. Keeping the windowed layers' keys in a full-size
cache wastes memory (15 of Gemma 3's 18 layers are windowed), so they get a second, smaller
`KVCache` whose cells are recycled once they leave every sequence's window:

    size_swa = pad(min(kv_size, n_swa * n_seq_max + n_ubatch), 256)

(the window of every sequence plus one ubatch of new tokens; `swa_full` makes it as large
as the main cache, as llama.cpp's flag). Both halves see the same ubatches and the same
sequence operations; `prepare` finds slots in both before any ubatch runs, so a batch is
placed in both caches or in neither. The graph binds each layer's buffers by name, so the
windowed layers' caches are simply smaller arrays with the usual `cache_k_l{il}` names.
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
from llama.kv_cells import KVCellsState, KVCellsUndo, SlotInfo, SWAType

SWA_PAD = 256  # llama.cpp always pads the SWA cache to 256 cells (llama.cpp issue 17037)


@dataclass(frozen=True)
class ISWASlot:
    """Where one ubatch goes in each half."""

    base: SlotInfo
    swa: SlotInfo

    @property
    def n_tokens(self) -> int:
        return self.base.n_tokens


@dataclass(frozen=True)
class ISWAState:
    base: KVCellsState | KVCellsUndo
    swa: KVCellsState | KVCellsUndo


def swa_cache_size(kv_size: int, n_swa: int, n_seq_max: int, n_ubatch: int, swa_full: bool = False,
                   pad: int = SWA_PAD) -> int:
    """Cells of the windowed layers' cache: each sequence's window plus one ubatch, padded,
    never more than the main cache (whose size it is with `swa_full`)."""
    if swa_full:
        return kv_size
    need = min(kv_size, n_swa * n_seq_max + n_ubatch)
    return min(kv_size, -(-need // pad) * pad)


class KVCacheISWA:
    """A main cache for the global layers and a windowed cache for the SWA layers."""

    def __init__(self, hp: HParams, kv_size: int, n_seq_max: int = 1, n_ubatch: int = 512, *,
                 swa_full: bool = False, type_k: GGMLType = GGMLType.F16,
                 type_v: GGMLType = GGMLType.F16, n_pad: int = 32, swa_pad: int = SWA_PAD,
                 seq_block: int = 0):
        swa_type = SWAType(hp.extra.get("swa_type", SWAType.STANDARD))
        if hp.n_swa <= 0 or swa_type == SWAType.NONE or not any(hp.swa_layers):
            raise ValueError(f"{hp.arch}: an iSWA cache needs sliding-window layers and n_swa > 0 "
                             f"(n_swa = {hp.n_swa}, swa_type = {swa_type.name})")
        swa_layers = [il for il in range(hp.n_layer) if hp.is_swa(il)]
        base_layers = [il for il in range(hp.n_layer) if not hp.is_swa(il)]
        self.hp = hp
        self.swa_full = swa_full
        size_swa = swa_cache_size(kv_size, hp.n_swa, n_seq_max, n_ubatch, swa_full, swa_pad)
        self.base = KVCache(hp, kv_size, n_seq_max, type_k=type_k, type_v=type_v, n_pad=n_pad,
                            layers=base_layers, seq_block=seq_block)
        self.swa = KVCache(hp, size_swa, n_seq_max, type_k=type_k, type_v=type_v, n_pad=n_pad,
                           layers=swa_layers, swa_type=swa_type, n_swa=hp.n_swa, seq_block=seq_block)
        self.size = kv_size
        self._bindings = {**self.base.bindings(), **self.swa.bindings()}

    @property
    def nbytes(self) -> int:
        return self.base.nbytes + self.swa.nbytes

    def bindings(self) -> dict[str, np.ndarray]:
        return self._bindings

    def layout(self) -> KVLayout:
        return KVLayout(self.base.size, self.base.type_k, self.base.type_v, kv_size_swa=self.swa.size,
                        rot_k=self.base.rot_k, rot_v=self.base.rot_v)

    @property
    def can_shift(self) -> bool:
        """llama.cpp's get_can_shift for iSWA: context shifting is offered only when both
        halves have the same size (K-shift itself works on either)."""
        return self.base.size == self.swa.size

    # decode -----------------------------------------------------------------------------------
    def prepare(self, ubatches: list[UBatch]) -> list[ISWASlot] | None:
        """Slots in both halves for every ubatch, or None (nothing changes either way)."""
        base = self.base.prepare(ubatches)
        if base is None:
            return None
        swa = self.swa.prepare(ubatches)
        if swa is None:
            return None
        return [ISWASlot(b, s) for b, s in zip(base, swa)]

    def apply_ubatch(self, slot: ISWASlot, ubatch: UBatch) -> None:
        self.base.apply_ubatch(slot.base, ubatch)
        self.swa.apply_ubatch(slot.swa, ubatch)

    def commit_ubatch(self, slot: ISWASlot) -> None:
        """After the ubatch computed: nothing to do (KVCache.commit_ubatch)."""

    def input_state(self, slot: ISWASlot) -> InputState:
        state = self.base.input_state(slot.base)
        state.swa = self.swa.input_state(slot.swa)
        return state

    @property
    def has_shift(self) -> bool:
        return self.base.has_shift or self.swa.has_shift

    def k_shift_inputs(self) -> dict[str, np.ndarray]:
        return {"inp_k_shift": self.base.cells.k_shift().astype(np.int32),
                "inp_k_shift_swa": self.swa.cells.k_shift().astype(np.int32)}

    def reset_shift(self) -> None:
        self.base.reset_shift()
        self.swa.reset_shift()

    # the memory interface: every operation on both halves -------------------------------------
    def clear(self, data: bool = True) -> None:
        self.base.clear(data)
        self.swa.clear(data)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        ok_base = self.base.seq_rm(seq_id, p0, p1)
        ok_swa = self.swa.seq_rm(seq_id, p0, p1)
        return ok_base and ok_swa

    def seq_cp(self, seq_src: int, seq_dst: int, p0: int = -1, p1: int = -1) -> None:
        self.base.seq_cp(seq_src, seq_dst, p0, p1)
        self.swa.seq_cp(seq_src, seq_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.base.seq_keep(seq_id)
        self.swa.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.base.seq_add(seq_id, p0, p1, delta)
        self.swa.seq_add(seq_id, p0, p1, delta)

    def seq_shared(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return self.base.seq_shared(seq_id, p0, p1) or self.swa.seq_shared(seq_id, p0, p1)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self.base.seq_div(seq_id, p0, p1, d)
        self.swa.seq_div(seq_id, p0, p1, d)

    def seq_pos_min(self, seq_id: int) -> int:
        """From the SWA half, as llama.cpp: the main cache holds a superset of its positions,
        so this is the oldest position every layer still has (what can be reused)."""
        return self.swa.seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        return self.swa.seq_pos_max(seq_id)

    def snapshot(self) -> ISWAState:
        return ISWAState(self.base.snapshot(), self.swa.snapshot())

    def checkpoint(self, slot: ISWASlot) -> ISWAState:
        """Before apply_ubatch(slot, ...): what `restore` needs to undo it, in both halves."""
        return ISWAState(self.base.checkpoint(slot.base), self.swa.checkpoint(slot.swa))

    def restore(self, state: ISWAState) -> None:
        self.base.restore(state.base)
        self.swa.restore(state.swa)
