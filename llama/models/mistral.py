"""Mistral: the LLaMA block, with sliding-window attention when the file sets a window.

Mistral 7B v0.1 attends to the last `sliding_window` positions in every layer; later
Mistral models set no window and are plain LLaMA. The tensors, the graph and the RoPE
(normal, adjacent pairs: the converter permutes Q and K as for LLaMA) are LLaMA's; only the
hyperparameters differ:
- `mistral.attention.sliding_window` > 0 turns on a standard window (a token sees the
  positions p with p1 - p < n_swa), on every layer unless
  `mistral.attention.sliding_window_pattern` says every Nth layer is global
  (llama.cpp's set_swa_pattern); the windowed layers then get the iSWA cache and rotate
  with the same RoPE base as the others.
"""
from __future__ import annotations

from llama.arch import Architecture, register
from llama.hparams import HParams, HParamsError, MetadataReader
from llama.kv_cells import SWAType
from llama.models import llama as llama_arch


def load_hparams(r: MetadataReader, hp: HParams) -> None:
    llama_arch.load_hparams(r, hp)
    n_swa = r.int("attention.sliding_window", 0)
    if n_swa < 0:
        raise HParamsError(f"{r.key('attention.sliding_window')} must be >= 0, got {n_swa}")
    hp.rope_freq_base_swa = hp.rope_freq_base  # the K-shift reads the windowed layers' base
    hp.rope_freq_scale_swa = hp.rope_freq_scale
    if n_swa == 0:
        hp.n_swa = 0
        hp.extra["swa_type"] = int(SWAType.NONE)
        hp.swa_layers = [False] * hp.n_layer
        return
    hp.n_swa = n_swa
    hp.extra["swa_type"] = int(SWAType.STANDARD)
    hp.set_swa_pattern(r.int("attention.sliding_window_pattern", 0))  # 0: every layer windowed


register(Architecture("mistral", load_hparams, llama_arch.tensors, llama_arch.build))
