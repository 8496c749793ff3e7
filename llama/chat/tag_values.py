"""The values of calls written as tags (tagged_calls.py): a tag holds an argument's text, and the
tool's schema says what that text is. A string parameter keeps the text; one that cannot be a
string is read as JSON; one that may be either is read as JSON when the text is JSON of a type
it allows (so ``3`` is a number where the schema allows one, and text where it asks for text).
"""
from __future__ import annotations

import json
from typing import Any

_JSON_TYPES = {"object", "array", "number", "integer", "boolean", "null"}


def value_types(schema: Any) -> set[str]:
    """The JSON types a parameter's schema allows (every type when it says none)."""
    if not isinstance(schema, dict):
        return _JSON_TYPES | {"string"}
    kinds = schema.get("type")
    if isinstance(kinds, str):
        return {kinds}
    if isinstance(kinds, list):
        return {k for k in kinds if isinstance(k, str)}
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return set().union(*(value_types(s) for s in schema[key]))
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return {"string"}
    if "const" in schema:
        return {"string"} if isinstance(schema["const"], str) else set(_JSON_TYPES)
    return _JSON_TYPES | {"string"}


def typed_value(text: str, schema: Any) -> Any:
    """A parameter's text as the value its schema asks for."""
    kinds = value_types(schema)
    if kinds == {"string"}:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    kind = _kind(value)
    if kind == "number" and "number" not in kinds and "integer" in kinds and float(value).is_integer():
        return int(value)
    if kind != "string" and (kind in kinds or (kind == "integer" and "number" in kinds)):
        return value
    return text


def _kind(value: Any) -> str:
    """The JSON type of a parsed value ("string" for a quoted text, which stays as written)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {dict: "object", list: "array", str: "string"}.get(type(value), "null")
