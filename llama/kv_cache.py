"""The KV cache: cell bookkeeping (`KVCells`) plus one K and one V buffer per layer.

Buffers are [kv_size, n_embd_{k,v}_gqa] in f16 (numpy order), named `cache_k_l{il}` and
`cache_v_l{il}` as in llama.cpp; graphs bind them by name and write new rows with set_rows.
The seq_* methods are the public `ctx.memory` interface.
"""
from __future__ import annotations

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.store import NUMPY_DTYPES
from llama.hparams import HParams
from llama.kv_cells import KVCells, KVCellsState

KV_TYPES = {"f16": GGMLType.F16, "f32": GGMLType.F32, "bf16": GGMLType.BF16}


class KVCache:
    def __init__(self, hp: HParams, kv_size: int, n_seq_max: int = 1, *,
                 type_k: GGMLType = GGMLType.F16, type_v: GGMLType = GGMLType.F16, n_pad: int = 32):
        self.hp = hp
        self.size = kv_size
        self.type_k, self.type_v = type_k, type_v
        self.cells = KVCells(kv_size, n_seq_max, n_pad=n_pad)
        self.k = [np.zeros((kv_size, hp.n_embd_k_gqa(il)), NUMPY_DTYPES[type_k]) for il in range(hp.n_layer)]
        self.v = [np.zeros((kv_size, hp.n_embd_v_gqa(il)), NUMPY_DTYPES[type_v]) for il in range(hp.n_layer)]
        self._bindings = {f"cache_k_l{il}": k for il, k in enumerate(self.k)}
        self._bindings.update({f"cache_v_l{il}": v for il, v in enumerate(self.v)})

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def bindings(self) -> dict[str, np.ndarray]:
        return self._bindings

    # the memory interface (llama_memory_*) ----------------------------------------------------
    def clear(self, data: bool = True) -> None:
        self.cells.clear()
        if data:
            for a in self.k + self.v:
                a.fill(0)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return self.cells.seq_rm(seq_id, p0, p1)

    def seq_cp(self, seq_src: int, seq_dst: int, p0: int = -1, p1: int = -1) -> None:
        self.cells.seq_cp(seq_src, seq_dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.cells.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift positions; cached keys are re-rotated (K-shift) before the next decode."""
        self.cells.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self.cells.seq_div(seq_id, p0, p1, d)

    def seq_pos_min(self, seq_id: int) -> int:
        return self.cells.seq_pos_min(seq_id)

    def seq_pos_max(self, seq_id: int) -> int:
        return self.cells.seq_pos_max(seq_id)

    def snapshot(self) -> KVCellsState:
        return self.cells.snapshot()

    def restore(self, state: KVCellsState) -> None:
        self.cells.restore(state)
