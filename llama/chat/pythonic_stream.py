"""LFM2's Python-style calls, ``[name(key=value, ..), ..]``, read as they stream in: a call is
given out with ``{`` at its ``(``, then each argument as ``"key": `` and, once the ``,`` or
``)`` after it shows it whole, its value as JSON (`call_readers.read_pythonic`'s values: Python
literals, or JSON's true/false/null). A list of JSON call objects, which LFM2 also writes, is
read by `JsonCalls`.
"""
from __future__ import annotations

import ast
import json
from typing import TYPE_CHECKING, Any, Mapping, Optional

import regex

from llama.chat.call_readers import _literal
from llama.chat.call_streams import CallStream, JsonCalls, StreamedCall
from llama.chat.text_scan import skip_ws

if TYPE_CHECKING:
    from llama.chat.call_formats import ToolFormat

_NAME = regex.compile(r"(?P<name>[^\W\d]\w*(?:\.[^\W\d]\w*)*)\s*\(")
_KEYWORD = regex.compile(r"(?P<key>[^\W\d]\w*)\s*=(?!=)")


class _Expression:
    """Finds where a Python expression ends (a ``,`` or ``)`` outside brackets and strings),
    resumably, so a long value is scanned once."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote = ""     # the open string's quote ('' outside strings)
        self.escaped = False

    def end(self, text: str, i: int, limit: int, final: bool) -> tuple[int, bool]:
        """(the index of the ending ``,``/``)``, True), or (where to resume, False)."""
        while i < limit:
            c = text[i]
            if self.quote:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif text.startswith(self.quote, i):
                    i += len(self.quote)
                    self.quote = ""
                    continue
                elif len(self.quote) == 3 and c == self.quote[0] and i + 3 > limit and not final:
                    return i, False   # may be the closing triple quote
                i += 1
                continue
            if c in "'\"":
                if i + 3 > limit and not final and text[i:limit] == c * (limit - i):
                    return i, False   # may open a triple-quoted string
                self.quote = c * 3 if text.startswith(c * 3, i) else c
                i += len(self.quote)
                continue
            if c in "([{":
                self.depth += 1
            elif c in ")]}":
                if self.depth == 0:
                    return i, c == ")"
                self.depth -= 1
            elif c == "," and self.depth == 0:
                return i, True
            i += 1
        return i, False


class PythonicCalls:
    """A block of LFM2 calls, streamed (see the module docstring)."""

    def __init__(self, spec: "ToolFormat") -> None:
        self.calls: list[StreamedCall] = []
        self.error = False
        self._spec = spec
        self._json: Optional[JsonCalls] = None
        self._pos: Optional[int] = None
        self._list_at = 0
        self._state = "list"   # list ("["), first (a call or "{"), args, value, after, next (a call or "]"), over
        self._call: Optional[StreamedCall] = None
        self._count = 0
        self._value_at = 0
        self._scan = _Expression()

    def advance(self, text: str, start: int, limit: int, final: bool) -> None:
        if self._json is not None:
            self._json.advance(text, start, limit, final)
            self.error = self._json.error
            return
        i = start if self._pos is None else self._pos
        while not self.error:
            if self._state == "value":
                i = self._value(text, i, limit, final)
                if self._state == "value":
                    break
                continue
            i = skip_ws(text, i, limit)
            if i == limit:
                break
            c, state = text[i], self._state
            if state == "list":
                self.error = c != "["
                self._list_at, self._state = i, "first"
                i += 1
            elif state == "first" and c == "{":   # JSON call objects
                self._json = JsonCalls(self._spec)
                self.calls = self._json.calls
                self._json.advance(text, self._list_at, limit, final)
                self.error = self._json.error
                return
            elif state in ("first", "next") and not (state == "next" and c == "]"):
                m = _NAME.match(text, i, limit, partial=not final)
                if m is None or m.partial:
                    self.error = m is None
                    break
                self._call = StreamedCall(m.group("name"), ["{"])
                self.calls.append(self._call)
                self._count, self._state = 0, "args"
                i = m.end()
            elif state == "args":
                if c == ")":
                    i = self._end_call(i)
                    continue
                m = _KEYWORD.match(text, i, limit, partial=not final)
                if m is None or m.partial:
                    self.error = m is None
                    break
                assert self._call is not None
                key = json.dumps(m.group("key"), ensure_ascii=False)
                self._call.args.append((", " if self._count else "") + key + ": ")
                self._count += 1
                self._state, self._scan = "value", _Expression()
                i = self._value_at = m.end()
            elif state in ("after", "next") and c == "]":
                self._state = "over"
                i += 1
            elif state == "after" and c == ",":
                self._state = "next"
                i += 1
            else:
                self.error = True
        self._pos = i

    def _end_call(self, i: int) -> int:
        assert self._call is not None
        self._call.args.append("}")
        self._state = "after"
        return i + 1

    def _value(self, text: str, i: int, limit: int, final: bool) -> int:
        """Scan the value on; once it has ended, send it and go on after it."""
        i, ended = self._scan.end(text, i, limit, final)
        if not ended:
            self.error = final and i >= limit or (i < limit and text[i] in "]}")
            return i
        assert self._call is not None
        try:
            value = _literal(ast.parse(text[self._value_at:i].strip(), mode="eval").body)
            self._call.args.append(json.dumps(value, ensure_ascii=False))
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            self.error = True
            return i
        if text[i] == ")":
            return self._end_call(i)
        self._state = "args"
        return i + 1


def pythonic_calls(spec: "ToolFormat", schemas: Mapping[str, Any], head: dict) -> CallStream:
    return PythonicCalls(spec)
