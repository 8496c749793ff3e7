"""Object and array arguments written as tags inside the argument's tag (`TagSyntax.nested`,
MiniMax M3's template's ``to_xml``): an object's members by their keys, an array's items as
``item``s,

    NS<point>NS<x>1NS</x>NS<y>2NS</y>NS</point>    NS<tags>NS<item>aNS</item>NS<item>bNS</item>NS</tags>

read by the argument's schema (`nested_shape`) as llama.cpp's MiniMax M3 parser reads them: an
object's members, the required ones in the schema's order, then any optional ones in any order;
an array's items; a union's first alternative that reads; whitespace between the tags. Anything
else is a leaf, its text up to its closing tag: kept as text where the schema allows a string,
else JSON of a type it allows (`typed_value`), or the value is not written so.

The value is written out as JSON as the tags arrive, so that a call's arguments stream as
llama-server streams them (the JSON so far, only growing, as ``json.dumps`` writes it): each
``"key": `` once its member's tag is whole, a string leaf's text as far as it has come (less
what may be its closing tag arriving), another leaf once its closing tag shows it whole. A
union is written once an alternative has read (which one reads is not known before), and so is
a string leaf whose schema allows other types too. An object's ``{`` (an array's ``[``) comes
with its first member's tag (or its closing tag), not with the argument's own tag as llama.cpp
writes it, so that a value that shows it is not written as tags has sent nothing yet: its
reader then takes it as a flat value (the text up to its closing tag). Past what was sent, a
value not written as its schema says leaves the call malformed there (llama.cpp's parse fails
there). `NestedReader.advance` says which; what is written depends only on the text so far,
not on how it was cut.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import TYPE_CHECKING, Any, Optional

from llama.chat.tag_values import typed_value, value_types
from llama.chat.text_scan import held

if TYPE_CHECKING:
    from llama.chat.tagged_calls import TagSyntax

ITEM = "item"   # the key of an array's item tags
_SPACE = " \t\n\r\v\f"


def nested_shape(schema: Any) -> Optional[tuple[str, Any]]:
    """How a value of `schema` is written as nested tags, as llama.cpp's MiniMax M3 parser
    takes it: ("object", the schema) for an object with properties, a tag per member;
    ("array", the items' schema), an `item` tag each; ("choice", the alternatives) for a union
    with such an alternative. None: a leaf, text up to its closing tag, as is any value of a
    schema that allows a string (a union with a string is text)."""
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


def member_order(schema: dict) -> tuple[dict, list[str], list[str]]:
    """An object schema's member schemas by name, the required names in the schema's order,
    then the optional ones (in which order a call's arguments are written)."""
    properties = schema.get("properties") or {}
    required = [k for k in schema.get("required", []) if k in properties]
    return properties, required, [k for k in properties if k not in required]


class NestedReader(ABC):
    """One value read from where it starts, its JSON text appended to a sink (a list of
    pieces) as it becomes certain (see the module docstring)."""

    end = 0   # where the value's closing tag ends, once it has

    @abstractmethod
    def advance(self, text: str, limit: int) -> Optional[bool]:
        """Read on up to `limit` (which only grows): True, the value has ended (at `end`);
        None, it goes on past `limit`; False, it is not written as its schema says."""


def nested_reader(syntax: "TagSyntax", schema: Any, close: str, start: int, sink: list[str]) -> NestedReader:
    """The reader of the value of `schema` at `start`, ended by its closing tag `close`."""
    shape = nested_shape(schema)
    if shape is None:
        return _Leaf(schema, close, start, sink)
    kind, part = shape
    if kind == "choice":
        return _Choice(syntax, part, close, start, sink)
    return _Container(syntax, kind, part, close, start, sink)


class _Leaf(NestedReader):
    """A value's text up to its closing tag: a string's streamed, another once whole."""

    def __init__(self, schema: Any, close: str, start: int, sink: list[str]) -> None:
        self._schema, self._close, self._start, self._sink = schema, close, start, sink
        self._streamed = value_types(schema) == {"string"}
        self._search = self._sent = start   # where the closing tag may begin; what is sent of a string
        if self._streamed:
            sink.append('"')

    def advance(self, text: str, limit: int) -> Optional[bool]:
        end = text.find(self._close, self._search, limit)
        if end < 0:
            self._search = max(self._search, limit - len(self._close) + 1)
            if self._streamed:
                self._send(text, limit - held(text, self._sent, limit, self._close))
            return None
        self.end = end + len(self._close)
        if self._streamed:
            self._send(text, end)
            self._sink.append('"')
            return True
        value = typed_value(text[self._start:end], self._schema)
        if isinstance(value, str) and "string" not in value_types(self._schema):
            return False   # not JSON of its type
        self._sink.append(json.dumps(value, ensure_ascii=False))
        return True

    def _send(self, text: str, upto: int) -> None:
        if upto > self._sent:
            self._sink.append(encode_basestring(text[self._sent:upto])[1:-1])
            self._sent = upto


class _Choice(NestedReader):
    """A union: its alternatives tried in order, each from the value's start once the one
    before it has not read; the first that reads is written, whole."""

    def __init__(self, syntax: "TagSyntax", alternatives: list, close: str, start: int, sink: list[str]) -> None:
        self._syntax, self._close, self._start, self._sink = syntax, close, start, sink
        self._alternatives = alternatives
        self._at = 0
        self._buffer: list[str] = []   # what the alternative being tried has written
        self._reader = self._try()

    def _try(self) -> NestedReader:
        self._buffer = []
        return nested_reader(self._syntax, self._alternatives[self._at], self._close, self._start, self._buffer)

    def advance(self, text: str, limit: int) -> Optional[bool]:
        while True:
            done = self._reader.advance(text, limit)
            if done:
                self._sink.extend(self._buffer)
                self.end = self._reader.end
            if done is not False:
                return done
            self._at += 1
            if self._at == len(self._alternatives):
                return False
            self._reader = self._try()


class _Container(NestedReader):
    """An object's member tags or an array's item tags, each around its value, then the
    closing tag; its ``{`` (or ``[``) written with the first of them."""

    def __init__(self, syntax: "TagSyntax", kind: str, schema: Any, close: str, start: int, sink: list[str]) -> None:
        self._syntax, self._close, self._pos, self._sink = syntax, close, start, sink
        self._object = kind == "object"
        self._members, self._required, _ = member_order(schema) if self._object else ({ITEM: schema}, [], [])
        self._count = 0   # members (items) read
        self._child: Optional[NestedReader] = None

    def _next(self) -> dict[str, Optional[str]]:
        """The tags that may come next, each with its member's key (None: the closing tag): the
        next required member's, else any optional member's (any item's) and the closing tag."""
        if self._count < len(self._required):
            key = self._required[self._count]
            return {self._syntax.tag(key): key}
        tags: dict[str, Optional[str]] = {self._syntax.tag(k): k for k in self._members if k not in self._required}
        return {**tags, self._close: None}

    def advance(self, text: str, limit: int) -> Optional[bool]:
        while True:
            if self._child is not None:
                done = self._child.advance(text, limit)
                if not done:
                    return done
                self._pos, self._child = self._child.end, None
            at = self._pos
            while at < limit and text[at] in _SPACE:
                at += 1
            tags = self._next()
            tag = next((t for t in tags if text.startswith(t, at, limit)), None)
            if tag is None:   # a tag still arriving, or something else
                seen = text[at:min(limit, at + max(map(len, tags)))]
                return None if any(t.startswith(seen) for t in tags) else False
            key = tags[tag]
            opening = "" if self._count else "{" if self._object else "["
            if key is None:
                self._sink.append(opening + ("}" if self._object else "]"))
                self.end = at + len(tag)
                return True
            name = json.dumps(key, ensure_ascii=False) + ": " if self._object else ""
            self._sink.append((opening or ", ") + name)
            self._count += 1
            self._child = nested_reader(self._syntax, self._members[key], self._syntax.tag(key, True),
                                        at + len(tag), self._sink)
