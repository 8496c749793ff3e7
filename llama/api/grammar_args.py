"""The `grammar=` argument of the API, in whatever form it comes, as the sampler that is
the chain's first stage (docs/architecture.md, decision 12)."""
from __future__ import annotations

from typing import Any

from llama.sampling import Sampler
from llama.vocab import Vocab


def make_grammar_sampler(vocab: Vocab, grammar: Any) -> Sampler | None:
    """None; a `Grammar` or `LlamaGrammar`; or a GBNF string (llama-server's `grammar`
    field; `%llguidance` text is Lark, as in llama.cpp). A grammar the vocabulary cannot serve fails here, before any decode."""
    if grammar is None:
        return None
    from llama.grammar import GrammarSampler, LlamaGrammar
    if isinstance(grammar, str):
        grammar = LlamaGrammar.from_string(grammar, verbose=False)
    return GrammarSampler(vocab, grammar)
