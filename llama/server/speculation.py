"""The server's drafter, from llama-server's speculative options.

`--spec-type` lists the kinds in use, comma-separated; llama.cpp tries them in a fixed
order (n-gram lookups first, then the draft model) and uses the first draft it gets. ggmlpy
has `ngram-simple` and `draft-simple`; `none` anywhere turns speculation off, and the
others are refused by name. A draft model (`-md`) with no `--spec-type` is used as
`draft-simple` (llama.cpp then infers a type from the file's metadata and, for a plain
model, leaves speculation off).
"""
from __future__ import annotations

from llama.server.config import ServerConfig
from llama.speculative import Drafter, FirstOf, NgramSimple
from llama.speculative.draft_model import DraftModel

TYPES = ("none", "ngram-simple", "draft-simple")
LLAMA_CPP_TYPES = ("draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-map-k",
                   "ngram-map-k4v", "ngram-mod", "ngram-cache")
ORDER = ("ngram-simple", "draft-simple")   # llama.cpp's order of preference


def spec_types(names: list[str], model_draft: str | None) -> list[str]:
    """The kinds in use, in llama.cpp's order of preference; ValueError for a name ggmlpy
    lacks or does not know."""
    for name in names:
        if name in LLAMA_CPP_TYPES:
            raise ValueError(f"--spec-type {name}: ggmlpy implements {', '.join(TYPES)}")
        if name not in TYPES:
            raise ValueError(f"unknown speculative type: {name} (one of {', '.join(TYPES)})")
    if "none" in names:
        return []
    chosen = set(names) or ({"draft-simple"} if model_draft else set())
    if "draft-simple" in chosen and not model_draft:
        raise ValueError("--spec-type draft-simple needs a draft model (-md FILE)")
    return [t for t in ORDER if t in chosen]


def make_drafter(config: ServerConfig, llm) -> Drafter | None:
    """The drafter the server's scheduler asks, or None without speculative decoding."""
    types = spec_types(config.spec_type, config.model_draft)
    if not types:
        return None
    drafters: list[Drafter] = []
    for kind in types:
        if kind == "ngram-simple":
            drafters.append(NgramSimple(config.spec_ngram_size_n, config.spec_ngram_size_m))
        else:
            drafters.append(DraftModel.load(
                config.model_draft, llm.model, n_ctx=llm.ctx.n_ctx, n_seq_max=llm.ctx.n_seq_max,
                n_threads=llm.ctx.n_threads, n_max=config.spec_draft_n_max,
                n_min=config.spec_draft_n_min, p_min=config.spec_draft_p_min))
    return drafters[0] if len(drafters) == 1 else FirstOf(drafters)
