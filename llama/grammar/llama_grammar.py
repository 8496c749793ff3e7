"""`LlamaGrammar`: llama-cpp-python's grammar class, as a `Grammar`.

llama-cpp-python code builds grammars with `LlamaGrammar.from_string(gbnf)`,
`LlamaGrammar.from_file(path)` and `LlamaGrammar.from_json_schema(schema_json)` and passes
them as `grammar=`. Being a `Grammar` subclass, a LlamaGrammar is accepted wherever a
Grammar is. Differences from llama-cpp-python: JSON schemas are compiled by llguidance
(every constraint it implements is enforced, instead of a GBNF approximation), errors are
`GrammarError` at construction, and `verbose` is accepted and ignored.

As in llama.cpp's common sampler, a grammar string that starts with "%llguidance" is
llguidance's Lark dialect rather than GBNF.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from .errors import GrammarError
from .spec import Grammar

LLGUIDANCE_PREFIX = "%llguidance"


class LlamaGrammar(Grammar):
    """A grammar built the llama-cpp-python way."""

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        """GBNF text, or Lark text starting with "%llguidance"."""
        if not isinstance(grammar, str):
            raise GrammarError(f"grammar must be a str, got {type(grammar).__name__}")
        if grammar.lstrip().startswith(LLGUIDANCE_PREFIX):
            return cls.from_lark(grammar)
        return cls.from_gbnf(grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        """The grammar in a text file (GBNF, or "%llguidance" Lark)."""
        try:
            with open(file, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise GrammarError(f"cannot read grammar file {os.fspath(file)!r}: {e}") from e
        if not text.strip():
            raise GrammarError(f"grammar file {os.fspath(file)!r} is empty")
        return cls.from_string(text, verbose=verbose)

    @classmethod
    def from_json_schema(cls, json_schema: Mapping[str, Any] | str, verbose: bool = True, *,
                         whitespace_flexible: bool = False, lenient: bool = False) -> LlamaGrammar:
        """A JSON schema (its JSON text, as llama-cpp-python takes it, or a dict)."""
        return super().from_json_schema(json_schema, whitespace_flexible=whitespace_flexible,
                                        lenient=lenient)
