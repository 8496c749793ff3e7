"""Every JSON-schema constraint is enforced: documents that jsonschema accepts can be
written through the mask, documents it rejects cannot (token by token, no model)."""
from __future__ import annotations

import json

import jsonschema
import pytest

from llama.grammar import Grammar, GrammarSampler

from .helpers import PieceIndex

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "height": {"type": "number", "exclusiveMinimum": 0.5, "maximum": 2.5},
        "role": {"enum": ["admin", "user", "guest"]},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                 "minItems": 1, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "floor": {"type": "integer", "minimum": -2}},
                    "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}

GOOD = {"name": "Ada", "age": 36, "height": 1.7, "role": "admin", "zip": "02139",
        "tags": ["x", "yz"], "address": {"city": "Paris", "floor": -1}}

# each breaks one constraint
BAD = {
    "integer above maximum": {**GOOD, "age": 121},
    "integer below minimum": {**GOOD, "age": -1},
    "integer as a fraction": {**GOOD, "age": 3.5},
    "number at exclusive minimum": {**GOOD, "height": 0.5},
    "number above maximum": {**GOOD, "height": 2.6},
    "not in enum": {**GOOD, "role": "root"},
    "pattern": {**GOOD, "zip": "0213"},
    "string too short": {**GOOD, "name": "A"},
    "string too long": {**GOOD, "name": "Alexandra"},
    "array too short": {**GOOD, "tags": []},
    "array too long": {**GOOD, "tags": ["a", "b", "c", "d"]},
    "item too long": {**GOOD, "tags": ["abcde"]},
    "missing required": {k: v for k, v in GOOD.items() if k != "age"},
    "additional property": {**GOOD, "extra": 1},
    "nested additional property": {**GOOD, "address": {"city": "Rome", "zip": 1}},
    "nested missing required": {**GOOD, "address": {"floor": 2}},
    "nested integer bound": {**GOOD, "address": {"city": "Rome", "floor": -3}},
    "wrong type": {**GOOD, "name": 5},
}


@pytest.fixture(scope="module")
def index(smollm2_vocab):
    return PieceIndex(smollm2_vocab)


@pytest.fixture(scope="module")
def grammar():
    return Grammar.from_json_schema(PERSON)


def test_valid_documents_pass(index, grammar):
    for doc in [GOOD, {"name": "Bo", "age": 0, "tags": ["a"]},
                {"name": "Chloé", "age": 120, "height": 2.5, "tags": ["", "b", "c"]}]:
        jsonschema.validate(doc, PERSON)
        text = json.dumps(doc, ensure_ascii=False)
        assert index.walk(GrammarSampler(index.vocab, grammar, prefetch=False), text)


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_documents_are_blocked(index, grammar, case):
    doc = BAD[case]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, PERSON)
    assert not index.walk(GrammarSampler(index.vocab, grammar, prefetch=False), json.dumps(doc))


def test_properties_come_in_schema_order(index, grammar):
    """llguidance writes the declared properties in the schema's order (a documented
    limitation): the same object with its keys swapped is valid JSON-schema-wise but cannot
    be generated."""
    doc = {"name": "Bo", "tags": ["b"], "age": 7}
    jsonschema.validate(doc, PERSON)
    assert not index.walk(GrammarSampler(index.vocab, grammar), json.dumps(doc))


def test_json_object_without_schema_is_any_object(index):
    grammar = Grammar.from_response_format({"type": "json_object"})
    assert index.walk(GrammarSampler(index.vocab, grammar), '{"a": [1, {"b": null}], "c": "d"}')
    assert not index.walk(GrammarSampler(index.vocab, grammar), "[1, 2]")
    assert not index.walk(GrammarSampler(index.vocab, grammar), '"text"')


def test_whitespace_is_compact_unless_flexible(index):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    pretty = '{\n  "a": 1\n}'
    assert not index.walk(GrammarSampler(index.vocab, Grammar.from_json_schema(schema)), pretty)
    flexible = Grammar.from_json_schema(schema, whitespace_flexible=True)
    assert index.walk(GrammarSampler(index.vocab, flexible), pretty)


def test_listed_properties_close_an_object_as_llama_cpp_reads_it(index):
    """llama.cpp's converter (llama-server's, llama-cpp-python's) admits no keys beyond the
    listed properties unless `additionalProperties` says so; JSON Schema would admit any.
    Nested objects too; an explicit `true`, a schema without properties and allOf members
    stay open."""
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "pet": {"type": "object", "properties": {"kind": {"type": "string"}}}},
              "required": ["name"]}
    closed = Grammar.from_json_schema(schema)

    def ok(grammar, doc) -> bool:
        return index.walk(GrammarSampler(index.vocab, grammar, prefetch=False), json.dumps(doc))
    assert ok(closed, {"name": "Bo", "pet": {"kind": "cat"}})
    assert not ok(closed, {"name": "Bo", "country": "FR"})
    assert not ok(closed, {"name": "Bo", "pet": {"kind": "cat", "age": 3}})
    assert ok(Grammar.from_json_schema({**schema, "additionalProperties": True}), {"name": "Bo", "x": 1})
    assert ok(Grammar.from_json_schema({"type": "object"}), {"any": [1]})
    merged = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                        {"type": "object", "properties": {"b": {"type": "integer"}}}]}
    jsonschema.validate({"a": 1, "b": 2}, merged)
    assert ok(Grammar.from_json_schema(merged), {"a": 1, "b": 2})
    assert "additionalProperties" not in schema   # the caller's schema is not changed
