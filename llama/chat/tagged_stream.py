"""Tagged calls (tagged_calls.py) read as they stream in, as llama-server streams them: the call
is given out with ``{`` once its opening tag and the first argument's tag (or its closing tag)
have come, then each argument as ``"key": `` and its value. A string parameter's text is sent
as it comes (escaped as JSON, the text that could still be its closing tag held back, and
Qwen3-Coder's layout newlines left out); a value of another type once its closing tag shows
it whole. One written as nested tags (MiniMax M3's objects and arrays) is sent as it grows,
as nested_tags.py writes it; where it turns out malformed after some of it was sent, the call
ends there. What is sent adds up to `TagSyntax.read`'s arguments text.
"""
from __future__ import annotations

import json
from functools import lru_cache
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import TYPE_CHECKING, Any, Mapping, Optional

import regex

from llama.chat.call_streams import CallStream, StreamedCall
from llama.chat.nested_tags import NestedReader, nested_reader, nested_shape
from llama.chat.tag_values import typed_value, value_types
from llama.chat.tagged_calls import CDATA_CLOSE, CDATA_OPEN, TagSyntax, _pattern
from llama.chat.text_scan import held, skip_ws

if TYPE_CHECKING:
    from llama.chat.call_formats import ToolFormat


@lru_cache(maxsize=None)
def _patterns(syntax: TagSyntax) -> tuple[regex.Pattern, regex.Pattern, Optional[regex.Pattern]]:
    """(a call's opening, an argument's opening, a call's closing), each after any whitespace."""
    close = regex.compile(r"\s*" + _pattern(syntax.call_close), regex.S) if syntax.call_close else None
    return (regex.compile(r"\s*" + _pattern(syntax.call_open), regex.S),
            regex.compile(r"\s*" + _pattern(syntax.param_open), regex.S), close)


