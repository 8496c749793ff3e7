"""Constrained generation with SmolLM2: at temperature 0 and 0.8 (a few seeds) the output
always parses and satisfies the schema or grammar, checked by jsonschema / re.fullmatch."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from llama.generate import generate
from llama.grammar import Grammar, GrammarSampler, LlamaGrammar
from llama.sampling import make_sampler

SAMPLING = [(0.0, None), (0.8, 1), (0.8, 2)]


def chat(request: str) -> str:
    return f"<|im_start|>user\n{request}<|im_end|>\n<|im_start|>assistant\n"


def run(ctx, grammar: Grammar, prompt: str, temp: float, seed: int | None,
        max_tokens: int = 80) -> str:
    """Generate under `grammar` from a clear cache; check the grammar saw only the output."""
    model = ctx.model
    ctx.memory.clear()
    constraint = GrammarSampler(model.vocab, grammar)
    sampler = make_sampler(n_vocab=model.n_vocab, temp=temp, seed=seed, grammar=constraint)
    result = generate(ctx, chat(prompt), max_tokens=max_tokens, sampler=sampler)
    assert result.stop_reason == "eog", f"did not finish: {result.text!r}"
    assert constraint.n_consumed == len(result.tokens) + 1  # the output and its end, no prompt
    constraint.close()
    return result.text


SCHEMAS = {
    "person": ("Describe a person as JSON.", {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 12},
                       "age": {"type": "integer", "minimum": 18, "maximum": 65}},
        "required": ["name", "age"], "additionalProperties": False}),
    "nested": ("Give a user record as JSON.", {
        "type": "object",
        "properties": {
            "user": {"type": "object",
                     "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999},
                                    "email": {"type": "string",
                                              "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
                     "required": ["id", "email"], "additionalProperties": False},
            "active": {"type": "boolean"}},
        "required": ["user", "active"], "additionalProperties": False}),
    "array": ("List some colors as JSON.", {
        "type": "object",
        "properties": {"colors": {"type": "array", "minItems": 2, "maxItems": 3,
                                  "items": {"enum": ["red", "green", "blue", "black"]}},
                       "count": {"type": "integer", "minimum": 2, "maximum": 3}},
        "required": ["colors", "count"], "additionalProperties": False}),
    "numbers": ("Report the weather as JSON.", {
        "type": "object",
        "properties": {"celsius": {"type": "number", "minimum": -40, "maximum": 45},
                       "humidity": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                       "level": {"type": "integer", "minimum": -3, "maximum": -1}},
        "required": ["celsius", "humidity", "level"], "additionalProperties": False}),
    "strings": ("Invent a product code as JSON.", {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z][0-9]{3}$"},
                       "label": {"type": "string", "minLength": 3, "maxLength": 10},
                       "tier": {"enum": ["gold", "silver", 3]}},
        "required": ["code", "label", "tier"], "additionalProperties": False}),
    "top-level-array": ("Give a few small numbers as a JSON array.", {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2, "maxItems": 4}),
}


@pytest.mark.parametrize("temp, seed", SAMPLING)
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_output_validates(smollm2_ctx, name, temp, seed):
    prompt, schema = SCHEMAS[name]
    text = run(smollm2_ctx, Grammar.from_json_schema(schema), prompt, temp, seed)
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("temp, seed", SAMPLING[:2])
def test_llama_cpp_python_style_schema_and_json_object(smollm2_ctx, temp, seed):
    _, schema = SCHEMAS["person"]
    text = run(smollm2_ctx, LlamaGrammar.from_json_schema(json.dumps(schema)),
               "Describe a person as JSON.", temp, seed)
    jsonschema.validate(json.loads(text), schema)
    rf = {"type": "json_object", "schema": SCHEMAS["array"][1]}
    text = run(smollm2_ctx, Grammar.from_response_format(rf), "List some colors as JSON.",
               temp, seed)
    jsonschema.validate(json.loads(text), rf["schema"])


ARITH_GBNF = r'''
root ::= num (" " op " " num){1,3}
op   ::= "+" | "-" | "*"
num  ::= [1-9] [0-9]?
'''
ARITH_RE = r"[1-9][0-9]?( [-+*] [1-9][0-9]?){1,3}"
DATE_RE = r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"


@pytest.mark.parametrize("temp, seed", SAMPLING)
def test_gbnf_output_matches(smollm2_ctx, temp, seed):
    text = run(smollm2_ctx, LlamaGrammar.from_string(ARITH_GBNF), "Write a sum.", temp, seed)
    assert re.fullmatch(ARITH_RE, text), text
    because = Grammar.from_gbnf('root ::= ("yes" | "no") ", because " [a-z ]{1,20} "."')
    answer = run(smollm2_ctx, because, "Is the sky blue? Explain briefly.", temp, seed)
    assert re.fullmatch(r"(yes|no), because [a-z ]{1,20}\.", answer), answer


@pytest.mark.parametrize("temp, seed", SAMPLING)
def test_regex_output_matches(smollm2_ctx, temp, seed):
    text = run(smollm2_ctx, Grammar.from_regex(DATE_RE), "When was the first moon landing?",
               temp, seed)
    assert re.fullmatch(DATE_RE, text), text
