"""Structured output: llguidance grammars as the first stage of the sampler chain.

    from llama.grammar import Grammar, GrammarSampler, LlamaGrammar
    from llama.sampling import make_sampler

    grammar = Grammar.from_json_schema({"type": "object", "properties": {...}})
    # or Grammar.from_gbnf('root ::= "yes" | "no"'), Grammar.from_regex(r"\\d{4}"),
    # Grammar.from_lark(...), Grammar.from_response_format(response_format),
    # LlamaGrammar.from_string(gbnf) / .from_file(path) / .from_json_schema(text)
    sampler = make_sampler(n_vocab=model.n_vocab, temp=0.8,
                           grammar=GrammarSampler(model.vocab, grammar))
    generate(ctx, prompt, sampler=sampler)

Modules: `spec` (Grammar: sources compiled and validated by llguidance), `llama_grammar`
(llama-cpp-python's LlamaGrammar), `tokenizer` (llguidance's tokenizer from the vocab's
token bytes, kept per vocab), `mask` (the next-token mask, computed in the background
while the decode runs), `sampler` (GrammarSampler), `errors` (GrammarError).
"""
from .errors import GrammarError
from .llama_grammar import LlamaGrammar
from .mask import MaskStats
from .sampler import GrammarSampler
from .spec import ANY_JSON_OBJECT, Grammar
from .tokenizer import build_tokenizer, tokenizer_for

__all__ = ["ANY_JSON_OBJECT", "Grammar", "GrammarError", "GrammarSampler", "LlamaGrammar",
           "MaskStats", "build_tokenizer", "tokenizer_for"]
