"""The grammar that forces a Gemma 4 call, ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>``,
its arguments held to the function's schema where Gemma's syntax allows: the required
parameters in the schema's order, then any optional ones; a string parameter is text between
``<|"|>`` marks (one of an ``enum``'s), a number, integer, boolean or null one a JSON value of
its schema (Gemma writes those as JSON does), anything else any Gemma value (llama.cpp's
``gemma4-value``, which is all llama.cpp's grammar allows for every argument).
"""
from __future__ import annotations

import json
from typing import Optional

from llama.chat.tagged_calls import parameter_order, value_types

QUOTE = '"<|\\"|>"'
OPEN, CLOSE = '"<|tool_call>call:"', '"<tool_call|>"'
JSON_KINDS = {"number", "integer", "boolean", "null"}
# any value in Gemma's syntax, as llama.cpp's gemma4-value rules
_ANY = [
    'g_value: g_string | g_dict | g_array | %json {"type": ["number", "boolean", "null"]}',
    f"g_string: {QUOTE} g_text",
    'g_text[suffix="<|\\"|>"]: /(?s:.*)/',
    'g_dict: "{" (g_kv ("," g_kv)*)? "}"',
    'g_kv: /[^:}]+/ ":" g_value',
    'g_array: "[" (g_value ("," g_value)*)? "]"',
]


def gemma_grammar(functions: list[dict], repeat: Optional[str] = None) -> str:
    """A llguidance Lark grammar for one call to one of `functions` (OpenAI function objects),
    or with `repeat` one or more calls, each in its own block."""
    rules, choices = list(_ANY), []
    for i, function in enumerate(functions):
        properties, required, optional = parameter_order(function)
        names = {}
        for j, key in enumerate(properties):
            names[key] = f"f{i}_p{j}"
            rules.append(f"f{i}_p{j}: {json.dumps(key + ':')} {_value(properties[key], f'f{i}_v{j}', rules)}")
        if required:
            body = ' "," '.join(names[k] for k in required)
            if optional:
                body += ' ("," (' + " | ".join(names[k] for k in optional) + "))*"
        elif optional:
            any_optional = "(" + " | ".join(names[k] for k in optional) + ")"
            body = f'({any_optional} ("," {any_optional})*)?'
        else:
            body = ""
        rules.append(f'f{i}: {OPEN} {json.dumps(function["name"])} "{{" {body} "}}" {CLOSE}'.replace("  ", " "))
        choices.append(f"f{i}")
    start = "call" + (' ("\\n"? call)*' if repeat else "")
    return f"start: {start}\ncall: " + " | ".join(choices) + "\n" + "\n".join(rules) + "\n"


def _value(schema: dict, rule: str, rules: list[str]) -> str:
    """The grammar of one argument's value; `rule` names the extra rule it may need."""
    kinds = value_types(schema)
    if kinds == {"string"}:
        values = schema.get("enum") if isinstance(schema.get("enum"), list) else (
            [schema["const"]] if "const" in schema else None)
        if values:
            return f"{QUOTE} (" + " | ".join(json.dumps(str(v)) for v in values) + f") {QUOTE}"
        return "g_string"
    if kinds and kinds <= JSON_KINDS:
        rules.append(f"{rule}: %json {json.dumps(schema)}")
        return rule
    return "g_value"
