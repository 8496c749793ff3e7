"""Qwen3-Coder's XML tool calls (also Qwen3.5's, Nemotron Nano 3's and StepFun 3.5's), as
llama.cpp's common/parsers/qwen3-coder.cpp reads and constrains them:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A value is text up to "\\n</parameter>\\n"; it is typed by the tool's schema: a parameter
that can only be a string keeps the text, one that cannot be a string is read as JSON, and
one that may be either is read as JSON when the text is JSON of a type it allows (else the
text). `read_xml_calls` is the reader tool_calls.py's scanner uses for a closed
`<tool_call>` block; `xml_call_grammar` is the llguidance grammar of one forced call.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional

import regex

_FUNCTION = regex.compile(r"\s*<function=([^>\n]+)>\n?(.*?)</function>\s*", regex.S)
_PARAMETER = regex.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", regex.S)
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


def read_xml_calls(payload: str, schemas: Mapping[str, Any]) -> Optional[list[tuple[str, str]]]:
    """The calls of one `<tool_call>` block's text (name, arguments as JSON text), or None when
    it is not well-formed. `schemas`: each tool's parameters schema, by name, to type the values."""
    calls, pos = [], 0
    while pos < len(payload):
        m = _FUNCTION.match(payload, pos)
        if m is None:
            return None if payload[pos:].strip() else (calls or None)
        name, body = m.group(1).strip(), m.group(2)
        properties = (schemas.get(name) or {}).get("properties") or {}
        args: dict[str, Any] = {}
        at = 0
        while body[at:].strip():
            p = _PARAMETER.match(body, at)
            if p is None:
                return None
            key = p.group(1).strip()
            args[key] = typed_value(p.group(2), properties.get(key))
            at = p.end()
        calls.append((name, json.dumps(args, ensure_ascii=False)))
        pos = m.end()
    return calls or None


# A value's closing tag; the newline before it, which the templates write, is not required
# (a model may leave it out, and the reader takes either).
CLOSE = '"\\n"? "</parameter>\\n"'


def xml_call_grammar(functions: list[dict]) -> str:
    """A llguidance Lark grammar for exactly one call to one of `functions` (OpenAI function
    objects): the required parameters in the schema's order, then any optional ones, each
    value a JSON value of its schema or, for a string, text (one of an `enum`'s)."""
    rules, choices = [], []
    for i, function in enumerate(functions):
        params = function.get("parameters") or {}
        properties = params.get("properties") or {}
        required = [k for k in params.get("required", []) if k in properties]
        optional = [k for k in properties if k not in required]
        names = {}
        for j, key in enumerate(list(properties)):
            rule = f"f{i}_p{j}"
            names[key] = rule
            schema = properties[key]
            kinds = value_types(schema)
            if isinstance(schema, dict) and kinds == {"string"} and isinstance(schema.get("enum"), list):
                options = " | ".join(json.dumps(v) for v in schema["enum"])
                rules.append(f'{rule}: "<parameter={key}>\\n" ({options}) {CLOSE}')
            elif "string" in kinds:   # text up to the closing tag (a lazy lexeme; the reader drops its "\n")
                rules.append(f'{rule}: "<parameter={key}>\\n" f{i}_t{j}')
                rules.append(f'f{i}_t{j}[suffix="</parameter>\\n"]: /(?s:.*)/')
            else:
                rules.append(f"f{i}_v{j}: %json {json.dumps(schema)}")
                rules.append(f'{rule}: "<parameter={key}>\\n" f{i}_v{j} {CLOSE}')
        body = " ".join(names[k] for k in required)
        if optional:
            body += " (" + " | ".join(names[k] for k in optional) + ")*"
        rules.append(f'f{i}: "<function={function["name"]}>\\n" {body} "</function>\\n"')
        choices.append(f"f{i}")
    head = ['start: "<tool_call>\\n" call "</tool_call>"', "call: " + " | ".join(choices)]
    return "\n".join(head + rules) + "\n"
