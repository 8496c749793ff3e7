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

nested_tags.py reads such a value by its schema, as llama.cpp's MiniMax M3 parser does (and
streams it as it grows), and the grammar writes it so.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping, Optional

import regex

from llama.chat.nested_tags import ITEM, member_order, nested_reader, nested_shape
from llama.chat.tag_values import typed_value, value_types

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
    inside the argument's, an array's items as `item` (MiniMax M3's, see nested_tags.py)."""
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
                    out: list[str] = []
                    nested = nested_reader(self, schema, self.tag(p.group("key"), True), p.start("value"), out)
                    done = nested.advance(body, len(body))
                    if done is None or (done is False and out):   # the call ends inside it, or it is malformed
                        return None
                    if done:   # else nothing of it was nested tags: the text up to its closing tag, as a flat value
                        args[key], at = json.loads("".join(out)), nested.end
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

    def grammar(self, functions: list[dict], before: str, after: str, repeat: Optional[str] = None,
                between: str = "") -> str:
        """A llguidance Lark grammar for one call to one of `functions` (OpenAI function
        objects) between the block markers `before` and `after`: the required
        parameters in the schema's order, then any optional ones, each value a JSON value of
        its schema or, for a string, text (one of an `enum`'s); with `nested`, an object or
        array value as nested tags, as nested_tags.py reads it. `repeat` (parallel calls):
        "call", more calls inside the block; "block", more blocks; each after `between`
        (Muse Glimmer's next message opening), else an optional newline."""
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
        sep = _lark(between) if between else '"\\n"?'
        calls = f"call ({sep} call)*" if repeat == "call" else "call"
        block = " ".join(p for p in (_lark(before) + gap if before else "", calls, _lark(after) if after else "") if p)
        top = [f"start: block ({sep} block)*", f"block: {block}"] if repeat == "block" else [f"start: {block}"]
        return "\n".join(top + ["call: " + " | ".join(choices)] + rules) + "\n"

    def _value_rule(self, rule: str, schema: Any, closing: str, close: str, gap: str, rules: list[str]) -> str:
        """The grammar of a value and its closing tag (`closing` as text, `close` as grammar),
        its further rules (named from `rule`) added to `rules`: text up to the closing tag for
        a string (a lazy lexeme), one of an `enum`'s strings, a JSON value of its schema, or
        with `nested` an object's member tags or an array's items (nested_tags.py's order)."""
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


def _lark(text: str) -> str:
    """A literal of the grammar; `{attrs}` in a tag becomes any further attributes."""
    parts = text.split("{attrs}")
    return ' /[^<>]*/ '.join(json.dumps(p, ensure_ascii=False) for p in parts)


def parameter_order(function: dict) -> tuple[dict, list[str], list[str]]:
    """A function's parameter schemas by name, the required names in the schema's order, then
    the optional ones: the order a forced call's grammar writes them in."""
    return member_order(function.get("parameters") or {})


def _member_rules(required: list[str], optional: list[str]) -> str:
    """The grammar of an object's member rules: the required ones in order, then any optional ones."""
    return " ".join(required + (["(" + " | ".join(optional) + ")*"] if optional else []))


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
