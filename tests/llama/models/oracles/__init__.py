"""Independent numpy forward passes, one per model family, written from the published
descriptions (Hugging Face modeling code semantics), for tests/llama/models/test_archs.py.

`run(path, tokens, **overrides)` reads the GGUF with the official `gguf` package and
returns the logits of every token [n_tokens, n_vocab] (float64). `overrides` replace
config fields (e.g. sliding_window=0) so tests can show a feature actually matters.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tests.llama.models.oracles import (
    deepseek2, gemma, gemma4, glm4moe, gpt_oss, granite, llama, olmoe, phi3, qwen, qwen35,
)
from tests.llama.models.oracles.common import Config, GGUFContents, read_gguf

# arch -> (config from the file, forward pass)
ORACLES: dict[str, tuple[Callable[[GGUFContents], Config], Callable[..., np.ndarray]]] = {
    "llama": (llama.config_llama, llama.forward),
    "mistral": (llama.config_mistral, llama.forward),
    "qwen2": (qwen.config, qwen.forward),
    "qwen3": (qwen.config, qwen.forward),
    "qwen3moe": (qwen.config, qwen.forward),
    "qwen2moe": (qwen.config, qwen.forward),
    "phi3": (phi3.config, phi3.forward),
    "gemma": (gemma.config_gemma, gemma.forward),
    "gemma2": (gemma.config_gemma2, gemma.forward),
    "gemma3": (gemma.config_gemma3, gemma.forward),
    "gemma4": (gemma4.config, gemma4.forward),
    "olmoe": (olmoe.config, olmoe.forward),
    "granite": (granite.config, granite.forward),
    "granitemoe": (granite.config, granite.forward),
    "gpt-oss": (gpt_oss.config, gpt_oss.forward),
    "glm4moe": (glm4moe.config, glm4moe.forward),
    "qwen35": (qwen35.config, qwen35.forward),
    "qwen35moe": (qwen35.config, qwen35.forward),
    "qwen3next": (qwen35.config, qwen35.forward),
    "deepseek2": (deepseek2.config, deepseek2.forward),
}


def run(path: str | Path, tokens: list[int], forward_kw: dict[str, Any] | None = None,
        **overrides: Any) -> np.ndarray:
    contents = read_gguf(path)
    make_config, forward = ORACLES[contents.arch]
    cfg = dataclasses.replace(make_config(contents), **overrides)
    return forward(contents, cfg, list(tokens), **(forward_kw or {}))
