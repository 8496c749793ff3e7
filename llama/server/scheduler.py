"""The step loop: one worker thread owns the context and runs continuous batching.

Each step (llama-server's `update_slots`): drop cancelled tasks, give waiting tasks the
idle slots, then ONE decode of one token from every generating slot plus prompt chunks of
the slots still reading their prompt (up to n_batch tokens in all), then each slot's own
`Sequence.step` on its logits row. Tasks wait in a bounded queue while every slot is
busy; a full queue refuses new ones. A task reports through `sink(kind, payload)`, called
on the worker thread (the HTTP layer forwards it to its event loop): ("step", Step),
("done", None) or ("error", APIError). A failing task fails alone.

A step's events go out together at its end, not one by one as each slot samples: each
event wakes the HTTP event loop, whose Python then fought the sampling of the next slots
for the GIL (tripling it: 4 slots' sampling took 2.1 ms a step in the server against 0.7 ms
alone). Delivered after the last slot, that work overlaps the next decode, which runs
without the GIL.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from llama.api.engine import DecodeError, Engine
from llama.api.sequence import Sequence
from llama.server.errors import APIError
from llama.server.slots import Slot, SlotPool
from llama.speculative import Drafter, accept, draft_budget

log = logging.getLogger("llama.server")

Sink = Callable[[str, Any], None]


@dataclass
class Task:
    seq: Sequence
    sink: Sink
    cache_prompt: bool = True
    id_slot: int = -1
    cancelled: bool = False
    id: int = 0
    slot: int | None = None
    t_queued: float = field(default_factory=time.perf_counter)
    t_start: float = 0.0
    t_first: float = 0.0
    n_cached: int = 0             # prompt tokens taken from the cache (own or shared)
    n_keep: int = 0               # llama-server's context shift: prompt tokens kept (-1 all)
    n_discard: int = 0            # ... and tokens dropped (0: half of the rest)
    n_shifts: int = 0
    return_progress: bool = False  # llama-server's: ("progress", dict) events while the prompt decodes
    parent: "Task | None" = None   # another choice of the same prompt (n > 1), whose cells it shares
    lora: tuple[float, ...] = ()   # the scale of every LoRA adapter, by id (fields.lora_scales)
    n_cache_reuse: int = 0         # llama-server's: cached chunks this long are moved, not re-read


@dataclass
class CallTask:
    """Work on the context between two steps (embeddings, slot files)."""
    fn: Callable[[], Any]
    sink: Sink
    cancelled: bool = False
    id: int = 0


@dataclass
class Stats:
    n_prompt_tokens: int = 0      # prompt tokens decoded (each request's timings.prompt_n, summed)
    n_prompt_cached: int = 0      # prompt tokens the cache held (timings.cache_n, summed)
    t_prompt: float = 0.0
    n_predicted: int = 0          # tokens generated (timings.predicted_n, summed)
    n_tokens_max: int = 0         # the most tokens one slot has held
    t_predicted: float = 0.0
    n_decode: int = 0
    n_busy_slots_total: int = 0
    n_requests: int = 0
    n_failed: int = 0
    t_sampling: float = 0.0       # the slots' sampling after each decode (ggmlpy)
    n_drafts: int = 0             # speculative drafts checked, their tokens, and those accepted
    n_draft_tokens: int = 0
    n_draft_accepted: int = 0
    # llama-server's throughput buckets: tokens decoded and their time since the last scrape
    bucket_prompt: tuple[int, float] = (0, 0.0)
    bucket_predicted: tuple[int, float] = (0, 0.0)

    def take_rates(self) -> tuple[float, float]:
        """(prompt, generation) tokens per second since the last call, which starts anew."""
        rates = tuple(n / t if t else 0.0 for n, t in (self.bucket_prompt, self.bucket_predicted))
        self.bucket_prompt, self.bucket_predicted = (0, 0.0), (0, 0.0)
        return rates


class QueueFull(Exception):
    pass


class Scheduler:
    def __init__(self, engine: Engine, n_slots: int, *, max_queue: int = 64,
                 context_shift: bool = False, kv_unified: bool = False, stats: Stats | None = None,
                 drafter: Drafter | None = None):
        self.engine = engine
        self.drafter = drafter        # speculative decoding's guesses (None: off)
        self.context_shift = context_shift
        self.pool = SlotPool(engine, n_slots, kv_unified=kv_unified)
        self.max_queue = max_queue
        self.stats = stats if stats is not None else Stats()   # a server that slept keeps its counts
        self._pending: deque[Task | CallTask] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._next_id = 0
        self._outbox: list[tuple[Sink, str, Any]] = []  # this step's events, sent at its end
        self._thread = threading.Thread(target=self._run, name="ggmlpy-scheduler", daemon=True)

    # called from the HTTP layer -----------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, task: Task | CallTask) -> None:
        with self._cond:
            if self._stopping:
                raise APIError(503, "the server is shutting down")
            if len(self._pending) >= self.max_queue:
                raise QueueFull()
            self._next_id += 1
            task.id = self._next_id
            self._pending.append(task)
            self._cond.notify()

    def cancel(self, task: Task | CallTask) -> None:
        """The client is gone: a queued task leaves the queue now, a running one frees its
        slot at the start of the next step. Whoever still waits on the task's events gets a
        last one, an error (nginx's 499), so no request handler waits forever."""
        with self._cond:
            if task.cancelled:
                return
            task.cancelled = True
            if task in self._pending:
                self._pending.remove(task)
            task.sink("error", APIError(499, "the client closed the request"))
            self._cond.notify()

    def stop(self, timeout: float = 10.0) -> None:
        """Refuse new tasks, cancel what waits or runs, and join the worker."""
        with self._cond:
            self._stopping = True
            for task in self._pending:
                task.cancelled = True
                task.sink("error", APIError(503, "the server is shutting down"))
            self._pending.clear()
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def n_pending(self) -> int:
        return len(self._pending)

    @property
    def idle(self) -> bool:
        """Nothing waits and no slot runs."""
        return not self._pending and not any(s.busy for s in self.pool.slots)

    # the worker thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._pending and not self._any_busy():
                    self._cond.wait(0.5)
                if self._stopping:
                    break
            try:
                self._step()
            except Exception as e:  # a bug must not kill the server: fail what ran, go on
                log.exception("scheduler step failed")
                self._fail_all(APIError(500, f"internal error: {e}"))
                self._flush()
        self._fail_all(APIError(503, "the server is shutting down"))
        self._flush()

    def _any_busy(self) -> bool:
        return any(s.busy for s in self.pool.slots)

    def _step(self) -> None:
        try:
            self._step_slots()
        finally:
            self._flush()

    def _emit(self, sink: Sink, kind: str, payload: Any) -> None:
        self._outbox.append((sink, kind, payload))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        for sink, kind, payload in outbox:
            sink(kind, payload)

    def _step_slots(self) -> None:
        for slot in self.pool.slots:
            if slot.busy and slot.task.cancelled:
                self.pool.release(slot)
        self._admit()
        items, slots = self._batch()
        if not items:
            return
        t0 = time.perf_counter()
        try:
            rows = self.engine.decode_mixed(items)
        except (DecodeError, ValueError) as e:
            message = str(e)
            if isinstance(e, DecodeError) and e.rc == 1:   # the slots together filled a unified cache
                message = f"Context size has been exceeded: the KV cache is full ({e})"
            for slot in slots:
                self._fail(slot, APIError(500, message))
            return
        t1 = time.perf_counter()
        self._account(items, slots, t1 - t0)
        for slot, (_, toks, want), row in zip(slots, items, rows):
            if slot.next_token is None:
                slot.n_prompt_done += len(toks)
                self.engine.after_prompt_chunk(slot.id, len(slot.task.seq.prompt))
                self._progress(slot)
            if slot.draft:
                self._advance_draft(slot, row)
            elif row is not None:
                self._advance(slot, row)
        self.stats.t_sampling += time.perf_counter() - t1

    def _admit(self) -> None:
        """Waiting tasks into idle slots, in arrival order (a task that asks for a busy
        slot waits without holding back the others)."""
        with self._cond:
            waiting = list(self._pending)
        for task in waiting:
            if isinstance(task, CallTask):  # between two decodes, the context is free
                if self._take(task):
                    self._run_call(task)
                continue
            if self._parent_reading(task):
                continue
            share = task.cache_prompt or task.parent is not None
            slot = self.pool.pick(task.seq.prompt, cache_prompt=task.cache_prompt, id_slot=task.id_slot,
                                  lora=task.lora)
            if slot is None:
                continue
            if not self._take(task):
                continue
            self.pool.assign(slot, task, cache_prompt=share)
            task.slot, task.t_start, task.n_cached = slot.id, time.perf_counter(), slot.n_prompt_done
            self.stats.n_requests += 1
            self._progress(slot)
            if task.seq.finished:  # max_tokens 0
                self._finish(slot)

    def _parent_reading(self, task: Task) -> bool:
        """A further choice waits while the first one still decodes their prompt, then
        starts from its cells (seq_cp, as llama-server copies the first slot's state): the
        prompt is decoded once for every choice but its last token."""
        parent = task.parent
        if parent is None or parent.cancelled or parent.seq.finished:
            return False
        if parent.slot is None:
            return True
        slot = self.pool.slots[parent.slot]
        return slot.task is parent and not slot.generating

    def _progress(self, slot: Slot) -> None:
        """llama-server's prompt_progress: total, cache (tokens the cache held), processed
        (tokens in the cache now, the cached ones included) and time_ms since the start."""
        task = slot.task
        if task.return_progress:
            self._emit(task.sink, "progress", {
                "total": len(task.seq.prompt), "cache": task.n_cached,
                "processed": slot.n_prompt_done,
                "time_ms": (time.perf_counter() - task.t_start) * 1000})

    def _take(self, task: Task | CallTask) -> bool:
        with self._cond:
            if task.cancelled or task not in self._pending:
                return False
            self._pending.remove(task)
            return True

    def _run_call(self, task: CallTask) -> None:
        try:
            self._emit(task.sink, "done", task.fn())
        except APIError as e:
            self._emit(task.sink, "error", e)
        except (ValueError, RuntimeError, OSError) as e:
            self._emit(task.sink, "error", APIError(400, str(e)))

    def _batch(self) -> tuple[list[tuple[int, list[int], int]], list[Slot]]:
        """Generated tokens first (one per slot, never starved) with their drafts, then
        prompt chunks."""
        budget = self.engine.ctx.n_batch
        items, slots = [], []
        generating = [s for s in self.pool.slots if s.generating]
        spare = budget - len(generating)
        for slot in generating:
            slot.draft = self._draft(slot, spare)
            spare -= len(slot.draft)
            if slot.draft:
                self.engine.start_draft(slot.id)
            items.append((slot.id, [slot.next_token] + slot.draft, 1 + len(slot.draft)))
            slots.append(slot)
            budget -= 1 + len(slot.draft)
        for slot in sorted((s for s in self.pool.slots if s.busy and not s.generating),
                           key=lambda s: s.task.id):
            if budget <= 0:
                break
            prompt = slot.task.seq.prompt
            end = min(slot.n_prompt_done + budget, self.engine.next_stop(slot.id, len(prompt)))
            chunk = prompt[slot.n_prompt_done:end]
            last = slot.n_prompt_done + len(chunk) == len(prompt)
            items.append((slot.id, chunk, int(last)))
            slots.append(slot)
            budget -= len(chunk)
        return items, slots

    def _draft(self, slot: Slot, spare: int) -> list[int]:
        """The slot's speculative draft: what the drafter guesses after its tokens, as many
        as fit its context, its max_tokens and the batch (llama-server's get_n_draft_max).
        Its tokens are those of the slot's cache and the pending one: the prompt and the
        generated tokens, or after a context shift what the shift kept (llama-server's
        slot.prompt.tokens; the whole history no longer fits a draft model's context). A
        drafter that fails costs the slot its draft, not its request."""
        if self.drafter is None:
            return []
        seq = slot.task.seq
        n_max = draft_budget(spare, n_past=self.engine.n_past(slot.id), n_ctx=slot.n_ctx,
                             n_remaining=seq.max_tokens - len(seq.tokens))
        if n_max <= 0:
            return []
        try:
            return self.drafter.draft(slot.id, self.engine.cached[slot.id] + [slot.next_token], n_max)
        except Exception:   # a draft model's decode that failed, say: go on without a guess
            log.exception("drafting for slot %d failed", slot.id)
            return []

    def _account(self, items, slots: list[Slot], dt: float) -> None:
        st = self.stats
        n_gen = sum(1 for s in slots if s.generating)
        n_prompt = sum(len(t) for s, (_, t, _) in zip(slots, items) if not s.generating)
        n = n_gen + n_prompt
        st.n_decode += 1
        st.n_busy_slots_total += sum(1 for s in self.pool.slots if s.busy)
        if n:
            st.t_predicted += dt * n_gen / n
            st.t_prompt += dt * n_prompt / n
            st.bucket_prompt = (st.bucket_prompt[0] + n_prompt, st.bucket_prompt[1] + dt * n_prompt / n)
            st.bucket_predicted = (st.bucket_predicted[0] + n_gen, st.bucket_predicted[1] + dt * n_gen / n)

    def _advance(self, slot: Slot, row) -> None:
        self._first_token(slot)
        try:
            step = slot.task.seq.step(row)
        except Exception as e:  # a grammar or sampler failure ends this task only
            self._fail(slot, APIError(500, f"sampling failed: {e}"))
            return
        self._took(slot, step)

    def _advance_draft(self, slot: Slot, rows) -> None:
        """The rows of [next_token, *draft]: sampled while they agree with the draft, the
        rejected draft tokens dropped from the cache, then each step reported as one."""
        task, draft = slot.task, slot.draft
        slot.draft = []
        self._first_token(slot)
        try:
            steps, n_kept = accept(task.seq, rows, draft)
        except Exception as e:
            self._fail(slot, APIError(500, f"sampling failed: {e}"))
            return
        try:
            self.engine.settle_draft(slot.id, [slot.next_token, *draft], n_kept)
        except DecodeError as e:   # a recurrent state's replay of the kept tokens
            self._fail(slot, APIError(500, str(e)))
            return
        st = self.stats
        st.n_drafts += 1
        st.n_draft_tokens += len(draft)
        st.n_draft_accepted += len(steps) - 1
        task.seq.n_drafted += len(draft)
        task.seq.n_draft_accepted += len(steps) - 1
        for step in steps[:-1]:
            self._emit(task.sink, "step", step)
        self._took(slot, steps[-1])

    def _first_token(self, slot: Slot) -> None:
        task = slot.task
        if not task.t_first:
            task.t_first = time.perf_counter()
            self.stats.n_prompt_tokens += len(task.seq.prompt) - task.n_cached
            self.stats.n_prompt_cached += task.n_cached

    def _took(self, slot: Slot, step) -> None:
        """A step's token was sampled: report it, then end the task or decode it next."""
        task = slot.task
        self._emit(task.sink, "step", step)
        if task.seq.finished:
            self._finish(slot)
            return
        slot.next_token = step.token
        if self.engine.n_past(slot.id) + 1 > slot.n_ctx and not self._shift(slot):
            self._emit(task.sink, "step", task.seq.stop_for_context())
            self._finish(slot)

    def _shift(self, slot: Slot) -> bool:
        """llama-server's context shift, when it is on: keep n_keep tokens (after the BOS),
        drop n_discard after them (half the rest by default) and go on."""
        if not self.context_shift:
            return False
        task, n_past = slot.task, self.engine.n_past(slot.id)
        bos = 1 if self.engine.ctx.model.vocab.add_bos else 0
        n_keep = len(task.seq.prompt) if task.n_keep < 0 else task.n_keep + bos
        n_keep = max(0, min(slot.n_ctx - 4, n_keep))
        n_discard = task.n_discard or (n_past - n_keep) // 2
        if not self.engine.shift_context(slot.id, n_keep, n_discard):
            return False
        task.n_shifts += 1
        return True

    def _finish(self, slot: Slot) -> None:
        task = slot.task
        st = self.stats
        st.n_predicted += len(task.seq.tokens)
        st.n_tokens_max = max(st.n_tokens_max, len(task.seq.prompt) + len(task.seq.tokens))
        self.pool.release(slot)
        self._emit(task.sink, "done", None)

    def _fail(self, slot: Slot, err: APIError) -> None:
        task = slot.task
        self.pool.release(slot)
        self.stats.n_failed += 1
        self._emit(task.sink, "error", err)

    def _fail_all(self, err: APIError) -> None:
        for slot in self.pool.slots:
            if slot.busy:
                self._fail(slot, err)
