"""llama.cpp's `draft-mtp` for Gemma 4: its assistant model drafts from the target's state.

The target context keeps its output rows' final normed hidden states
(`Context.set_embeddings_nextn`); the engine remembers each sequence's. A draft starts from
the pending token and the hidden state of the position that predicted it, and each step of
the assistant (`llama/models/gemma4_assistant.py`: one token, attention over the target's
cache, no cache of its own) gives the logits of the next token and the hidden state to go
on from, at the same position. The tokens are picked as llama.cpp's draft sampler picks
them (the best of the top 10, while its share of their probability is at least `p_min`).

The assistant runs on backends of its own (its weights are not the target's), with the
target's embedding and KV cache bound into its one compiled graph.
"""
from __future__ import annotations

from collections import ChainMap
from typing import Sequence as Seq

import numpy as np

from ggmlpy.disk_cache import cache_dir
from ggmlpy.passes.pipeline import context_passes, context_rules
from ggmlpy.passes.stored import StoredPipeline
from ggmlpy.sched.registry import host_backends
from ggmlpy.sched.scheduler import CompiledGraph
from ggmlpy.sched.store import TensorStore
from llama.api.engine import Engine
from llama.batch import UBatch
from llama.graph import LlmGraph
from llama.graph_inputs import GraphParams
from llama.kv_cache import KVCache
from llama.kv_cache_iswa import KVCacheISWA
from llama.kv_cells import SWAType
from llama.model import Model
from llama.models.gemma4_assistant import TARGET_EMBD, build_step
from llama.speculative.draft_model import DraftLimits, check_compatible
from llama.speculative.drafters import Drafter, TargetDraft

TARGETS = ("gemma4",)   # the architectures an assistant drafts for


class MtpDrafter(Drafter):
    def __init__(self, target: Engine, assistant: Model, *, n_max: int = 3, n_min: int = 0, p_min: float = 0.0,
                 backend: str | None = None):
        self.limits = DraftLimits(n_max, n_min, p_min)
        ctx = target.ctx
        check_pair(ctx.model, assistant, ctx.kv_layout)
        self.target, self.model = target, assistant
        self.backends = host_backends(backend, ctx.backend_options)
        for be in self.backends:
            be.set_limits({"n_tokens": 1, "n_kv": ctx.n_ctx, "n_outputs": 1,
                           "n_kv_swa": ctx.kv_layout.kv_size_swa or ctx.n_ctx})
            be.set_threads(ctx.n_threads)
            be.share_model_cache(assistant.backend_cache)
            be.set_model_file(assistant.path)
        g = LlmGraph(assistant, ctx.kv_layout, GraphParams("single", False, ctx.n_ctx))
        graph = g.b.build(list(build_step(g, ctx.model)))
        stored = StoredPipeline(cache_dir("graphs", ctx.backend_options.cache_dir))
        optimized = stored.optimise(graph, graph.signature(), context_passes(self.backends),
                                    context_rules(self.backends))
        self.compiled = CompiledGraph(optimized, self.backends, assistant.placement)
        target_weights = ctx.model.weight_arrays()
        self.weights = ChainMap({TARGET_EMBD: target_weights[ctx.model.w.tok_embd.name]}, assistant.weight_arrays())
        ctx.set_embeddings_nextn(True)

    def draft(self, seq_id: int, history: Seq[int], n_max: int) -> list[int]:
        pos = len(history) - 1                 # the pending token's position
        h = self.target.hidden_state(seq_id, pos - 1)
        if min(n_max, self.limits.n_max) <= 0 or h is None or self.target.n_past(seq_id) != pos:
            return []

        def advance(token: int, n_drafted: int) -> np.ndarray:
            nonlocal h
            logits, h = self.step(seq_id, token, h, pos)   # every step at the pending token's position
            return logits
        return self.limits.greedy(n_max, advance(int(history[-1]), 0), advance, self.target.ctx.n_vocab)

    def step(self, seq_id: int, token: int, h: np.ndarray, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """One assistant step: the logits after `token` at `pos` and the hidden state to go
        on from, the attention over seq_id's cells of the target's cache."""
        memory = self.target.ctx.memory
        ub = UBatch(tokens=np.array([token], np.int32), embd=None, pos=np.array([pos], np.int32),
                    seq_ids=[(seq_id,)], output=np.array([True]), idxs=np.zeros(1, np.int64),
                    n_seq_tokens=1, n_seqs=1, equal_seqs=True, seq_id_unq=[seq_id])
        hp = self.model.hparams
        inputs = {"inp_tokens": ub.tokens, "inp_h": np.asarray(h, np.float32).reshape(1, -1),
                  "inp_pos": ub.pos}
        base, swa = (memory.base, memory.swa) if isinstance(memory, KVCacheISWA) else (memory, None)
        if not isinstance(base, KVCache):
            raise TypeError(f"a multi-token-prediction drafter reads a KV cache, not {type(memory).__name__}")
        env = {"n_tokens": 1, "n_outputs": 1, "n_kv": base.cells.get_n_kv()}
        inputs["inp_kq_mask"] = base.cells.kq_mask(ub, env["n_kv"], swa_type=SWAType.NONE)
        if swa is not None:
            env["n_kv_swa"] = swa.cells.get_n_kv()
            inputs["inp_kq_mask_swa"] = swa.cells.kq_mask(ub, env["n_kv_swa"])
        elif any(hp.swa_layers):
            inputs["inp_kq_mask_swa"] = base.cells.kq_mask(ub, env["n_kv"], swa_type=SWAType(hp.extra["swa_type"]),
                                                           n_swa=hp.n_swa)
        store = TensorStore(ChainMap(inputs, memory.bindings(), self.weights))
        self.compiled.run(store, env)
        logits, h_next = self.compiled.graph.outputs[:2]
        return (np.array(store.array(logits, env)).reshape(-1),
                np.array(store.array(h_next, env)).reshape(-1))


class MtpDraft(TargetDraft):
    """`Llama(draft_model=MtpDraft("gemma-4-assistant.gguf"))`: Gemma 4's assistant drafting
    for the Llama's model (llama.cpp's draft-mtp)."""

    def __init__(self, path: str, *, n_max: int = 3, n_min: int = 0, p_min: float = 0.0):
        self.path, self.options = str(path), dict(n_max=n_max, n_min=n_min, p_min=p_min)

    def bind(self, target: Engine) -> MtpDrafter:
        return MtpDrafter(target, Model.load(self.path), **self.options)


def check_pair(target: Model, assistant: Model, kv) -> None:
    """The assistant drafts for a Gemma 4 of the width it was made for, with its vocabulary,
    over a cache on the host that is not rotated (a rotated cache would need Q rotated too)."""
    if assistant.arch.name != "gemma4-assistant":
        raise ValueError(f"draft-mtp needs a gemma4-assistant model, got {assistant.arch.name}")
    if target.arch.name not in TARGETS:
        raise ValueError(f"a gemma4-assistant drafts for gemma4 models, not {target.arch.name}")
    width = assistant.hparams.extra["n_embd_backbone"]
    if width != target.hparams.n_embd:
        raise ValueError(f"the assistant was made for a target {width} wide; this gemma4 is "
                         f"{target.hparams.n_embd}")
    if target.placement.active:
        raise ValueError("draft-mtp runs on the host and reads the target's cache there: the target "
                         "cannot offload layers to a device (-ngl, devices)")
    if kv.rot_k or kv.rot_v:
        raise ValueError("draft-mtp reads the target's cache unrotated: use an f16/f32/bf16 or "
                         "unrotated KV cache type")
    check_compatible(target.vocab, assistant.vocab, assistant.path)