class TaggedCalls:
    """A block of `syntax` calls, streamed (see the module docstring)."""

    def __init__(self, syntax: TagSyntax, schemas: Mapping[str, Any]) -> None:
        self.calls: list[StreamedCall] = []
        self.error = False
        self._syntax = syntax
        self._schemas = schemas
        self._pos: Optional[int] = None
        self._state = "call"   # call: between calls; body: between arguments; value: in one
        self._call: Optional[StreamedCall] = None
        self._properties: Mapping[str, Any] = {}
        self._count = 0
        # the argument being read
        self._close = ""
        self._start = self._search = self._sent = 0
        self._mode = ""        # string (streamed), json (DSML's string="false"), typed (by the schema), nested
        self._schema: Any = None
        self._lead = False     # whether the layout newline after the opening tag has been looked for
        self._cdata = False    # whether the value may still turn out to be a CDATA section
        self._nested_reader: Optional[NestedReader] = None   # nested: its reader, sending into the call's arguments
        self._sent_at = 0      # nested: how many pieces of the arguments were out before it

    def advance(self, text: str, start: int, limit: int, final: bool) -> None:
        i = start if self._pos is None else self._pos
        call_open, param_open, call_close = _patterns(self._syntax)
        while not self.error:
            if self._state == "value":
                i, closed = self._value(text, limit)
                if not closed:
                    break
                self._state = "body"
                continue
            i = skip_ws(text, i, limit)
            if i == limit:
                break
            if self._state == "call":
                m = call_open.match(text, i, limit, partial=not final)
                if m is None or not (m.partial or m.group("name").strip()):
                    self.error = True
                    break
                if m.partial or (m.end() == limit and not final and self._syntax.call_open.endswith("}")):
                    break   # the opening (or the name it ends with) may go on
                self._begin_call(m.group("name").strip())
                i = m.end()
                continue
            c = call_close.match(text, i, limit, partial=not final) if call_close is not None else None
            if c is not None and not c.partial:   # first: an argument's tag may look like it (MiniMax M3's)
                self._end_call()
                i = c.end()
                continue
            p = param_open.match(text, i, limit, partial=not final)
            if p is not None and not p.partial:
                self._begin_param(p)
                i = self._start = self._search = self._sent = p.end()
                continue
            if p is None and c is None:
                self.error = True
            break
        self._pos = i
        if final and not self.error and self._state == "body" and (
                not self._syntax.call_close or (self.calls and self.calls[-1] is self._call)):
            self._end_call()   # a call left open ends with the block (GLM's have no closing tag)

    def _begin_call(self, name: str) -> None:
        self._call = StreamedCall(name, ["{"])
        self._properties = (self._schemas.get(name) or {}).get("properties") or {}
        self._count = 0
        self._state = "body"

    def _given(self) -> StreamedCall:
        """The call, given out (once its first argument or its end shows it is one)."""
        assert self._call is not None
        if not self.calls or self.calls[-1] is not self._call:
            self.calls.append(self._call)
        return self._call

    def _end_call(self) -> None:
        self._given().args.append("}")
        self._state = "call"

    def _begin_param(self, m: regex.Match) -> None:
        raw_key = m.group("key")
        key = raw_key.strip()
        flag = m.groupdict().get("string")
        self._schema = {"type": "string"} if flag == "true" else self._properties.get(key)
        self._mode = "json" if flag == "false" else "string" if value_types(self._schema) == {"string"} else "typed"
        if self._mode == "typed" and self._syntax.nested and nested_shape(self._schema) is not None:
            self._mode = "nested"
        self._close = self._syntax.param_close.replace("{key}", raw_key)
        self._lead = not self._syntax.newlines
        self._cdata = self._syntax.cdata and self._mode != "json" and "string" in value_types(self._schema)
        head = (", " if self._count else "") + json.dumps(key, ensure_ascii=False) + ": "
        args = self._given().args
        args.append(head + ('"' if self._mode == "string" else ""))
        self._sent_at = len(args)
        self._nested_reader = (nested_reader(self._syntax, self._schema, self._close, m.end(), args)
                               if self._mode == "nested" else None)
        self._count += 1
        self._state = "value"

    def _value(self, text: str, limit: int) -> tuple[int, bool]:
        """Read the value on to ``limit``: (where reading got to, whether the value ended)."""
        if self._mode == "nested":
            return self._nested(text, limit)
        args = self._given().args
        if self._cdata:   # a CDATA section: its inner text is the (string) value
            head = text[self._start:min(limit, self._start + len(CDATA_OPEN))]
            if len(head) < len(CDATA_OPEN) and CDATA_OPEN.startswith(head):
                return self._start, False
            self._cdata = False
            if head == CDATA_OPEN:
                self._start = self._search = self._sent = self._start + len(CDATA_OPEN)
                self._close = CDATA_CLOSE + self._close
                if self._mode != "string":
                    self._mode = "string"
                    args.append('"')
        end = text.find(self._close, self._search, limit)
        stop = end if end >= 0 else limit - held(text, self._start, limit, self._close)
        if end < 0:
            self._search = max(self._start, limit - len(self._close) + 1)
        if self._mode == "string":
            self._stream(text, stop, whole=end >= 0, args=args)
        if end < 0:
            return self._start, False
        if self._mode != "string":
            value = text[self._start:end]
            if self._syntax.newlines:
                value = value[1:] if value.startswith("\n") else value
                value = value[:-1] if value.endswith("\n") else value
            try:
                parsed = json.loads(value) if self._mode == "json" else typed_value(value, self._schema)
                args.append(json.dumps(parsed, ensure_ascii=False))
            except (ValueError, TypeError, RecursionError):
                self.error = True
                return end, False
        return end + len(self._close), True

    def _nested(self, text: str, limit: int) -> tuple[int, bool]:
        """A value that may be written as nested tags: sent as it grows (nested_tags.py), or,
        where it shows it is not written so before any of it was sent, read as a flat value. One
        cut off stays open, as a flat value does."""
        assert self._nested_reader is not None
        done = self._nested_reader.advance(text, limit)
        if done:
            return self._nested_reader.end, True
        if done is None:
            return self._start, False
        if len(self._given().args) > self._sent_at:   # malformed past what was sent: the call ends here
            self.error = True
            return self._start, False
        self._mode, self._search = "typed", self._start   # the text up to its first closing tag, typed
        return self._value(text, limit)

    def _stream(self, text: str, stop: int, whole: bool, args: list) -> None:
        """Send a string value's text up to ``stop``, less a layout newline at either end."""
        if not self._lead:
            if stop == self._start and not whole:
                return
            self._lead = True
            if text.startswith("\n", self._start) and stop > self._start:
                self._sent = self._start + 1
        upto = stop
        if self._syntax.newlines and upto > self._sent and text[upto - 1] == "\n":
            upto -= 1   # held (the layout's) until more text follows it, dropped before the closing tag
        if upto > self._sent:
            args.append(encode_basestring(text[self._sent:upto])[1:-1])
            self._sent = upto
        if whole:
            args.append('"')


def tagged_calls(syntax: TagSyntax):
    """The stream reader of a block of `syntax` calls."""
    def make(spec: "ToolFormat", schemas: Mapping[str, Any], head: dict) -> CallStream:
        return TaggedCalls(syntax, schemas)
    return make
