"""What the routes share: the config, and once loaded the Llama and its scheduler.
The model loads in a thread after the server starts listening, so `/health` can answer
503 while it loads, as llama-server's does."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from llama.chat.caps import template_caps
from llama.chat.template import ChatTemplate
from llama.sampling.dry import DEFAULT_BREAKERS
from llama.server.config import ServerConfig
from llama.server.errors import APIError
from llama.server.scheduler import Scheduler, Stats
from llama.server.speculation import make_drafter

log = logging.getLogger("llama.server")


@dataclass
class ServerState:
    config: ServerConfig
    llm: object = None            # llama.Llama once loaded
    scheduler: Scheduler | None = None
    load_error: str | None = None
    loaded: threading.Event = field(default_factory=threading.Event)
    # the server's adapter scales, by adapter id (--lora, POST /lora-adapters): a request
    # without a `lora` field takes them as they are when it arrives
    lora_scales: tuple[float, ...] = ()
    started: int = field(default_factory=lambda: int(time.time()))   # Unix time the server started
    # --sleep-idle-seconds: the model unloaded while idle (llama/server/sleep.py); what the
    # read-only routes still report meanwhile
    sleeping: bool = False
    last_used: float = field(default_factory=time.monotonic)
    template_source: str = ""
    template_caps: dict = field(default_factory=dict)   # /props' chat_template_caps
    slot_n_ctx: int = 0
    stats: Stats | None = None    # the scheduler's counters, kept across sleeps
    metrics_snapshot: list | None = None
    _wake_lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def vocab(self):
        """The loaded model's vocabulary (what request fields with texts tokenize with)."""
        return self.llm.model.vocab

    def load(self) -> None:
        """Load the model and start the scheduler (on a thread of its own)."""
        try:
            self.llm = load_llama(self.config)
            scales = load_adapters(self.llm, self.config)
            self.set_lora_scales(self.lora_scales if self.sleeping else scales)   # waking: as they were
            # DRY's breakers search an index of every token's text (0.25 s for SmolLM2): now, not
            # in the event loop on the first request that turns DRY on
            self.llm.dry_breakers(DEFAULT_BREAKERS)
            self.llm.engine.set_max_checkpoints(self.config.ctx_checkpoints)
            self.scheduler = Scheduler(self.llm.engine, self.config.parallel, stats=self.stats,
                                       max_queue=self.config.max_queue,
                                       context_shift=self.config.context_shift,
                                       kv_unified=self.config.kv_unified,
                                       drafter=make_drafter(self.config, self.llm))
            if self.config.context_shift and not self.llm.ctx.memory.can_shift:
                log.warning("--context-shift: this model's cache cannot shift (an iSWA cache of two "
                            "sizes, as llama.cpp); generations end at their slot's context")
            self.stats = self.scheduler.stats
            self.slot_n_ctx = self.scheduler.pool.slots[0].n_ctx
            try:
                template = self.llm._chat.template  # noqa: SLF001 - the template served
                self.template_source = template.source
                self.template_caps = template_caps(template) if isinstance(template, ChatTemplate) else {}
            except ValueError:
                self.template_source, self.template_caps = "", {}
            self.scheduler.start()
        except Exception as e:  # reported by /health; the server stays up to say so
            log.exception("loading the model failed")
            self.load_error = str(e)
        finally:
            self.loaded.set()

    def set_lora_scales(self, scales: tuple[float, ...]) -> None:
        """The server's adapter scales: those of the requests that come without `lora`,
        and the context's own (what /embedding computes with). On the worker thread once
        the scheduler runs (a CallTask), as the context is its."""
        ctx = self.llm.ctx
        for adapter, scale in zip(self.llm.model.loras, scales):
            if scale != 0.0:
                ctx.set_adapter_lora(adapter, scale)
            else:
                ctx.rm_adapter_lora(adapter)
        self.lora_scales = tuple(scales)

    def ready(self, wake: bool = True) -> tuple:
        """(llm, scheduler), or a 503 while loading / 500 if the load failed. A request that
        needs the model wakes a sleeping server (`wake`); the read-only routes pass
        wake=False and get (None, None) while it sleeps."""
        if wake:
            with self._wake_lock:   # after a sleep in progress, which then sees this use
                self.last_used = time.monotonic()
                if self.sleeping:
                    self.wake()
        elif self.sleeping:
            return None, None
        if self.load_error is not None:
            raise APIError(500, f"the model failed to load: {self.load_error}")
        if self.scheduler is None:
            raise APIError(503, "Loading model")
        return self.llm, self.scheduler

    @property
    def n_ctx_slot(self) -> int:
        return self.slot_n_ctx

    def sleep(self, snapshot: Callable[[], list], idle_seconds: float = 0.0) -> None:
        """Unload the model (the scheduler stopped, the Llama and its cache dropped), keeping
        `snapshot()` (the metrics as they were, taken now) for /metrics meanwhile; not if a
        request has used it within `idle_seconds` (one may have come since the caller looked)."""
        with self._wake_lock:
            if self.sleeping or self.scheduler is None or time.monotonic() - self.last_used < idle_seconds:
                return
            self.metrics_snapshot = snapshot()
            self.scheduler.stop()
            self.scheduler, self.llm, self.sleeping = None, None, True
        log.info("idle: the model is unloaded until the next request")

    def wake(self) -> None:
        """Load the model again (the request that wakes it waits for the load)."""
        with self._wake_lock:
            if not self.sleeping:
                return
            self.loaded.clear()
            self.load()
            self.sleeping, self.metrics_snapshot = False, None
            self.last_used = time.monotonic()


