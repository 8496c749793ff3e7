"""The grammars that force a tool call (``tool_choice`` "required" or a named function), in each
family's syntax as call_formats.py describes it, and the generic format's instruction.

One call, or with ``parallel_tool_calls`` one or more, as llama.cpp's grammars allow them: the
shape's ``repeat`` says whether another call repeats the whole block (Hermes' ``<tool_call>``,
Qwen3-Coder's, Muse Glimmer's call message, after ``<|eom|><|start|>assistant``) or goes inside
it (an array's next item, Kimi's and DeepSeek's sections, DSML's and MiniMax's invokes); a family
that writes one call (Llama 3.x, GigaChat, gpt-oss) gets one.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from llama.chat.call_formats import ToolFormat, tool_format
from llama.chat.gemma_grammar import gemma_grammar

_MORE = '({} {})*'   # the calls or blocks after the first, each after the shape's `between` (or a newline)


def function_of(tool: dict) -> dict:
    """The ``function`` part of an OpenAI tool."""
    if tool.get("type", "function") != "function" or not isinstance(tool.get("function"), dict):
        raise ValueError(f"not an OpenAI function tool: {tool!r}")
    return tool["function"]


def parameter_schemas(tools: list[dict]) -> dict[str, Any]:
    """Each tool's ``parameters`` schema by its name (the readers type argument values by them)."""
    return {f.get("name"): f.get("parameters") or {} for f in map(function_of, tools)}


def _chosen(tools: list[dict], tool_choice: Any) -> list[dict]:
    functions = [function_of(t) for t in tools]
    if not functions:
        raise ValueError("no tools to call")
    if tool_choice in ("required", "auto"):
        return functions
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [f for f in functions if f.get("name") == name]
        if not chosen:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
        return chosen[:1]
    raise ValueError(f"no grammar forces a call for tool_choice={tool_choice!r}")


def _call_schema(function: dict, spec: ToolFormat) -> dict:
    params = function.get("parameters") or {"type": "object"}
    if spec.name_as_key:
        return {"type": "object", "properties": {function["name"]: params}, "required": [function["name"]],
                "additionalProperties": False}
    key = spec.arg_keys[0]
    return {
        "type": "object",
        "properties": {spec.name_key: {"const": function["name"]}, key: params, **dict(spec.grammar.call_extra)},
        "required": [spec.name_key, key],
        "additionalProperties": False,
    }


# JSON written the way the templates' ``tojson`` writes it; flexible whitespace lets a model loop on blanks.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_STYLED = {"x-guidance": _JSON_STYLE}


def tool_call_grammar(tools: list[dict], tool_choice: Any, fmt: str,
                      special_tokens: Optional[Mapping[str, int]] = None, parallel: bool = False) -> str:
    """A llguidance Lark grammar for one call in ``fmt``'s syntax (one or more with ``parallel``,
    where the family writes several), its arguments held to the tool's ``parameters`` schema:
    any tool for ``tool_choice="required"``, the named one for ``{"type": "function",
    "function": {"name": ..}}``. For ``generic`` only, ``"auto"`` also allows ``{"response":
    ".."}`` (as llama.cpp constrains its generic format); native formats need no grammar then,
    so ``"auto"`` and ``"none"`` raise ValueError there, as does a family with no forced form.

    ``special_tokens`` maps markers that are single special tokens in the model's vocabulary (say
    ``{"[TOOL_CALLS]": 5}``) to their ids; they are then matched as that token (``<[5]>``), not as text.
    """
    spec = tool_format(fmt)
    shape = spec.grammar
    if tool_choice == "auto" and fmt != "generic":
        raise ValueError(f"tool_choice='auto' needs no grammar in the {fmt} format")
    if shape.json is None:
        raise ValueError(f"the {fmt} tool-call format has no grammar for a forced call")
    chosen = _chosen(tools, tool_choice)
    repeat = shape.repeat if parallel else None
    if shape.json == "gemma":
        return gemma_grammar(chosen, repeat)
    if shape.json == "tagged":
        assert shape.syntax is not None
        return shape.syntax.grammar(chosen, "".join(shape.before), "".join(shape.after), repeat, shape.between)
    tokens = special_tokens or {}

    def marker(s: str) -> str:
        if s in tokens:
            return f"<[{tokens[s]}]>"
        # a call's number (Kimi's ids): 0 for the one call, any for several
        parts = [json.dumps(p, ensure_ascii=False) for p in s.split("\0") if p]
        return (" /[0-9]{1,3}/ " if repeat else " ").join(parts) if "\0" in s else parts[0] if parts else '""'

    def markers(items: tuple[str, ...], name: str = "") -> list[str]:
        return [marker(m.format(name=name, index="\0" if repeat else "0")) for m in items]

    def more(rule: str) -> str:
        return _MORE.format(marker(shape.between) if shape.between else '"\\n"?', rule)

    if shape.json == "named":
        rules = [f"f{i}_args: %json {json.dumps({**(f.get('parameters') or {'type': 'object'}), **_STYLED})}"
                 for i, f in enumerate(chosen)]
        calls = [" ".join(markers(shape.before, f["name"]) + [f"f{i}_args"] + markers(shape.after))
                 for i, f in enumerate(chosen)]
        body = " ".join(markers(shape.section[:1]) + ["call" + (" " + more("call") if repeat else "")]
                        + markers(shape.section[1:]))
        return (f"start: {body}\ncall: " + " | ".join(f"({c})" for c in calls) + "\n" + "\n".join(rules) + "\n")
    calls = [_call_schema(f, spec) for f in chosen]
    call = {"anyOf": calls} if len(calls) > 1 else calls[0]
    one = {} if repeat else {"maxItems": 1}
    if shape.json == "array":
        schema: dict = {"type": "array", "items": call, "minItems": 1, **one}
    elif shape.json == "tool_calls":
        schema = {"type": "object", "properties": {"tool_calls": {
            "type": "array", "items": call, "minItems": 1, **one}},
            "required": ["tool_calls"], "additionalProperties": False}
        if tool_choice == "auto":
            response = {"type": "object", "properties": {"response": {"type": "string"}},
                        "required": ["response"], "additionalProperties": False}
            schema = {"anyOf": [schema, response]}
    else:
        schema = call
    schema = {**schema, "x-guidance": _JSON_STYLE}
    parts = " ".join(markers(shape.before) + ["call"] + markers(shape.after))
    if repeat == "block":
        return f"start: block {more('block')}\nblock: {parts}\ncall: %json {json.dumps(schema)}\n"
    return f"start: {parts}\ncall: %json {json.dumps(schema)}\n"


def generic_tools_instruction(tools: list[dict]) -> str:
    """System text for the generic format, for templates that do not render ``tools``: the tools, and the
    one JSON object to reply with (the shape `parse_tool_calls` reads and the grammar enforces)."""
    described = [{"name": f["name"], "description": f.get("description", ""),
                  "parameters": f.get("parameters") or {"type": "object"}}
                 for f in (function_of(t) for t in tools)]
    return (
        "You can call the following tools. Each is given as JSON with its name, what it does, and the JSON "
        "schema of its arguments:\n\n"
        + "\n".join(json.dumps(d, ensure_ascii=False) for d in described)
        + "\n\nRespond with a single JSON object and nothing else, in one of two forms.\n"
        'To call tools: {"tool_calls": [{"name": "<tool name>", "arguments": {<arguments, following the '
        "tool's schema>}}]}\n"
        'To answer the user directly: {"response": "<your answer>"}'
    )
