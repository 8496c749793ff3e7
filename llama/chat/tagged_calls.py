"""Tool calls written as tags, one tag per argument, as several families write them:

    Qwen3-Coder, Qwen3.5              <function=get_weather>
                                      <parameter=city>
                                      Paris
                                      </parameter>
                                      </function>
    Seed-OSS                          <function=get_weather><parameter=city>Paris</parameter></function>
    MiniMax M2                        <invoke name="get_weather"><parameter name="city">Paris</parameter></invoke>
    DeepSeek V3.2/V4 (DSML)           <｜DSML｜invoke name="get_weather">
                                      <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
                                      </｜DSML｜invoke>
    GLM 4.5+, Ling, Spark             get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>
    MiniCPM 5                         <function name="get_weather"><param name="city">Paris</param></function>
    Kimi K3                           <|open|>call tool="get_weather" index="1"<|sep|>
                                      <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>
                                      <|close|>call<|sep|>

Each family is a `TagSyntax`: the tags around a call (with `{name}`) and around an argument
(with `{key}`, and DSML's `{string}` flag), as data; one reader and one grammar builder
serve them all. An argument's text is typed by the tool's schema (`typed_value`): a string
parameter keeps the text, one that cannot be a string is read as JSON, one that may be
either is read as JSON when the text is JSON of a type it allows. DSML says which in its
`string` attribute.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping, Optional

import regex

_JSON_TYPES = {"object", "array", "number", "integer", "boolean", "null"}
_FIELDS = {"name": r"(?P<name>[^<>\"\n]+)", "key": r"(?P<key>[^<>\"\n]+)", "string": r"(?P<string>true|false)",
           "attrs": r"(?:[^<>]*)"}


def _pattern(template: str, back: bool = False) -> str:
    """A tag template as a regex: `{name}`, `{key}` and `{string}` become groups (in a closing
    tag, `{key}` must repeat the opening's), `{attrs}` any further attributes (read past, as
    llama.cpp reads Kimi K3's index and type), a newline any whitespace, the rest is literal."""
    def literal(text: str) -> str:
        return r"\s*".join(regex.escape(part) for part in text.split("\n"))

    out, rest = [], template
    while rest:
        i = rest.find("{")
        j = rest.find("}", i)
        if i < 0 or j < 0:
            out.append(literal(rest))
            break
        field = rest[i + 1:j]
        out.append(literal(rest[:i]))
        out.append("(?P=key)" if back and field == "key" else _FIELDS[field])
        rest = rest[j + 1:]
    return "".join(out)


CDATA_OPEN, CDATA_CLOSE = "<![CDATA[", "]]>"
CDATA_OPEN_RE, CDATA_CLOSE_RE = regex.escape(CDATA_OPEN), regex.escape(CDATA_CLOSE)


@dataclass(frozen=True)
class TagSyntax:
    """How one family writes a call's name and arguments (see the module's table).
    `newlines`: a value may have one newline after its opening tag and one before its
    closing tag that are not part of it (Qwen3-Coder's layout). `cdata`: a value that may be
    a string may be a CDATA section, its inner text the value (MiniCPM 5's, so that it can
    hold its closing tag)."""
    call_open: str
    call_close: str
    param_open: str
    param_close: str
    newlines: bool = False
    cdata: bool = False

    @cached_property
    def call_re(self) -> regex.Pattern:
        close = _pattern(self.call_close) if self.call_close else r"\Z"
        return regex.compile(rf"\s*{_pattern(self.call_open)}\s*(?P<body>.*?){close}\s*", regex.S)

    @cached_property
    def param_re(self) -> regex.Pattern:
        nl = r"\n?" if self.newlines else ""
        close = _pattern(self.param_close, True)
        cdata = rf"{CDATA_OPEN_RE}(?P<cdata>.*?){CDATA_CLOSE_RE}(?={close})|" if self.cdata else ""
        return regex.compile(rf"\s*{_pattern(self.param_open)}{nl}(?:{cdata}(?P<value>.*?)){nl}{close}", regex.S)

    def read(self, payload: str, schemas: Mapping[str, Any]) -> Optional[list[tuple[str, str]]]:
        """The calls of one block's text (name, arguments as JSON text), or None when it is not
        well-formed. `schemas`: each tool's parameters schema, by name, to type the values."""
        calls, pos, call_re, param_re = [], 0, self.call_re, self.param_re
        while pos < len(payload):
            m = call_re.match(payload, pos)
            if m is None or m.end() == pos:
                return None if payload[pos:].strip() else (calls or None)
            name, body = m.group("name").strip(), m.group("body")
            properties = (schemas.get(name) or {}).get("properties") or {}
            args: dict[str, Any] = {}
            at = 0
            while body[at:].strip():
                p = param_re.match(body, at)
                if p is None:
                    return None
                key = p.group("key").strip()
                flag = p.groupdict().get("string")
                schema = {"type": "string"} if flag == "true" else properties.get(key)
                inner = p.groupdict().get("cdata")
                if inner is not None and "string" in value_types(schema):
                    args[key] = inner
                elif inner is not None:
                    return None
                else:
                    value = p.group("value")
                    args[key] = json.loads(value) if flag == "false" else typed_value(value, schema)
                at = p.end()
            calls.append((name, json.dumps(args, ensure_ascii=False)))
            pos = m.end()
        return calls or None

    def grammar(self, functions: list[dict], before: str, after: str, repeat: Optional[str] = None) -> str:
        """A llguidance Lark grammar for one call to one of `functions` (OpenAI function
        objects) between the block markers `before` and `after`: the required
        parameters in the schema's order, then any optional ones, each value a JSON value of
        its schema or, for a string, text (one of an `enum`'s). `repeat` (parallel calls):
        "call", more calls inside the block; "block", more blocks."""
        nl = "\\n" if self.newlines else ""
        gap = "" if self.newlines else ' "\\n"?'   # a free newline between tags, where the layout has none fixed
        rules, choices = [], []
        for i, function in enumerate(functions):
            properties, required, optional = parameter_order(function)
            names = {}
            for j, key in enumerate(list(properties)):
                rule = f"f{i}_p{j}"
                names[key] = rule
                schema = properties[key]
                kinds = value_types(schema)
                as_string = "string" in kinds
                opening = _lark(self.param_open.format(key=key, string="true" if as_string else "false", attrs="{attrs}")) + \
                    (f' "{nl}"' if nl else "")
                closing = self.param_close.format(key=key) + ("\n" if nl else "")
                close = (f'"{nl}"? ' if nl else "") + _lark(closing) + gap
                if isinstance(schema, dict) and kinds == {"string"} and isinstance(schema.get("enum"), list):
                    options = " | ".join(json.dumps(v) for v in schema["enum"])
                    rules.append(f"{rule}: {opening} ({options}) {close}")
                elif as_string:   # text up to the closing tag (a lazy lexeme; the reader drops its "\n")
                    rules.append(f"{rule}: {opening} f{i}_t{j}{gap}")
                    rules.append(f"f{i}_t{j}[suffix={_lark(closing)}]: /(?s:.*)/")
                else:
                    rules.append(f"f{i}_v{j}: %json {json.dumps(schema)}")
                    rules.append(f"{rule}: {opening} f{i}_v{j} {close}")
            body = " ".join(names[k] for k in required)
            if optional:
                body += " (" + " | ".join(names[k] for k in optional) + ")*"
            head = _lark(self.call_open.format(name=function["name"], attrs="{attrs}") + ("\n" if nl else "")) + gap
            tail = _lark(self.call_close + ("\n" if nl else "")) + gap if self.call_close else ""
            rules.append(f"f{i}: {head} {body} {tail}".rstrip())
            choices.append(f"f{i}")
        calls = 'call ("\\n"? call)*' if repeat == "call" else "call"
        block = " ".join(p for p in (_lark(before) + gap if before else "", calls, _lark(after) if after else "") if p)
        top = ['start: block ("\\n"? block)*', f"block: {block}"] if repeat == "block" else [f"start: {block}"]
        return "\n".join(top + ["call: " + " | ".join(choices)] + rules) + "\n"


def _lark(text: str) -> str:
    """A literal of the grammar; `{attrs}` in a tag becomes any further attributes."""
    parts = text.split("{attrs}")
    return ' /[^<>]*/ '.join(json.dumps(p, ensure_ascii=False) for p in parts)


def parameter_order(function: dict) -> tuple[dict, list[str], list[str]]:
    """A function's parameter schemas by name, the required names in the schema's order, then
    the optional ones: the order a forced call's grammar writes them in."""
    params = function.get("parameters") or {}
    properties = params.get("properties") or {}
    required = [k for k in params.get("required", []) if k in properties]
    return properties, required, [k for k in properties if k not in required]


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


QWEN3_CODER = TagSyntax("<function={name}>", "</function>", "<parameter={key}>", "</parameter>", newlines=True)
SEED_OSS = TagSyntax("<function={name}>", "</function>", "<parameter={key}>", "</parameter>")
INVOKE = TagSyntax('<invoke name="{name}">', "</invoke>", '<parameter name="{key}">', "</parameter>")
DSML = TagSyntax('<｜DSML｜invoke name="{name}">', "</｜DSML｜invoke>",
                 '<｜DSML｜parameter name="{key}" string="{string}">', "</｜DSML｜parameter>")
ARG_KEY = TagSyntax("{name}", "", "<arg_key>{key}</arg_key>\n<arg_value>", "</arg_value>")
MINICPM = TagSyntax('<function name="{name}">', "</function>", '<param name="{key}">', "</param>", cdata=True)
KIMI_K3 = TagSyntax('<|open|>call tool="{name}"{attrs}<|sep|>', "<|close|>call<|sep|>",
                    '<|open|>argument key="{key}"{attrs}<|sep|>', "<|close|>argument<|sep|>")
