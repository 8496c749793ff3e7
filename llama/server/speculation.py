"""The server's drafter, from llama-server's speculative options (what they mean:
llama/speculative/kinds.py)."""
from __future__ import annotations

from llama.server.config import ServerConfig
from llama.speculative import Drafter
from llama.speculative.kinds import SpecDraft


def make_drafter(config: ServerConfig, llm) -> Drafter | None:
    """The drafter the server's scheduler asks, or None without speculative decoding."""
    spec = SpecDraft.from_options(
        config.spec_type, config.model_draft, n_max=config.spec_draft_n_max, n_min=config.spec_draft_n_min,
        p_min=config.spec_draft_p_min, ngram_size_n=config.spec_ngram_size_n, ngram_size_m=config.spec_ngram_size_m)
    return None if spec is None else spec.bind(llm.engine)
