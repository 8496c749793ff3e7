"""Gemma 4's calls, ``call:NAME{key:<|"|>text<|"|>,n:1}``, read as they stream in: the call is
given out with ``{`` once ``call:NAME{`` is whole, then each argument as ``"key": ``; a string
value's text goes out as it comes (JSON-escaped, a partial closing ``<|"|>`` held back), any
other value once the ``,`` or ``}`` after it shows it whole (`call_readers.gemma_value`). The
pieces add up to what `call_readers.read_gemma` gives for the whole block.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping, Optional

import regex

from llama.chat.call_readers import gemma_value
from llama.chat.call_streams import CallStream, StreamedCall
from llama.chat.text_scan import held, skip_ws

if TYPE_CHECKING:
    from llama.chat.call_formats import ToolFormat

QUOTE = '<|"|>'
_HEAD = regex.compile(r"\s*call:(?P<name>[\w.\-]+)\{")
_KEY = regex.compile(r"(?P<key>[A-Za-z_][\w\-]*)\s*:")


class _ValueEnd:
    """Finds where a value that is not a string ends (a ``,`` or ``}`` outside brackets and
    ``<|"|>`` strings), resumably."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False

    def end(self, text: str, i: int, limit: int) -> tuple[int, bool]:
        while i < limit:
            if text.startswith(QUOTE, i):
                self.in_string = not self.in_string
                i += len(QUOTE)
                continue
            if limit - i < len(QUOTE) and QUOTE.startswith(text[i:limit]):
                return i, False   # may be a string's mark
            c = text[i]
            if not self.in_string:
                if c in "[{":
                    self.depth += 1
                elif c in "]}":
                    if self.depth == 0:
                        return i, c == "}"
                    self.depth -= 1
                elif c == "," and self.depth == 0:
                    return i, True
            i += 1
        return i, False


class GemmaCalls:
    """One Gemma 4 call block, streamed (see the module docstring)."""

    def __init__(self) -> None:
        self.calls: list[StreamedCall] = []
        self.error = False
        self._pos: Optional[int] = None
        self._state = "head"   # head, key, value, string, scalar, sep, over
        self._call: Optional[StreamedCall] = None
        self._count = 0
        self._value_at = 0
        self._scan = _ValueEnd()

    def advance(self, text: str, start: int, limit: int, final: bool) -> None:
        i = start if self._pos is None else self._pos
        while not self.error and i <= limit:
            state = self._state
            if state == "string":
                i = self._string(text, i, limit, final)
                if self._state == "string":
                    break
                continue
            if state == "scalar":
                i = self._scalar(text, i, limit, final)
                if self._state == "scalar":
                    break
                continue
            if state == "head":
                m = _HEAD.match(text, i, limit, partial=not final)
                if m is None or m.partial:
                    self.error = m is None
                    break
                self._call = StreamedCall(m.group("name"), ["{"])
                self.calls.append(self._call)
                self._state, i = "key", m.end()
                continue
            i = skip_ws(text, i, limit)
            if i == limit:
                self.error = final and state != "over"
                break
            c = text[i]
            if state in ("key", "sep") and c == "}" and (state == "sep" or self._count == 0):
                self._args().append("}")
                self._state, i = "over", i + 1
            elif state == "sep" and c == ",":
                self._state, i = "key", i + 1
            elif state == "key":
                m = _KEY.match(text, i, limit, partial=not final)
                if m is None or m.partial:
                    self.error = m is None
                    break
                key = json.dumps(m.group("key"), ensure_ascii=False)
                self._args().append((", " if self._count else "") + key + ": ")
                self._count += 1
                self._state, i = "value", m.end()
            elif state == "value":
                if text.startswith(QUOTE, i):
                    self._args().append('"')
                    self._state, i = "string", i + len(QUOTE)
                elif limit - i < len(QUOTE) and QUOTE.startswith(text[i:limit]) and not final:
                    break   # may open a string
                else:
                    self._state, self._scan, self._value_at = "scalar", _ValueEnd(), i
            else:
                self.error = True
        self._pos = i

    def _args(self) -> list[str]:
        assert self._call is not None
        return self._call.args

    def _string(self, text: str, i: int, limit: int, final: bool) -> int:
        """A string value's text up to its closing mark, or as far as it is certain."""
        close = text.find(QUOTE, i, limit)
        stop = close if close >= 0 else limit - (0 if final else held(text, i, limit, QUOTE))
        if stop > i:
            self._args().append(json.dumps(text[i:stop], ensure_ascii=False)[1:-1])
        if close < 0:
            self.error = final
            return stop
        self._args().append('"')
        self._state = "sep"
        return close + len(QUOTE)

    def _scalar(self, text: str, i: int, limit: int, final: bool) -> int:
        """A value other than a string, sent once the ``,`` or ``}`` after it shows it whole."""
        i, ended = self._scan.end(text, i, limit)
        if not ended:
            self.error = final or (i < limit and text[i] == "]")
            return i
        try:
            value: Any = gemma_value(text[self._value_at:i].strip())
        except (ValueError, RecursionError):
            self.error = True
            return i
        self._args().append(json.dumps(value, ensure_ascii=False))
        self._state = "sep"
        return i


def gemma_calls(spec: "ToolFormat", schemas: Mapping[str, Any], head: dict) -> CallStream:
    return GemmaCalls()