def load_llama(config: ServerConfig):
    from llama.api.llama import Llama
    chat_template = config.chat_template
    if chat_template is not None:
        from llama.chat.builtin import BUILTIN_FORMATS, builtin_source
        if chat_template in BUILTIN_FORMATS:   # llama-server's names are llama.cpp's templates
            chat_template = builtin_source(chat_template)
    flash = {"on": True, "off": False, "auto": None}[config.flash_attn]
    return Llama(config.model, n_ctx=config.ctx_size, n_seq_max=config.parallel,
                 n_batch=config.batch_size, n_ubatch=min(config.ubatch_size, config.batch_size),
                 n_threads=config.threads, n_gpu_layers=config.n_gpu_layers, devices=config.devices,
                 tensor_split=config.tensor_split, override_tensor=config.override_tensor, repack=config.repack,
                 flash_attn=flash,
                 embedding=config.embedding, pooling_type=config.pooling or -1,
                 chat_template=chat_template,
                 seed=config.seed if config.seed >= 0 else 0xFFFFFFFF,
                 type_k=config.cache_type_k, type_v=config.cache_type_v,
                 swa_full=config.swa_full, backend=config.backend, verbose=False)


def load_adapters(llm, config: ServerConfig) -> tuple[float, ...]:
    """The --lora adapters, loaded for the model; their graphs (every adapter on) compiled
    now rather than on the first request that uses them. Returns their scales."""
    for path, _ in config.lora:
        llm.model.load_lora(path)
    if config.lora:
        llm.ctx.reserve_lora_graphs(tuple(range(len(config.lora))))
    return tuple(0.0 if config.lora_init_without_apply else scale for _, scale in config.lora)


def safe_slot_file(config: ServerConfig, filename: object) -> Path:
    """A file name under --slot-save-path (no directories, as llama-server's check)."""
    if not config.slot_save_path:
        raise APIError(501, "slot save/restore needs --slot-save-path", type="not_supported_error")
    if (not isinstance(filename, str) or not filename or "/" in filename or "\\" in filename
            or filename.startswith(".") or len(filename) > 255):
        raise APIError(400, "Invalid filename")
    return Path(config.slot_save_path) / filename
