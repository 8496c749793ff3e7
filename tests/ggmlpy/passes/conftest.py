"""Fixtures of the pass tests: a tiny random llama and SmolLM2, each with a context (for the
KV cache layout) and a reference backend that keeps its dequantised weights between runs."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

import llama
from ggmlpy.ir import Graph
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.testing.models import write_tiny_llama
from llama.graph_inputs import GraphParams
from tests.ggmlpy.passes.helpers import llama_bindings, llama_env, run_graph


@dataclass
class LlamaSetup:
    model: llama.Model
    ctx: llama.Context
    backend: RefBackend
    _logits: dict[int, np.ndarray] = field(default_factory=dict)

    def graph(self, n_tokens: int) -> Graph:
        """The ubatch graph decode builds for n_tokens tokens."""
        params = GraphParams("single" if n_tokens == 1 else "multi", False, self.ctx.n_ctx)
        return self.ctx.build_graph(params).graph

    def logits(self, n_tokens: int) -> np.ndarray:
        """The logits of the graph as built (no passes) for helpers.llama_bindings' inputs."""
        if n_tokens not in self._logits:
            bindings = llama_bindings(self.model, self.ctx, n_tokens)
            out = run_graph(self.graph(n_tokens), bindings, llama_env(n_tokens), self.backend)
            self._logits[n_tokens] = out[0]
        return self._logits[n_tokens]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> LlamaSetup:
    path = write_tiny_llama(tmp_path_factory.mktemp("passes") / "tiny-llama.gguf")
    model = llama.Model.load(path)
    return LlamaSetup(model, llama.Context(model, n_ctx=256, backend="ref"), RefBackend())


@pytest.fixture(scope="session")
def smollm2(smollm2_path) -> LlamaSetup:
    model = llama.Model.load(smollm2_path)
    return LlamaSetup(model, llama.Context(model, n_ctx=256, backend="ref"), RefBackend())
