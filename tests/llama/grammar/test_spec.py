"""Grammar construction: every source kind, llama-cpp-python's LlamaGrammar, and errors
raised at construction with llguidance's message naming the problem."""
from __future__ import annotations

import json

import pytest

from llama.grammar import ANY_JSON_OBJECT, Grammar, GrammarError, GrammarSampler, LlamaGrammar


def test_grammar_error_is_a_value_error():
    assert issubclass(GrammarError, ValueError)


@pytest.mark.parametrize("build, needle", [
    (lambda: Grammar.from_regex("a(b"), "unclosed group"),
    (lambda: Grammar.from_regex("[z-a]"), "invalid character class range"),
    (lambda: Grammar.from_lark("start: foo"), 'unknown name: "foo"'),
    (lambda: Grammar.from_gbnf("root ::= foo\nfoo ::= bar"), "Rule 'bar' not found"),
    (lambda: Grammar.from_gbnf('root ::= "abc'), "Unexpected end of input"),
    (lambda: Grammar.from_gbnf('root := "x"'), "Expected ::="),
    (lambda: Grammar.from_gbnf('answer ::= "x"'), "No 'root' rule found"),
    (lambda: Grammar.from_json_schema("{not json"), "not valid JSON"),
    (lambda: Grammar.from_json_schema("[1, 2]"), "must be an object"),
    (lambda: Grammar.from_json_schema({"type": "strin"}), "Invalid type: strin"),
    (lambda: Grammar.from_json_schema({"type": "integer", "minimum": "x"}), "minimum"),
    (lambda: Grammar.from_json_schema({"type": "string", "pattern": "[a-z"}),
     "unclosed character class"),
    (lambda: Grammar.from_json_schema({"type": "string", "format": "weird"}),
     "Unknown format: weird"),
    (lambda: Grammar.from_json_schema({"type": "array", "uniqueItems": True}),
     'Unimplemented keys: ["uniqueItems"]'),
    (lambda: Grammar.from_response_format({"type": "yaml"}), "unknown response_format type"),
    (lambda: Grammar.from_response_format({"type": "json_schema"}), '"json_schema"'),
    (lambda: LlamaGrammar.from_string("root ::= [0-9"), "invalid GBNF grammar"),
])
def test_bad_grammars_raise_naming_the_problem(build, needle):
    with pytest.raises(GrammarError) as info:
        build()
    assert needle in str(info.value)


def test_grammar_the_vocabulary_cannot_serve_fails_when_the_sampler_is_built(smollm2_vocab):
    grammar = Grammar.from_lark('start: <|no_such_token|> "x"')  # valid without a vocab
    with pytest.raises(GrammarError, match="unknown special token"):
        GrammarSampler(smollm2_vocab, grammar)


def test_lenient_ignores_unimplemented_keywords():
    grammar = Grammar.from_json_schema({"type": "array", "uniqueItems": True}, lenient=True)
    assert grammar.kind == "json_schema"


def test_json_schema_from_dict_and_text_are_the_same_grammar():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert Grammar.from_json_schema(schema) == Grammar.from_json_schema(json.dumps(schema))


def test_response_formats():
    schema = {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}
    assert Grammar.from_response_format({"type": "text"}) is None
    assert Grammar.from_response_format({"type": "json_object"}) == Grammar.json_object()
    assert Grammar.json_object() == Grammar.from_json_schema(ANY_JSON_OBJECT)
    by_schema = Grammar.from_json_schema(schema)
    assert Grammar.from_response_format({"type": "json_object", "schema": schema}) == by_schema
    openai = {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": schema}}
    assert Grammar.from_response_format(openai) == by_schema


def test_llama_grammar_is_a_grammar(tmp_path):
    gbnf = 'root ::= "yes" | "no"'
    from_string = LlamaGrammar.from_string(gbnf, verbose=False)
    assert isinstance(from_string, Grammar) and isinstance(from_string, LlamaGrammar)
    assert from_string.kind == "gbnf"
    assert from_string.definition == Grammar.from_gbnf(gbnf).definition
    path = tmp_path / "yesno.gbnf"
    path.write_text(gbnf)
    assert LlamaGrammar.from_file(path).definition == from_string.definition
    lark = LlamaGrammar.from_string('%llguidance {}\nstart: "a" | "b"')
    assert lark.kind == "lark"
    schema = LlamaGrammar.from_json_schema('{"type": "integer"}')
    assert schema.kind == "json_schema" and isinstance(schema, LlamaGrammar)


def test_llama_grammar_file_errors(tmp_path):
    with pytest.raises(GrammarError, match="cannot read grammar file"):
        LlamaGrammar.from_file(tmp_path / "missing.gbnf")
    empty = tmp_path / "empty.gbnf"
    empty.write_text("  \n")
    with pytest.raises(GrammarError, match="is empty"):
        LlamaGrammar.from_file(empty)
