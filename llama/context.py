"""`Context`: KV cache, graphs and logits for one model; `decode` as llama_decode (docs/architecture.md, steps 7-14).

decode(batch): validate and fill the batch, split it into ubatches, find a KV slot for every
ubatch before any runs, then per ubatch: apply the slot, reuse the previous graph when its
params match (else take the graph built for them, building it the first time), set inputs,
compute, and append the flagged logits in batch order. Return codes are llama.cpp's.

A generation step (one token, one sequence) skips the general allocator (single_token.py),
writes its inputs into buffers that persist between steps (so the compiled graph rebinds
nothing) and undoes a failed step from a checkpoint of its one cell rather than a snapshot.

An embeddings context (embeddings=True) runs graphs whose output is t_embd, the normed
hidden states, instead of the logits; every token is an output, and the rows are pooled
per sequence on the host (llama/pooling.py).
"""
from __future__ import annotations

import logging
import time
from collections import ChainMap
from typing import TYPE_CHECKING, Callable

import numpy as np

from ggmlpy.disk_cache import cache_dir
from ggmlpy.ir.tensor import Tensor
from ggmlpy.options import Options
from ggmlpy.passes.pipeline import context_passes, context_rules
from ggmlpy.passes.stored import StoredPipeline
from ggmlpy.sched.cache import GraphCache
from ggmlpy.sched.fallbacks import FallbackReport
from ggmlpy.sched.registry import host_backends
from ggmlpy.sched.scheduler import CompiledGraph
from ggmlpy.sched.store import TensorStore
from llama.batch import Batch, BatchAllocator, BatchError, UBatch
from llama.graph import BuiltGraph, KVLayout, LlmGraph
from llama.graph_inputs import GraphParams, InputBuffers, InputState, is_single, rs_layout
from llama.kshift import build_k_shift
from llama.kv_attention import rotation_inputs
from llama.kv_cache import KV_TYPES, KVCache
from llama.kv_cache_iswa import KVCacheISWA
from llama.kv_cells import SEQ_BLOCK
from llama.kv_types import check_kv_types, kv_type
from llama.lora_scales import LoraScales
from llama.memory_hybrid import HybridMemory
from llama.model import Model
from llama.pooling import PoolingType, batch_layout, check_supported, pool, resolve_pooling
from llama.recurrent import split_blocks
from llama.single_token import generation_ubatch

if TYPE_CHECKING:
    from llama.adapter import LoraAdapter

log = logging.getLogger("llama.context")

DECODE_OK = 0
DECODE_NO_KV_SLOT = 1
DECODE_ABORTED = 2
DECODE_INVALID_BATCH = -1
DECODE_FATAL = -3
MAX_SEQ = 256


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


_FIRST_OUTPUT = np.zeros(1, np.int64)  # output ids of a one-token batch (read-only)
_FIRST_OUTPUT.flags.writeable = False
_NO_OUTPUTS = np.zeros(0, np.int64)  # output ids after a decode that ran nothing (read-only)
_NO_OUTPUTS.flags.writeable = False


def _is_batch_order(idxs: np.ndarray, n_tokens: int) -> bool:
    """Whether a ubatch holds every token of the batch, in batch order."""
    return len(idxs) == n_tokens and (n_tokens == 1 or bool((np.diff(idxs) > 0).all()))


