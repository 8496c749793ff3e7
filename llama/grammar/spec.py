"""`Grammar`: what the output must look like, compiled to llguidance's grammar and checked.

A Grammar does not depend on a vocabulary: it is the llguidance grammar text plus where it
came from. Every constructor validates it with llguidance, so a bad schema, regex or GBNF
raises `GrammarError` (with llguidance's message) when the request is built, not in the
middle of a generation.

JSON schemas are compiled by llguidance itself (not converted to GBNF first, as
llama-cpp-python does), so every keyword it implements is enforced: integer and number
bounds, enum/const, pattern, format, min/maxLength, min/maxItems, required,
additionalProperties, anyOf/oneOf/allOf, $ref. A keyword it does not implement (e.g.
uniqueItems, not, lookaround in a pattern) is an error unless `lenient=True`. As
llguidance does, declared properties are written in the schema's order, and characters are
written as themselves rather than as "\\u" escapes.

Objects: an object schema that lists `properties` and says nothing of
`additionalProperties` admits no other keys, as llama.cpp's schema converter (which
llama-server and llama-cpp-python use) reads it, where JSON Schema itself would allow any
(`closed_objects`; an explicit `additionalProperties` or `patternProperties` is kept as
written, and the members of an `allOf` are left open so that they can be merged).

Whitespace: by default JSON is written compactly in `json.dumps` style (", " and ": ", no
newlines), which keeps small models from padding with whitespace until max_tokens runs out.
`whitespace_flexible=True` allows any JSON whitespace, as llguidance does by default. A
schema's own "x-guidance" options override both.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

from .errors import GrammarError

GrammarKind = Literal["json_schema", "gbnf", "regex", "lark"]

# json.dumps-style separators; llguidance then allows no other whitespace
_COMPACT_JSON: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ",
                                 "key_separator": ": "}
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}
# where a schema holds further schemas: one schema, a list of them, or a map of them
_SUBSCHEMA = {"items": "one", "additionalProperties": "one", "contains": "one", "not": "one",
              "prefixItems": "list", "anyOf": "list", "oneOf": "list",
              "properties": "map", "patternProperties": "map", "$defs": "map", "definitions": "map"}


def closed_objects(schema: Any, *, close: bool = True) -> Any:
    """`schema` with `"additionalProperties": false` on every object schema that lists
    properties and leaves extra keys unsaid (llama.cpp's reading); a new structure, the
    input is not changed. `close=False` for an `allOf` member, which is merged with others."""
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        kind = _SUBSCHEMA.get(key)
        if key == "allOf" and isinstance(value, list):
            out[key] = [closed_objects(v, close=False) for v in value]
        elif kind == "one":
            out[key] = closed_objects(value)
        elif kind == "list" and isinstance(value, list):
            out[key] = [closed_objects(v) for v in value]
        elif kind == "map" and isinstance(value, Mapping):
            out[key] = {k: closed_objects(v) for k, v in value.items()}
        else:
            out[key] = value
    if (close and isinstance(out.get("properties"), Mapping)
            and "additionalProperties" not in out and "patternProperties" not in out):
        out["additionalProperties"] = False
    return out


@dataclass(frozen=True)
class Grammar:
    """A validated llguidance grammar.

    kind: the source language; source: the text given (a schema as JSON text);
    definition: the llguidance grammar passed to `LLMatcher`; warnings: what llguidance
    noted while validating it (e.g. a keyword it accepts but does not enforce fully).
    """

    kind: GrammarKind
    source: str
    definition: str
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_json_schema(cls, schema: Mapping[str, Any] | str, *, whitespace_flexible: bool = False,
                         lenient: bool = False) -> Grammar:
        """Output must be one JSON value valid under `schema` (a dict or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, Mapping):
            raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
        source = json.dumps(closed_objects(schema))
        options: dict[str, Any] = {} if whitespace_flexible else dict(_COMPACT_JSON)
        if lenient:
            options["lenient"] = True
        try:
            definition = llguidance.LLMatcher.grammar_from_json_schema(source, defaults=options)
        except ValueError as e:
            raise GrammarError(f"invalid JSON schema: {e}") from None
        return cls._checked("json_schema", source, definition)

    @classmethod
    def json_object(cls, schema: Mapping[str, Any] | str | None = None, *,
                    whitespace_flexible: bool = False, lenient: bool = False) -> Grammar:
        """llama-cpp-python's `{"type": "json_object"}`: any JSON object, or one of `schema`."""
        return cls.from_json_schema(ANY_JSON_OBJECT if schema is None else schema,
                                    whitespace_flexible=whitespace_flexible, lenient=lenient)

    @classmethod
    def from_gbnf(cls, gbnf: str) -> Grammar:
        """A llama.cpp GBNF grammar (`root ::= ...`), through llguidance's GBNF converter."""
        try:
            lark = gbnf_to_lark(gbnf)
        except Exception as e:  # the converter raises bare Exception for undefined rules
            raise GrammarError(f"invalid GBNF grammar: {e}") from None
        return cls._checked("gbnf", gbnf, llguidance.LLMatcher.grammar_from_lark(lark))

    @classmethod
    def from_regex(cls, pattern: str) -> Grammar:
        """Output must match `pattern` entirely (Rust `regex` syntax, close to Python's)."""
        return cls._checked("regex", pattern, llguidance.LLMatcher.grammar_from_regex(pattern))

    @classmethod
    def from_lark(cls, lark: str) -> Grammar:
        """A grammar in llguidance's Lark dialect (`start: ...`)."""
        return cls._checked("lark", lark, llguidance.LLMatcher.grammar_from_lark(lark))

    @classmethod
    def from_response_format(cls, response_format: Mapping[str, Any]) -> Grammar | None:
        """The grammar of an OpenAI / llama-cpp-python `response_format`; None for text.

        Accepts {"type": "text"}, {"type": "json_object"} (any object, or
        llama-cpp-python's {"type": "json_object", "schema": {...}}) and OpenAI's
        {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}.
        """
        if not isinstance(response_format, Mapping):
            raise GrammarError("response_format must be an object, got "
                               f"{type(response_format).__name__}")
        kind = response_format.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return cls.json_object(response_format.get("schema"))
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, Mapping) or "schema" not in spec:
                raise GrammarError('response_format of type "json_schema" needs '
                                   '"json_schema": {"schema": {...}}')
            return cls.from_json_schema(spec["schema"])
        raise GrammarError(f"unknown response_format type {kind!r} "
                           '(expected "text", "json_object" or "json_schema")')

    @classmethod
    def _checked(cls, kind: GrammarKind, source: str, definition: str) -> Grammar:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(definition)
        if is_error:
            raise GrammarError(f"invalid {kind.replace('_', ' ')} grammar: {messages[0].strip()}")
        return cls(kind, source, definition, tuple(messages))

    def __repr__(self) -> str:
        text = self.source if len(self.source) <= 60 else self.source[:57] + "..."
        return f"{type(self).__name__}({self.kind}: {text!r})"
