"""The KV cache: cell bookkeeping (`KVCells`) plus one K and one V buffer per layer.

Buffers are [kv_size, n_embd_{k,v}_gqa] in the cache's type (f16 by default; numpy order; a
quantised type's rows are its blocks' bytes, so the cache takes what the type says per row),
named `cache_k_l{il}` and `cache_v_l{il}` as in llama.cpp; graphs bind them by name and write
new rows with set_rows (which quantises them for a quantised cache).
A cache may hold only some layers (`layers`, llama.cpp's layer filter) and serve a sliding
window (`swa_type`/`n_swa`): that is how `KVCacheISWA` builds its two halves.

The seq_* methods are the public `ctx.memory` interface; prepare / apply_ubatch /
input_state / layout and the K-shift methods are what `Context.decode` uses, shared with
`KVCacheISWA` so the context treats both alike.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from ggmlpy.ir.types import GGMLType, is_quantized, row_size
from ggmlpy.sched.store import NUMPY_DTYPES
from llama.batch import UBatch
from llama.graph import KVLayout
from llama.graph_inputs import InputState
from llama.hparams import HParams
from llama.kv_cells import KVCells, KVCellsState, KVCellsUndo, SlotInfo, SWAType
from llama.kv_types import KV_TYPE_NAMES, KV_TYPES, rotation_sizes

__all__ = ["KV_TYPES", "KV_TYPE_NAMES", "KVCache", "kv_buffer"]


def kv_buffer(rows: int, n: int, t: GGMLType) -> np.ndarray:
    """One layer's cleared K or V buffer: rows x n elements of type t, a quantised type's
    rows as bytes (row_size: n / block size blocks of the type's size each)."""
    if is_quantized(t):
        return _cleared((rows, row_size(t, n)), np.uint8)
    return _cleared((rows, n), NUMPY_DTYPES[t])


def _cleared(shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
    """Zeros written out, as llama.cpp clears its KV buffers: np.zeros maps pages lazily, and
    each first write into one then faults inside a kernel; in a batched decode step the
    sequences' new cells lie on different pages, and those faults took a tenth of the step
    (bench/profile_decode.py --seqs 4: set_rows 0.9 of 10 ms, SmolLM2)."""
    out = np.empty(shape, dtype)
    out.fill(0)
    return out


class KVCache:
    def __init__(self, hp: HParams, kv_size: int, n_seq_max: int = 1, *,
                 type_k: GGMLType = GGMLType.F16, type_v: GGMLType = GGMLType.F16, n_pad: int = 32,
                 layers: Iterable[int] | None = None, swa_type: SWAType | int = SWAType.NONE,
                 n_swa: int = 0, seq_block: int = 0):
        self.hp = hp
        self.size = kv_size
        self.type_k, self.type_v = type_k, type_v
        self.rot_k, self.rot_v = rotation_sizes(hp, type_k, type_v)   # Hadamard sizes (kv_types.py)
        # by default every layer that owns a cache (later Gemma 4 layers read an earlier one's)
        own = [il for il in range(hp.n_layer) if hp.has_kv(il)]
        self.layers = own if layers is None else sorted(set(layers) & set(own))
        if any(not 0 <= il < hp.n_layer for il in self.layers):
            raise ValueError(f"KV cache layers {self.layers} are not all in [0, {hp.n_layer})")
        self.cells = KVCells(kv_size, n_seq_max, n_pad=n_pad, swa_type=swa_type, n_swa=n_swa,
                             seq_block=seq_block)
        self.k = {il: kv_buffer(kv_size, hp.n_embd_k_gqa(il), type_k) for il in self.layers}
        # MLA reads V from K's rows: its V buffers are empty (kept, so every layer has both)
        self.v = {il: kv_buffer(kv_size, hp.n_embd_v_cache(il), type_v) for il in self.layers}
        self._bindings = {f"cache_k_l{il}": k for il, k in self.k.items()}
        self._bindings.update({f"cache_v_l{il}": v for il, v in self.v.items()})

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k.values()) + sum(a.nbytes for a in self.v.values())

    def bindings(self) -> dict[str, np.ndarray]:
        return self._bindings

    def layout(self) -> KVLayout:
        return KVLayout(self.size, self.type_k, self.type_v, rot_k=self.rot_k, rot_v=self.rot_v)

    # decode (llama_kv_cache::prepare / apply, the graph inputs) --------------------------------
    def prepare(self, ubatches: list[UBatch]) -> list[SlotInfo] | None:
        """A slot for every ubatch, or None; nothing changes either way."""
        return self.cells.prepare(ubatches)

    def apply_ubatch(self, slot: SlotInfo, ubatch: UBatch) -> None:
        self.cells.apply_ubatch(slot, ubatch)

    def commit_ubatch(self, slot: SlotInfo) -> None:
        """After the ubatch computed: nothing to do, its K and V are already in place."""

    def input_state(self, slot: SlotInfo) -> InputState:
        """Cells, slot and n_kv for the graph inputs; call after apply_ubatch."""
        return InputState(self.cells, slot, self.cells.get_n_kv())

    @property
    def has_shift(self) -> bool:
        return self.cells.has_shift

    def k_shift_inputs(self) -> dict[str, np.ndarray]:
        return {"inp_k_shift": self.cells.k_shift().astype(np.int32)}

    def reset_shift(self) -> None:
        self.cells.reset_shift()

    # the memory interface (llama_memory_*) ----------------------------------------------------
    def clear(self, data: bool = True) -> None:
        self.cells.clear()
        if data:
            for a in list(self.k.values()) + list(self.v.values()):
                a.fill(0)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return self.cells.seq_rm(seq_id, p0, p1)

    def seq_cp(self, seq_src: int, seq_dst: int, p0: int = -1, p1: int = -1) -> None:
        self.cells.seq_cp(seq_src, seq_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.cells.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions; cached keys are re-rotated (K-shift) before the next decode."""
        self._check_shift("seq_add")
        self.cells.seq_add(seq_id, p0, p1, delta)

    def _check_shift(self, op: str) -> None:
        """llama.cpp asserts (aborts) here with multi-section RoPE: its keys cannot be
        re-rotated by one position delta."""
        if self.hp.n_pos_per_embd > 1:
            raise ValueError(f"{op}: positions cannot be moved in the KV cache of a model with multi-section "
                             f"RoPE ({self.hp.arch})")

    def seq_shared(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return self.cells.seq_shared(seq_id, p0, p1)

    @property
    def can_shift(self) -> bool:
        """Context shifting (seq_add + K-shift) is possible on a full-attention cache unless
        the model's RoPE has several sections (llama_kv_cache::get_can_shift)."""
        return self.hp.n_pos_per_embd == 1

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self._check_shift("seq_div")
        self.cells.seq_div(seq_id, p0, p1, d)

    def seq_pos_min(self, seq_id: int) -> int:
        return self.cells.seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        return self.cells.seq_pos_max(seq_id)

    def snapshot(self) -> KVCellsState:
        return self.cells.snapshot()

    def checkpoint(self, slot: SlotInfo) -> KVCellsState | KVCellsUndo:
        """Before apply_ubatch(slot, ...): what `restore` needs to undo it (KVCells.checkpoint)."""
        return self.cells.checkpoint(slot)

    def restore(self, state: KVCellsState | KVCellsUndo) -> None:
        self.cells.restore(state)
