"""Slots: one sequence of the shared context each, as llama-server's `server_slot`.

A new request goes to the idle slot whose cached tokens share the longest prefix with its
prompt (`cache_prompt`), so a chat's next turn re-reads nothing. Beyond llama-server, when
another slot (busy or idle) holds a longer prefix of the prompt, its cells are shared into
the chosen slot with `seq_cp`: a system prompt common to many clients is stored and
decoded once. Sliding-window caches drop old cells, so sharing is off for them.

Cached cells hold what the slot's LoRA scales made of the prompt (its `lora`): a request
with other scales reuses no prefix computed with different ones, its own slot's or another's
(llama-server clears the slot's cache on such a change). The slot's scales are its
sequence's in the context (Context.set_seq_adapters_lora), so slots with different
adapters still decode in one batch, where llama-server batches only equal ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llama.api.engine import Engine, common_prefix
from llama.kv_cache import KVCache
from llama.kv_cells import KVCells
from llama.memory_hybrid import HybridMemory


@dataclass
class Slot:
    id: int
    n_ctx: int
    task: Any = None              # the Task being served, None when idle
    n_prompt_done: int = 0        # prompt tokens of the task already in the cache
    next_token: int | None = None  # the sampled token to decode next step
    last_used: int = 0
    n_shared_in: int = 0          # prompt tokens taken from another slot's cells
    lora: tuple[float, ...] = ()  # the LoRA scales its cached cells were computed with
    params: dict = field(default_factory=dict)
    draft: list[int] = field(default_factory=list)   # the speculative draft decoded after next_token

    @property
    def busy(self) -> bool:
        return self.task is not None

    @property
    def generating(self) -> bool:
        return self.task is not None and self.next_token is not None


def base_cells(engine: Engine) -> KVCells:
    """The cells of the full-attention cache (the only one of a non-SWA model; a hybrid
    model's attention layers')."""
    mem = engine.ctx.memory
    if isinstance(mem, HybridMemory):
        return mem.attn.cells
    return mem.cells if isinstance(mem, KVCache) else mem.base.cells


def shared_cells(cells: KVCells, seq_id: int | None = None) -> int:
    """Cells held by more than one sequence (those of `seq_id` only, if given)."""
    multi = cells.seq.sum(axis=1) > 1
    if seq_id is not None:
        multi &= cells.seq[:, seq_id]
    return int(np.count_nonzero(multi))


class SlotPool:
    def __init__(self, engine: Engine, n_slots: int, *, share_prefix: bool = True, kv_unified: bool = False):
        """kv_unified: every slot may fill the whole context (llama-server's --kv-unified),
        the slots competing for the cache's cells; otherwise each has its share of it."""
        self.engine = engine
        n_ctx = engine.ctx.n_ctx if kv_unified else engine.ctx.n_ctx // n_slots
        self.slots = [Slot(i, n_ctx) for i in range(n_slots)]
        self.share_prefix = share_prefix and not engine.n_swa
        self._clock = 0

    def idle(self) -> list[Slot]:
        return [s for s in self.slots if not s.busy]

    def pick(self, prompt: list[int], *, cache_prompt: bool, id_slot: int = -1,
             lora: tuple[float, ...] = ()) -> Slot | None:
        """The idle slot for `prompt` (None if none is idle, or the asked one is busy)."""
        idle = self.idle()
        if id_slot >= 0:
            return next((s for s in idle if s.id == id_slot), None)
        if not idle:
            return None
        if cache_prompt:
            return max(idle, key=lambda s: (common_prefix(self.engine.cached[s.id], prompt)
                                            if s.lora == lora else 0, -s.last_used))
        return min(idle, key=lambda s: s.last_used)

    def assign(self, slot: Slot, task: Any, *, cache_prompt: bool) -> None:
        """Bind `task` to `slot` and make its cache hold the longest reusable prefix of the
        prompt: its own, or another slot's shared through `seq_cp`."""
        engine, prompt = self.engine, task.seq.prompt
        same_lora = slot.lora == task.lora
        keep = engine.reusable_prefix(slot.id, prompt) if cache_prompt and same_lora else 0
        if cache_prompt and same_lora and task.n_cache_reuse > 0:
            keep = engine.reuse_chunks(slot.id, prompt, keep, task.n_cache_reuse)
        keep = engine.forget(slot.id, keep)
        slot.n_shared_in = 0
        if engine.ctx.model.loras:
            self._apply_lora(slot, task.lora)
        # a recurrent state holds all of a sequence's tokens: no prefix of it can be shared
        if cache_prompt and self.share_prefix and not engine.ctx.recurrent:
            donor, n = self._best_donor(slot, prompt)
            if n > keep:
                engine.forget(slot.id, 0)
                engine.ctx.memory.seq_cp(donor, slot.id, 0, n)
                engine.cached[slot.id] = list(prompt[:n])
                slot.n_shared_in = n
                keep = n
        self._clock += 1
        slot.task, slot.n_prompt_done, slot.next_token = task, keep, None
        slot.last_used = self._clock

    def _apply_lora(self, slot: Slot, scales: tuple[float, ...]) -> None:
        adapters = self.engine.ctx.model.loras
        self.engine.ctx.set_seq_adapters_lora(
            slot.id, {adapters[i]: s for i, s in enumerate(scales) if s != 0.0})
        slot.lora = scales

    def _best_donor(self, slot: Slot, prompt: list[int]) -> tuple[int, int]:
        best, n_best = -1, 0
        for other in self.slots:
            if other.id == slot.id or other.lora != slot.lora:
                continue
            n = min(common_prefix(self.engine.cached[other.id], prompt), len(prompt) - 1)
            if n > n_best:
                best, n_best = other.id, n
        return best, n_best

    def release(self, slot: Slot) -> None:
        """The task is over; the slot keeps its cache for the next prompt to reuse."""
        slot.task, slot.next_token, slot.draft = None, None, []

    def erase(self, slot: Slot) -> int:
        n = self.engine.n_past(slot.id)
        self.engine.forget(slot.id, 0)
        return n

    def stats(self) -> dict:
        cells = base_cells(self.engine)
        return {"cells_used": cells.used, "cells_shared": shared_cells(cells),
                "cells_total": cells.size}
