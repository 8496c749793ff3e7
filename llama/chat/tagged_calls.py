"""Tool calls written as tags, one tag per argument, as several families write them:

    Qwen3-Coder, Qwen3.5              <function=get_weather>
                                      <parameter=city>
                                      Paris
                                      </parameter>
                                      </function>
    Seed-OSS                          <function=get_weather><parameter=city>Paris</parameter></function>
    MiniMax M2                        <invoke name="get_weather"><parameter name="city">Paris</parameter></invoke>
    MiniMax M3 (NS = "]<]minimax[>[") NS<invoke name="get_weather">NS<city>ParisNS</city>NS</invoke>
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

MiniMax M3 writes an object or array value as tags inside the argument's (`TagSyntax.nested`,
its template's `to_xml`): an object's members by their keys, an array's items as `item`s,

    NS<point>NS<x>1NS</x>NS<y>2NS</y>NS</point>    NS<tags>NS<item>aNS</item>NS<item>bNS</item>NS</tags>

`NestedTags` reads such a value by its schema, as llama.cpp's MiniMax M3 parser does, and the
grammar writes it so.
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
    hold its closing tag). `nested`: an object or array value is written as argument tags
    inside the argument's, an array's items as `item` (MiniMax M3's, see `NestedTags`)."""
    call_open: str
    call_close: str
    param_open: str
    param_close: str
    newlines: bool = False
    cdata: bool = False
    nested: bool = False

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

    def tag(self, key: str, closing: bool = False) -> str:
        """The literal tag that opens (or closes) the argument or member `key` (a family
        without further fields in its argument tags: the nested ones)."""
        return (self.param_close if closing else self.param_open).replace("{key}", key)

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
                if self.nested and nested_shape(schema) is not None:
                    start, close = p.start("value"), self.tag(p.group("key"), True)
                    try:
                        nested = read_nested(self, body, start, schema, close, start, len(body))
                    except NeedMore:   # the call ends inside it
                        return None
                    if nested is not None:   # else the text up to its closing tag, as a flat value
                        args[key], at = nested
                        continue
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
        its schema or, for a string, text (one of an `enum`'s); with `nested`, an object or
        array value as nested tags, as `NestedTags` reads it. `repeat` (parallel calls):
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
                as_string = "string" in value_types(schema)
                opening = _lark(self.param_open.format(key=key, string="true" if as_string else "false", attrs="{attrs}")) + \
                    (f' "{nl}"' if nl else "")
                closing = self.param_close.format(key=key) + ("\n" if nl else "")
                close = (f'"{nl}"? ' if nl else "") + _lark(closing)
                rules.append(f"{rule}: {opening} {self._value_rule(rule, schema, closing, close, gap, rules)}{gap}")
            body = _member_rules([names[k] for k in required], [names[k] for k in optional])
            head = _lark(self.call_open.format(name=function["name"], attrs="{attrs}") + ("\n" if nl else "")) + gap
            tail = _lark(self.call_close + ("\n" if nl else "")) + gap if self.call_close else ""
            rules.append(f"f{i}: {head} {body} {tail}".rstrip())
            choices.append(f"f{i}")
        calls = 'call ("\\n"? call)*' if repeat == "call" else "call"
        block = " ".join(p for p in (_lark(before) + gap if before else "", calls, _lark(after) if after else "") if p)
        top = ['start: block ("\\n"? block)*', f"block: {block}"] if repeat == "block" else [f"start: {block}"]
        return "\n".join(top + ["call: " + " | ".join(choices)] + rules) + "\n"

    def _value_rule(self, rule: str, schema: Any, closing: str, close: str, gap: str, rules: list[str]) -> str:
        """The grammar of a value and its closing tag (`closing` as text, `close` as grammar),
        its further rules (named from `rule`) added to `rules`: text up to the closing tag for
        a string (a lazy lexeme), one of an `enum`'s strings, a JSON value of its schema, or
        with `nested` an object's member tags or an array's items (`NestedTags`' order)."""
        shape = nested_shape(schema) if self.nested else None
        if shape is None:
            kinds = value_types(schema)
            if isinstance(schema, dict) and kinds == {"string"} and isinstance(schema.get("enum"), list):
                return "(" + " | ".join(json.dumps(v) for v in schema["enum"]) + f") {close}"
            if "string" in kinds:   # text up to the closing tag (the reader drops a layout "\n")
                rules.append(f"{rule}_t[suffix={_lark(closing)}]: /(?s:.*)/")
                return f"{rule}_t"
            rules.append(f"{rule}_v: %json {json.dumps(schema)}")
            return f"{rule}_v {close}"
        kind, part = shape
        if kind == "choice":
            return "(" + " | ".join(self._value_rule(f"{rule}_a{n}", alt, closing, close, gap, rules)
                                    for n, alt in enumerate(part)) + ")"
        if kind == "array":
            self._element_rule(f"{rule}_i", ITEM, part, gap, rules)
            return f"{rule}_i* {close}"
        properties, required, optional = member_order(part)
        names = {key: f"{rule}_m{n}" for n, key in enumerate(properties)}
        for key, name in names.items():
            self._element_rule(name, key, properties[key], gap, rules)
        return f"{_member_rules([names[k] for k in required], [names[k] for k in optional])} {close}"

    def _element_rule(self, rule: str, key: str, schema: Any, gap: str, rules: list[str]) -> None:
        """Add the rule of a nested member (or `item`) `key`: its tags around its value."""
        closing = self.tag(key, True)
        value = self._value_rule(rule, schema, closing, _lark(closing), gap, rules)
        rules.append(f"{rule}: {_lark(self.tag(key))} {value}{gap}")


ITEM = "item"   # the key of an array's item tags (`TagSyntax.nested`)
_SPACE = " \t\n\r\v\f"


class NeedMore(Exception):
    """The text so far ends before it shows how a nested value is read (`NestedTags`)."""


def read_nested(syntax: TagSyntax, text: str, pos: int, schema: Any, close: str, search: int,
                limit: int) -> Optional[tuple[Any, int]]:
    """The value at `pos` written as nested tags (`NestedTags`) and where it ends, or None: not
    written so. It is read up to each of its closing tags `close` in `text[search:limit]` in
    turn, until one decides it, so that what is read depends only on the text up to there, not
    on how much came after it; none deciding it (the value goes on past `limit`) raises `NeedMore`."""
    end = text.find(close, search, limit)
    while end >= 0:
        try:
            return NestedTags(syntax, text, end + len(close)).read(pos, schema, close)
        except NeedMore:   # an inner closing tag
            end = text.find(close, end + 1, limit)
    raise NeedMore


class NestedTags:
    """Reads a value written as nested tags (`TagSyntax.nested`) by its schema, as llama.cpp's
    MiniMax M3 parser reads it (`nested_shape`): an object's members, the required ones in
    the schema's order, then any optional ones in any order; an array's `item`s; a choice's
    first alternative that reads; whitespace between the tags. Anything else is a leaf, its
    text up to its closing tag: kept as text where the schema allows a string, else JSON of
    a type it allows (`typed_value`) or not this value. `text[:limit]` is the text so far: a
    value it does not decide (one cut off) raises `NeedMore`."""

    def __init__(self, syntax: TagSyntax, text: str, limit: int) -> None:
        self._syntax = syntax
        self._text = text
        self._limit = limit

    def read(self, pos: int, schema: Any, close: str) -> Optional[tuple[Any, int]]:
        """(the value at `pos`, where its closing tag `close` ends), or None: not written so."""
        shape = nested_shape(schema)
        if shape is None:
            end = self._find(pos, close)
            value = typed_value(self._text[pos:end], schema)
            if isinstance(value, str) and "string" not in value_types(schema):
                return None   # not JSON of its type
            return value, end + len(close)
        kind, part = shape
        if kind == "choice":
            for alternative in part:
                read = self.read(pos, alternative, close)
                if read is not None:
                    return read
            return None
        if kind == "array":
            read = self._items(pos, part)
        else:
            read = self._members(pos, part)
        if read is None:
            return None
        value, pos = read
        end = self._literal(self._space(pos), close)
        return None if end is None else (value, end)

    def _items(self, pos: int, schema: Any) -> tuple[list, int]:
        """An array's items from `pos`: (the items, where the last one ends)."""
        items = []
        while True:
            at = self._literal(self._space(pos), self._syntax.tag(ITEM))
            read = None if at is None else self.read(at, schema, self._syntax.tag(ITEM, True))
            if read is None:
                return items, pos
            items.append(read[0])
            pos = read[1]

    def _members(self, pos: int, schema: dict) -> Optional[tuple[dict, int]]:
        """An object's members from `pos`: (the object, where its last member ends), or None
        when a required member is missing or out of the schema's order."""
        properties, required, optional = member_order(schema)
        value: dict[str, Any] = {}
        for key in required:
            read = self._member(self._space(pos), key, properties[key])
            if read is None:
                return None
            value[key], pos = read
        while optional:
            at = self._space(pos)
            for key in optional:
                read = self._member(at, key, properties[key])
                if read is not None:
                    value[key], pos = read
                    break
            else:
                return value, pos
        return value, pos

    def _member(self, pos: int, key: str, schema: Any) -> Optional[tuple[Any, int]]:
        at = self._literal(pos, self._syntax.tag(key))
        return None if at is None else self.read(at, schema, self._syntax.tag(key, True))

    def _space(self, pos: int) -> int:
        while pos < self._limit and self._text[pos] in _SPACE:
            pos += 1
        return pos

    def _literal(self, pos: int, literal: str) -> Optional[int]:
        """Where `literal` at `pos` ends, or None when the text there is something else."""
        seen = self._text[pos:min(self._limit, pos + len(literal))]
        if not literal.startswith(seen):
            return None
        if len(seen) < len(literal):
            raise NeedMore
        return pos + len(literal)

    def _find(self, pos: int, literal: str) -> int:
        """Where the first `literal` from `pos` starts."""
        end = self._text.find(literal, pos, self._limit)
        if end < 0:
            raise NeedMore
        return end


def _lark(text: str) -> str:
    """A literal of the grammar; `{attrs}` in a tag becomes any further attributes."""
    parts = text.split("{attrs}")
    return ' /[^<>]*/ '.join(json.dumps(p, ensure_ascii=False) for p in parts)


def parameter_order(function: dict) -> tuple[dict, list[str], list[str]]:
    """A function's parameter schemas by name, the required names in the schema's order, then
    the optional ones: the order a forced call's grammar writes them in."""
    return member_order(function.get("parameters") or {})


def member_order(schema: dict) -> tuple[dict, list[str], list[str]]:
    """An object schema's member schemas by name, the required names in the schema's order,
    then the optional ones (in which order a call's arguments are written)."""
    properties = schema.get("properties") or {}
    required = [k for k in schema.get("required", []) if k in properties]
    return properties, required, [k for k in properties if k not in required]


def _member_rules(required: list[str], optional: list[str]) -> str:
    """The grammar of an object's member rules: the required ones in order, then any optional ones."""
    return " ".join(required + (["(" + " | ".join(optional) + ")*"] if optional else []))


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


def nested_shape(schema: Any) -> Optional[tuple[str, Any]]:
    """How a value of `schema` is written as nested tags (`TagSyntax.nested`), as llama.cpp's
    MiniMax M3 parser takes it: ("object", the schema) for an object with properties, a tag
    per member; ("array", the items' schema), an `item` tag each; ("choice", the alternatives)
    for a union with such an alternative. None: a leaf, text up to its closing tag, as is
    any value of a schema that allows a string (a union with a string is text)."""
    if not isinstance(schema, dict) or "string" in value_types(schema):
        return None
    choices = schema.get("oneOf", schema.get("anyOf"))
    if not isinstance(choices, list) and isinstance(schema.get("type"), list):
        choices = [{**schema, "type": t} for t in schema["type"]]
    if isinstance(choices, list):
        return ("choice", choices) if any(nested_shape(c) for c in choices) else None
    if schema.get("type") == "object" and isinstance(schema.get("properties"), dict) and schema["properties"]:
        return "object", schema
    items = schema.get("items", schema.get("prefixItems"))
    if schema.get("type") == "array" and not isinstance(items, list):
        return "array", items
    return None


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
MINIMAX_NS = "]<]minimax[>["   # MiniMax M3's namespace token, before each of its tags
MINIMAX_M3 = TagSyntax(MINIMAX_NS + '<invoke name="{name}">', MINIMAX_NS + "</invoke>", MINIMAX_NS + "<{key}>",
                       MINIMAX_NS + "</{key}>", nested=True)
DSML = TagSyntax('<｜DSML｜invoke name="{name}">', "</｜DSML｜invoke>",
                 '<｜DSML｜parameter name="{key}" string="{string}">', "</｜DSML｜parameter>")
ARG_KEY = TagSyntax("{name}", "", "<arg_key>{key}</arg_key>\n<arg_value>", "</arg_value>")
MINICPM = TagSyntax('<function name="{name}">', "</function>", '<param name="{key}">', "</param>", cdata=True)
KIMI_K3 = TagSyntax('<|open|>call tool="{name}"{attrs}<|sep|>', "<|close|>call<|sep|>",
                    '<|open|>argument key="{key}"{attrs}<|sep|>', "<|close|>argument<|sep|>")