class Context:
    def __init__(self, model: Model, n_ctx: int = 512, n_batch: int = 512, n_ubatch: int = 512,
                 n_seq_max: int = 1, n_threads: int = 2, n_threads_batch: int | None = None,
                 backend: str | None = None, type_k: str | int = "f16", type_v: str | int = "f16",
                 abort_callback: Callable[[], bool] | None = None, swa_full: bool = False,
                 embeddings: bool = False, pooling_type: str | int | None = None,
                 rope_freq_base: float = 0.0, rope_freq_scale: float = 0.0,
                 flash_attn: bool | None = None, backend_options: Options | None = None):
        """backend_options: the GGMLPY_* settings (ggmlpy/options.py) of every backend this
        context creates, its own and the offload devices'; None: Options.from_env(), read
        here (so the environment counts when a context is made, never at import).
        type_k / type_v: the KV cache's types by llama.cpp's names (-ctk/-ctv: f32, f16, bf16,
        q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1) or ggml type ids; refused as llama.cpp refuses
        them (llama/kv_types.py: a quantised V needs flash_attn not False)."""
        hp = model.hparams
        if model.w is None:
            raise ValueError("the model was loaded with vocab_only=True: it has no weights to run")
        for name, value in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_ubatch", n_ubatch),
                            ("n_threads", n_threads)):
            if not isinstance(value, (int, np.integer)) or value < 0 or (value == 0 and name != "n_ctx"):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 1 <= n_seq_max <= MAX_SEQ:
            raise ValueError(f"n_seq_max must be in [1, {MAX_SEQ}], got {n_seq_max}")
        if flash_attn not in (None, "auto", True, False):
            raise ValueError(f"flash_attn must be True, False or None ('auto'), got {flash_attn!r}")
        # recorded, changes nothing but what a quantised V cache needs: attention is always
        # built as one chain the backends fuse (the CUDA one into one kernel), llama/kv_attention.py
        type_k, type_v = kv_type(type_k, "K cache type"), kv_type(type_v, "V cache type")
        self.flash_attn: bool | None = check_kv_types(hp, type_k, type_v, None if flash_attn == "auto" else flash_attn)
        self.type_k, self.type_v = type_k, type_v   # llama.cpp's names (KV_TYPES)
        # RoPE base/scale overrides are this context's (llama.cpp's cparams; 0: the model's):
        # its graphs see the model through a view with these hparams, the Model is shared
        rope_hp = hp.with_rope(rope_freq_base, rope_freq_scale)
        self.model = model if rope_hp is hp else model.with_hparams(rope_hp)
        self.rope_freq_base, self.rope_freq_scale = rope_hp.rope_freq_base, rope_hp.rope_freq_scale
        self.n_ctx = _pad(n_ctx or hp.n_ctx_train, 256)
        self.n_batch = min(self.n_ctx, n_batch) if hp.causal_attn else n_batch
        if n_ubatch > n_batch:
            raise ValueError(f"n_ubatch ({n_ubatch}) must not exceed n_batch ({n_batch})")
        self.n_ubatch = min(self.n_batch, n_ubatch)
        self.n_seq_max = n_seq_max
        self.n_threads = n_threads
        self.n_threads_batch = n_threads_batch or n_threads
        self.abort_callback = abort_callback
        self.swa_full = swa_full
        self.recurrent = any(hp.recurrent_layers)   # a hybrid model: recurrent states beside the KV cache
        self.memory = self._make_memory(KV_TYPES[type_k], KV_TYPES[type_v])
        self.kv_layout: KVLayout = self.memory.layout()
        backend_options = backend_options if backend_options is not None else Options.from_env()
        self.backend_options = backend_options
        self.backends = host_backends(backend, backend_options)  # the primary backend, then the reference fallback
        self.backends[:0] = model.placement.make_backends(backend_options)  # offload devices first (priority order)
        for be in self.backends:
            be.set_limits({"n_tokens": self.n_ubatch, "n_kv": self.n_ctx, "n_outputs": self.n_ubatch,
                           "n_kv_swa": self.kv_layout.kv_size_swa or self.n_ctx})
            be.set_threads(self.n_threads)
            be.share_model_cache(model.backend_cache)
            be.set_model_file(model.path)
        # every backend's passes, so each split gets its own backend's (passes/pipeline.py)
        self.passes = context_passes(self.backends)
        self.fusion_rules = context_rules(self.backends)  # what the fusion pass marks with
        # nodes the first backends cannot run, told once (one line) rather than per node
        self.fallbacks = FallbackReport(self.backends)
        # the passes' results on disk, beside the compiled code (passes/stored.py)
        self.stored_pipeline = StoredPipeline(cache_dir("graphs", backend_options.cache_dir))
        self.graph_cache = GraphCache()
        self.n_reused = 0
        self.n_compute = 0
        self._prev: BuiltGraph | None = None
        self._prev_compiled: CompiledGraph | None = None
        # built graphs by params: switching between prompt and decode graphs rebuilds nothing
        self._built: dict[GraphParams, tuple[BuiltGraph, CompiledGraph]] = {}
        self._input_bufs = InputBuffers()
        self._params: dict[tuple, GraphParams] = {}
        self._out_view: tuple | None = None  # (buffer, tensor, env, rows) of the last logits
        self._reusable: tuple | None = None  # (graph, params) that passed the reuse check
        self._weights = model.weight_arrays()
        self.lora_scales = LoraScales()  # the adapters this context applies (set_adapter_lora)
        # embeddings: every token is an output and its row is t_embd (n_embd wide), no logits
        self.embeddings = embeddings
        self.pooling_type = resolve_pooling(pooling_type, model.gguf.metadata, hp.arch)
        if embeddings:
            check_supported(self.pooling_type, list(model.gguf.tensors))
        self._row_width = hp.n_embd if embeddings else hp.n_vocab
        self._embd_seq: dict[int, np.ndarray] = {}  # pooled vectors of the last decode
        # the output rows of the last decode: logits, or t_embd in an embeddings context
        self._logits: np.ndarray | None = np.zeros((0, self._row_width), np.float32)
        self._n_outputs = 0
        self._output_ids = np.zeros(0, np.int64)
        # llama.cpp's embeddings_nextn: the output rows' final normed hidden states too
        self.embeddings_nextn = False
        self._nextn: np.ndarray | None = None
        self._reserve()

    def _make_memory(self, type_k, type_v) -> KVCache | KVCacheISWA | HybridMemory:
        """Models with sliding-window layers get llama.cpp's iSWA cache (a small cache for
        the windowed layers, full-size with `swa_full`), hybrid models a KV cache for their
        attention layers beside recurrent states (memory_hybrid.py); the others one unified
        cache. With several sequences, each keeps its cells in blocks of its own
        (kv_cells.py), so that a batched decode step's attention skips the other sequences'
        cells."""
        hp = self.model.hparams
        seq_block = SEQ_BLOCK if self.n_seq_max > 1 else 0
        if self.recurrent:
            return HybridMemory(hp, self.n_ctx, self.n_seq_max, type_k=type_k, type_v=type_v, seq_block=seq_block)
        if hp.n_swa > 0 and any(hp.swa_layers) and hp.extra.get("swa_type", 1) != 0:
            return KVCacheISWA(hp, self.n_ctx, self.n_seq_max, self.n_ubatch, swa_full=self.swa_full,
                               type_k=type_k, type_v=type_v, seq_block=seq_block)
        return KVCache(hp, self.n_ctx, self.n_seq_max, type_k=type_k, type_v=type_v, seq_block=seq_block)

    @property
    def n_vocab(self) -> int:
        return self.model.hparams.n_vocab

    @property
    def backend_name(self) -> str:
        return self.backends[0].name

    # graphs -----------------------------------------------------------------------------------
    def build_graph(self, params: GraphParams) -> BuiltGraph:
        g = LlmGraph(self.model, self.kv_layout, params, lora_scales=self.lora_scales)
        return g.finish(self.model.arch.build(g))

    def _compile(self, built: BuiltGraph) -> CompiledGraph:
        """The compiled graph for this topology: from the cache, or through the passes of
        every backend (dce, cse, view folding, fusion marks ...; their result stored on
        disk, passes/stored.py) and the scheduler."""
        sig = built.graph.signature()

        def compile_graph() -> CompiledGraph:
            optimized = self.stored_pipeline.optimise(built.graph, sig, self.passes, self.fusion_rules)
            compiled = CompiledGraph(optimized, self.backends, self.model.placement)
            self.fallbacks.note(compiled)
            return compiled

        return self.graph_cache.get_or_compile(sig, compile_graph)

    def compile_report(self) -> dict:
        """How the graphs of this context were obtained: compile time and cache use."""
        report = {"graphs": len(self.graph_cache.entries), "compile_ms": round(self.compile_ms, 1)}
        for be in self.backends:
            for key, value in be.cache_stats().items():
                report[f"{be.name}_{key}"] = value
        return report

    def _reserve(self) -> None:
        """Build and compile the prompt-sized and the one-token graph up front, as llama.cpp
        reserves its worst-case compute buffers when a context is created. A node no backend
        can run is refused here (SchedulerError naming it, its op, its inputs' types and the
        backends tried), not at the first decode; nodes that fall back to a slower backend
        are told in one warning."""
        t0 = time.perf_counter()
        self._reserve_graphs()
        self.fallbacks.flush()
        self.compile_ms = (time.perf_counter() - t0) * 1000

    def _reserve_graphs(self, loras: tuple[int, ...] = ()) -> None:
        for n_tokens in (self.n_ubatch, 1):
            layout = ("tokens" if n_tokens == 1 else "seq") if self.recurrent else ""
            params = GraphParams("single" if n_tokens == 1 else "multi", False, self.n_ctx,
                                 embeddings=self.embeddings, loras=loras, rs_layout=layout,
                                 nextn=self.embeddings_nextn)
            if params not in self._built:
                built = self.build_graph(params)
                self._built[params] = (built, self._compile(built))

    def reserve_lora_graphs(self, ids: tuple[int, ...] | None = None) -> None:
        """Compile the prompt and one-token graphs with these adapters (default: those now
        applied to every sequence), as the context did at creation without any, so that
        the first decode with them compiles nothing."""
        if ids is None:
            ids = tuple(a.id for a, s in self.lora_scales.context.items() if s != 0.0)
        t0 = time.perf_counter()
        self._reserve_graphs(tuple(sorted(ids)))
        self.fallbacks.flush()
        self.compile_ms += (time.perf_counter() - t0) * 1000

    def _graph_for(self, params: GraphParams) -> tuple[BuiltGraph, CompiledGraph]:
        """llama.cpp's reuse of the previous graph (counted in n_reused); otherwise the graph
        built earlier for these params, or a new one. A graph depends on its params only, so
        keeping one per params changes nothing but the time to switch prompt/decode."""
        prev, checked = self._prev, self._reusable
        if prev is not None and checked is not None and checked[0] is prev and checked[1] is params:
            self.n_reused += 1  # passed the check below last time; params and can_reuse are pure
            return prev, self._prev_compiled  # type: ignore[return-value]
        if prev is not None and prev.params == params and all(i.can_reuse(params) for i in prev.inputs):
            self.n_reused += 1
            self._reusable = (prev, params)
            return prev, self._prev_compiled  # type: ignore[return-value]
        entry = self._built.get(params)
        if entry is None:
            built = self.build_graph(params)
            entry = self._built[params] = (built, self._compile(built))
            self.fallbacks.flush()
        self._prev, self._prev_compiled = entry
        return entry

    # decode -----------------------------------------------------------------------------------
    def decode(self, batch: Batch) -> int:
        """0 ok, 1 no KV slot (nothing written), 2 aborted, -1 invalid batch, < -1 fatal.

        Whatever the outcome, the last decode's rows are gone: after a refused batch there
        are no outputs (get_logits is empty, get_logits_ith raises), after a failed or
        aborted ubatch the rows it did not compute read as zeros, never the previous step's."""
        self._clear_outputs()
        ub = generation_ubatch(batch, self.n_vocab, self.n_seq_max, self.memory,
                               min(self.n_batch, self.n_ubatch), output_all=self.embeddings)
        if ub is not None:  # a generation step: one ubatch in batch order, nothing to split
            ubatches, in_order = [ub], True
            if ub.n_tokens == 1:
                n_outputs, output_ids = 1, _FIRST_OUTPUT
            else:
                n_outputs = int(np.count_nonzero(ub.output))
                output_ids = np.full(ub.n_tokens, -1, np.int64)
                output_ids[ub.output] = np.arange(n_outputs)
        else:
            split = self._split(batch)
            if isinstance(split, int):
                return split
            ubatches, output = split
            n_outputs = int(np.count_nonzero(output))
            output_ids = np.full(len(output), -1, np.int64)
            output_ids[output] = np.arange(n_outputs)
            # one ubatch in batch order: its logits are the result as they are
            in_order = len(ubatches) == 1 and _is_batch_order(ubatches[0].idxs, len(output))
        slots = self.memory.prepare(ubatches)  # every ubatch placed, or none
        if slots is None:
            return DECODE_NO_KV_SLOT
        # until the logits are in they read as zeros (as after a failed or aborted ubatch)
        self._output_ids = output_ids
        self._n_outputs = n_outputs
        self._logits = None if in_order else np.zeros((n_outputs, self._row_width), np.float32)
        n_embd = self.model.hparams.n_embd
        self._nextn = np.zeros((n_outputs, n_embd), np.float32) if self.embeddings_nextn else None

        self._apply_k_shift()
        for ub, slot in zip(ubatches, slots):
            if self.abort_callback is not None and self.abort_callback():
                return DECODE_ABORTED
            state = self.memory.checkpoint(slot)
            try:
                self.memory.apply_ubatch(slot, ub)
                logits, hidden = self._process_ubatch(ub, slot)
                self.memory.commit_ubatch(slot)
            except Exception:
                self.memory.restore(state)  # the failed ubatch leaves no trace in the cache
                log.exception("decode: computing a ubatch failed")
                return DECODE_FATAL
            if in_order:
                self._logits = np.array(logits, dtype=np.float32)  # a copy: the graph's memory is reused
            else:
                self._logits[self._output_ids[ub.idxs[ub.output]]] = logits
            if hidden is not None:
                self._nextn[self._output_ids[ub.idxs[ub.output]]] = hidden
        if self.embeddings and self.pooling_type != PoolingType.NONE:
            pos, seq_ids = batch_layout(ubatches, len(output_ids))
            self._embd_seq = pool(self._logits, pos, seq_ids, self.pooling_type, self.model.hparams.causal_attn)
        return DECODE_OK

    def _clear_outputs(self) -> None:
        """No rows until a decode computes some (get_logits: empty; _rows fills zeros)."""
        self._output_ids = _NO_OUTPUTS
        self._n_outputs = 0
        self._logits = None
        self._nextn = None
        self._embd_seq = {}

    def _split(self, batch: Batch) -> tuple[list[UBatch], np.ndarray] | int:
        """Validate the batch and split it into ubatches: (ubatches, output flags in batch
        order), or decode's return code for an invalid batch."""
        try:
            # embeddings: every token is an output, as llama.cpp's output_all
            ab = BatchAllocator.init(batch, self.n_vocab, self.n_seq_max, self.memory,
                                     output_all=self.embeddings)
        except BatchError as e:
            log.error("decode: invalid batch: %s", e)
            return DECODE_INVALID_BATCH
        if ab.n_tokens > self.n_batch:
            log.error("decode: %d tokens exceed n_batch %d", ab.n_tokens, self.n_batch)
            return DECODE_INVALID_BATCH
        # the KV cache is one stream shared by every sequence (llama.cpp's kv_unified), for
        # which llama.cpp's init_batch splits simply: a server step's generated tokens and
        # new prompt chunks go in one ubatch, so each weight is read once for all of them
        # recurrent layers take equal splits, one sequence or one token per sequence
        ubatches = ab.split_all(self.n_ubatch, "equal" if self.recurrent else "simple")
        if ubatches is not None and self.recurrent:
            ubatches = split_blocks(ubatches)
        if ubatches is None:
            log.error("decode: the batch could not be split into ubatches")
            return DECODE_INVALID_BATCH
        return ubatches, ab.output

    def _process_ubatch(self, ub: UBatch, slot) -> tuple[np.ndarray, np.ndarray | None]:
        params = self._params_for(ub)
        built, compiled = self._graph_for(params)
        threads = self.n_threads if ub.n_tokens == 1 else self.n_threads_batch
        for be in self.backends:
            be.set_threads(threads)
        state: InputState = self.memory.input_state(slot)
        inputs: dict[str, np.ndarray] = {}
        for inp in built.inputs:
            inputs.update(inp.set_input(ub, state, self._input_bufs))
        env = {"n_tokens": ub.n_tokens, "n_outputs": int(np.count_nonzero(ub.output)), **state.symbols()}
        store = TensorStore(ChainMap(inputs, self.memory.bindings(), self._weights))
        compiled.run(store, env)
        self.n_compute += 1
        hidden = None
        if params.nextn:
            hidden = store.array(compiled.graph.outputs[1], env).reshape(-1, self.model.hparams.n_embd)
        return self._output_rows(store, compiled.graph.outputs[0], env), hidden

    def _params_for(self, ub: UBatch) -> GraphParams:
        """GraphParams.for_ubatch, one object per value (the reuse check compares them)."""
        loras = self.lora_scales.active(ub)
        key = (is_single(ub), ub.embd is not None, loras, self.recurrent and rs_layout(ub), self.embeddings_nextn)
        params = self._params.get(key)
        if params is None:
            params = self._params[key] = GraphParams.for_ubatch(ub, self.n_ctx, self.embeddings, loras,
                                                                recurrent=self.recurrent, nextn=self.embeddings_nextn)
        return params

    # LoRA adapters (llama.cpp's llama_set_adapter_lora and friends) ---------------------------
    def set_adapter_lora(self, adapter: "LoraAdapter", scale: float = 1.0) -> None:
        """Apply a model's adapter to every sequence with `scale` (again: a new scale). The
        cache keeps what earlier tokens computed without it, as in llama.cpp."""
        self._check_adapter(adapter)
        self.lora_scales.set(adapter, scale)

    def rm_adapter_lora(self, adapter: "LoraAdapter") -> bool:
        """Stop applying an adapter; False if it was not applied."""
        return self.lora_scales.remove(adapter)

    def clear_adapter_lora(self) -> None:
        self.lora_scales.clear()

    def set_seq_adapters_lora(self, seq_id: int, scales: "dict[LoraAdapter, float] | None") -> None:
        """Adapters for one sequence only, overriding the context's (an adapter left out gets
        0); None: the context's again. Sequences with different adapters still share a
        decode (the scales are per token)."""
        if not 0 <= seq_id < self.n_seq_max:
            raise ValueError(f"seq_id {seq_id} is out of range [0, {self.n_seq_max})")
        for adapter in scales or {}:
            self._check_adapter(adapter)
        self.lora_scales.set_seq(seq_id, scales)

    def _check_adapter(self, adapter: "LoraAdapter") -> None:
        loras = self.model.loras
        if not (0 <= adapter.id < len(loras) and loras[adapter.id] is adapter):
            raise ValueError(f"{adapter!r} was not loaded for this context's model (Model.load_lora)")
        if next(iter(adapter.weights.values())).a.name not in self._weights:
            self._weights = self.model.weight_arrays()  # loaded after this context was made

    def _output_rows(self, store: TensorStore, out: Tensor, env: dict[str, int]) -> np.ndarray:
        """The logits tensor as [n_outputs, n_vocab]. A graph that leaves them in the same
        buffer at the same sizes as last time gets last time's view back."""
        buf = store.buffer(out)
        last = self._out_view
        if last is not None and last[0] is buf and last[1] is out and last[2] == env:
            return last[3]
        rows = store.array(out, env).reshape(-1, self._row_width)
        self._out_view = (buf, out, env, rows)
        return rows

    def _apply_k_shift(self) -> None:
        """Re-rotate cached keys after seq_add/seq_div moved positions (llama.cpp's K-shift)."""
        if not self.memory.has_shift:
            return
        built = build_k_shift(self.model, self.kv_layout)
        compiled = self._compile(built)
        self.fallbacks.flush()
        inputs = {**self.memory.k_shift_inputs(), **rotation_inputs(self.kv_layout)}
        store = TensorStore(ChainMap(inputs, self.memory.bindings(), self._weights))
        compiled.run(store, {})
        self.memory.reset_shift()

    # logits -----------------------------------------------------------------------------------
    def get_logits(self) -> np.ndarray:
        """All output rows of the last decode, in batch order: [n_outputs, n_vocab]."""
        if self.embeddings:
            raise RuntimeError("an embeddings context computes no logits: use get_embeddings*")
        return self._rows()

    def _rows(self) -> np.ndarray:
        if self._logits is None:  # the decode stopped before its only ubatch computed
            self._logits = np.zeros((self._n_outputs, self._row_width), np.float32)
        return self._logits

    def set_embeddings_nextn(self, value: bool) -> None:
        """llama.cpp's llama_set_embeddings_nextn (its masked form): every decode then also
        keeps its output rows' final normed hidden states (`get_embeddings_nextn`), which a
        multi-token-prediction drafter continues from. The graphs with that second output
        are compiled now."""
        if self.embeddings:
            raise ValueError("an embeddings context has no logits to draft beside")
        self.embeddings_nextn = bool(value)
        t0 = time.perf_counter()
        self._reserve_graphs()
        self.compile_ms += (time.perf_counter() - t0) * 1000

    def get_embeddings_nextn(self) -> np.ndarray:
        """[n_outputs, n_embd]: the last decode's output rows' final normed hidden states,
        in batch order (set_embeddings_nextn(True) first)."""
        if not self.embeddings_nextn:
            raise RuntimeError("the context keeps no hidden states: set_embeddings_nextn(True) first")
        if self._nextn is None:
            return np.zeros((self._n_outputs, self.model.hparams.n_embd), np.float32)
        return self._nextn

    def get_logits_ith(self, i: int) -> np.ndarray:
        """Logits of batch position i (which must have been flagged), or of the i-th output
        from the end when i < 0 (-1: the last)."""
        return self._row_ith(self.get_logits(), i, "get_logits_ith")

    def _row_ith(self, rows: np.ndarray, i: int, what: str) -> np.ndarray:
        n_out = len(rows)
        if i < 0:
            if -i > n_out:
                raise IndexError(f"{what}({i}): only {n_out} outputs in the last batch")
            return rows[n_out + i]
        if i >= len(self._output_ids):
            raise IndexError(f"{what}({i}): the last batch had {len(self._output_ids)} tokens")
        row = self._output_ids[i]
        if row < 0:
            raise IndexError(f"{what}({i}): batch position {i} was not flagged for logits")
        return rows[row]

    # embeddings -------------------------------------------------------------------------------
    def _check_embeddings(self) -> None:
        if not self.embeddings:
            raise RuntimeError("this context computes logits: create it with embeddings=True")

    def get_embeddings(self) -> np.ndarray:
        """The final normed hidden state of every token of the last decode (llama.cpp's
        t_embd, in an embeddings context every token is an output), in batch order:
        [n_outputs, n_embd]. Given with every pooling type, not only none: pooling runs on
        the host from these rows."""
        self._check_embeddings()
        return self._rows()

    def get_embeddings_ith(self, i: int) -> np.ndarray:
        """The hidden state of batch position i, or of the i-th from the end when i < 0."""
        self._check_embeddings()
        return self._row_ith(self._rows(), i, "get_embeddings_ith")

    def get_embeddings_seq(self, seq_id: int) -> np.ndarray:
        """The pooled vector [n_embd] of sequence seq_id over its tokens in the last decode
        (pooling mean, cls or last; not normalised, as llama.cpp's)."""
        self._check_embeddings()
        if self.pooling_type == PoolingType.NONE:
            raise RuntimeError("pooling type none: no vector per sequence, use get_embeddings_ith")
        vec = self._embd_seq.get(seq_id)
        if vec is None:
            raise KeyError(f"get_embeddings_seq({seq_id}): sequence {seq_id} had no tokens "
                           "in the last decode")
        return vec
