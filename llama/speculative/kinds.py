"""llama.cpp's speculative decoding options (`--spec-type`, `-md` and the draft's limits) as one
drafter, for llama-server's and llama-cli's flags alike.

`--spec-type` lists the kinds in use, comma-separated; llama.cpp tries them in a fixed order
(n-gram lookups first, then the draft model) and uses the first draft it gets. ggmlpy has
`ngram-simple`, `draft-simple` (a smaller model, `-md`) and `draft-mtp` (Gemma 4's assistant,
`-md`); `none` anywhere turns speculation off, and llama.cpp's other kinds are refused by
name. A draft model with no `--spec-type` is used as `draft-mtp` when it is a
gemma4-assistant, else as `draft-simple` (llama.cpp infers the kind from the file's metadata
and, for a plain model, leaves speculation off).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ggmlpy.gguf.file import GGUFFile
from llama.speculative.draft_model import DraftFile
from llama.speculative.drafters import Drafter, FirstOf, NgramSimple, TargetDraft
from llama.speculative.mtp import MtpDraft

if TYPE_CHECKING:
    from llama.api.engine import Engine

TYPES = ("none", "ngram-simple", "draft-simple", "draft-mtp")
LLAMA_CPP_TYPES = ("draft-eagle3", "draft-dflash", "draft-dspark", "ngram-map-k", "ngram-map-k4v", "ngram-mod",
                   "ngram-cache")
ORDER = ("ngram-simple", "draft-simple", "draft-mtp")   # llama.cpp's order of preference
MTP_ARCHS = ("gemma4-assistant",)


def spec_types(names: list[str], model_draft: str | None, draft_arch: str | None = None) -> list[str]:
    """The kinds in use, in llama.cpp's order of preference; ValueError for a name ggmlpy
    lacks or does not know. draft_arch: the draft model's architecture, which picks the
    kind when none is named."""
    for name in names:
        if name in LLAMA_CPP_TYPES:
            raise ValueError(f"--spec-type {name}: ggmlpy implements {', '.join(TYPES)}")
        if name not in TYPES:
            raise ValueError(f"unknown speculative type: {name} (one of {', '.join(TYPES)})")
    if "none" in names:
        return []
    implied = "draft-mtp" if draft_arch in MTP_ARCHS else "draft-simple"
    chosen = set(names) or ({implied} if model_draft else set())
    for kind in ("draft-simple", "draft-mtp"):
        if kind in chosen and not model_draft:
            raise ValueError(f"--spec-type {kind} needs a draft model (-md FILE)")
    if {"draft-simple", "draft-mtp"} <= chosen:
        raise ValueError("--spec-type draft-simple and draft-mtp use the one draft model (-md): name one")
    return [t for t in ORDER if t in chosen]


@dataclass(frozen=True)
class SpecDraft(TargetDraft):
    """The drafter of a set of llama.cpp options, made once its target exists: one drafter,
    or llama.cpp's first-that-drafts of several (`FirstOf`)."""

    types: tuple[str, ...]              # spec_types' answer: the kinds in use, in order
    model_draft: str | None = None      # -md
    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0
    ngram_size_n: int = 12              # --spec-ngram-simple-size-n / -m
    ngram_size_m: int = 48

    @classmethod
    def from_options(cls, names: list[str], model_draft: str | None = None, **limits) -> "SpecDraft | None":
        """From the flags' values (names: --spec-type's list); None when nothing drafts."""
        arch = None
        if model_draft:
            with GGUFFile(model_draft) as f:
                arch = f.get("general.architecture")
        types = spec_types(names, model_draft, arch)
        return cls(tuple(types), model_draft, **limits) if types else None

    def bind(self, target: "Engine") -> Drafter:
        limits = dict(n_max=self.n_max, n_min=self.n_min, p_min=self.p_min)
        drafters: list[Drafter] = []
        for kind in self.types:
            if kind == "ngram-simple":
                drafters.append(NgramSimple(self.ngram_size_n, self.ngram_size_m))
            elif kind == "draft-mtp":
                drafters.append(MtpDraft(self.model_draft, **limits).bind(target))
            else:
                drafters.append(DraftFile(self.model_draft, **limits).bind(target))
        return drafters[0] if len(drafters) == 1 else FirstOf(drafters)
