"""The architecture registry: `general.architecture` -> the model file that knows it.

Each file in llama/models/ registers one `Architecture`: its hyperparameter keys, its tensor
table and its graph, as llama.cpp spreads over llama-arch.cpp, llama-model.cpp and
src/models/*.cpp.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ggmlpy.ir import Tensor
    from llama.graph import LlmGraph
    from llama.hparams import HParams, MetadataReader
    from llama.weights import TensorTable


class UnsupportedModel(ValueError):
    """A well-formed GGUF this engine cannot run, refused when the model is loaded rather
    than at its first decode: an unknown architecture, a tensor type it cannot compute."""


class UnknownArchitecture(UnsupportedModel):
    pass


@dataclass(frozen=True)
class Architecture:
    name: str
    load_hparams: Callable[["MetadataReader", "HParams"], None]
    tensors: Callable[["HParams", "TensorTable"], None]
    build: Callable[["LlmGraph"], "Tensor"]  # returns the logits tensor [n_vocab, n_outputs]
    # a drafter that runs only beside a target model (Gemma 4's assistant), never in a
    # context of its own; its build refuses, naming what runs it
    drafter: bool = False


ARCHS: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
    if arch.name in ARCHS:
        raise ValueError(f"architecture {arch.name} registered twice")
    ARCHS[arch.name] = arch
    return arch


def get_arch(name: str) -> Architecture:
    import llama.models  # noqa: F401  (registers every architecture)

    if name not in ARCHS:
        raise UnknownArchitecture(f"unknown model architecture {name!r} "
                                  f"(supported: {', '.join(sorted(ARCHS))})")
    return ARCHS[name]
