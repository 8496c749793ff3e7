"""The server's drafter, from llama-server's speculative options.

`--spec-type` lists the kinds in use, comma-separated; llama.cpp tries them in a fixed
order (n-gram lookups first, then the draft model) and uses the first draft it gets. ggmlpy
has `ngram-simple`, `draft-simple` (a smaller model, `-md`) and `draft-mtp` (Gemma 4's
assistant, `-md`); `none` anywhere turns speculation off, and llama.cpp's other kinds are
refused by name. A draft model with no `--spec-type` is used as `draft-mtp` when it is a
gemma4-assistant, else as `draft-simple` (llama.cpp infers the kind from the file's
metadata and, for a plain model, leaves speculation off).
"""
from __future__ import annotations

from ggmlpy.gguf.file import GGUFFile
from llama.server.config import ServerConfig
from llama.speculative import Drafter, FirstOf, NgramSimple
from llama.speculative.draft_model import DraftModel
from llama.speculative.mtp import MtpDrafter

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


def make_drafter(config: ServerConfig, llm) -> Drafter | None:
    """The drafter the server's scheduler asks, or None without speculative decoding."""
    arch = None
    if config.model_draft:
        with GGUFFile(config.model_draft) as f:
            arch = f.get("general.architecture")
    types = spec_types(config.spec_type, config.model_draft, arch)
    if not types:
        return None
    limits = dict(n_max=config.spec_draft_n_max, n_min=config.spec_draft_n_min, p_min=config.spec_draft_p_min)
    drafters: list[Drafter] = []
    for kind in types:
        if kind == "ngram-simple":
            drafters.append(NgramSimple(config.spec_ngram_size_n, config.spec_ngram_size_m))
        elif kind == "draft-mtp":
            drafters.append(MtpDrafter.load(config.model_draft, llm.engine, **limits))
        else:
            drafters.append(DraftModel.load(config.model_draft, llm.model, n_ctx=llm.ctx.n_ctx,
                                            n_seq_max=llm.ctx.n_seq_max, n_threads=llm.ctx.n_threads, **limits))
    return drafters[0] if len(drafters) == 1 else FirstOf(drafters)
