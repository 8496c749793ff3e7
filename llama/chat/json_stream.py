"""JSON read as it streams in, its values written back in canonical form as they become certain.

A tool call's arguments are streamed the way llama-server streams them: after each token the
arguments string may only grow, so what is sent must be a prefix of the final text. The final
text ggmlpy gives is ``json.dumps(json.loads(written), ensure_ascii=False)``; `JsonReader` writes
that same text piece by piece while the model writes its JSON: whitespace dropped, ``", "`` and
``": "`` between items, strings re-escaped character by character (a partial string or key is
sent as far as it has come, as llama.cpp's partial-JSON healing sends it), and a number or
literal only once the character after it shows it is whole (``1`` may still become ``12``).

The reader does not keep the text it writes: its owner (a `Router`) is asked, as each value
starts, where that value's text goes (a list to append to, or None to drop it), so a call
reader keeps the arguments and the name and drops the rest. Nothing here raises on model
text: malformed JSON sets `error` and the reader stops there.
"""
from __future__ import annotations

import json
import re
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from typing import Optional, Protocol

Sink = Optional[list]
Path = tuple

_WS = " \t\n\r"
_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')
_TOKEN = re.compile(r'[^ \t\n\r,:\[\]{}"]*')
_SIMPLE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")


class Router(Protocol):
    """Where values go: `start` is asked as a value starts (its path of keys and indices from
    the root, and its first character) for the list its text is appended to; `end` is told when
    it has ended. Values inside a value that has a list go to that list; nobody is asked, nor
    for values deeper than `depth` (their text is dropped: deep nesting costs no paths)."""

    depth: int

    def start(self, path: Path, first: str) -> Sink: ...

    def end(self, path: Path) -> None: ...


def _hex4(text: str, i: int) -> Optional[int]:
    digits = text[i:i + 4]
    return int(digits, 16) if len(digits) == 4 and all(c in _HEX for c in digits) else None


class _Frame:
    """An open object or array."""
    __slots__ = ("kind", "path", "sink", "routed", "count", "state", "key")

    def __init__(self, kind: str, path: Optional[Path], sink: Sink, routed: bool) -> None:
        self.kind, self.path, self.sink, self.routed = kind, path, sink, routed
        self.count = 0          # items read
        self.state = "first"    # first (item or close), item (after a comma), colon (after a key), value, next
        self.key = ""


class JsonReader:
    """One JSON value read from ``text[start:]`` as it grows (see the module docstring).
    `done`: the value has ended, at `end`; `error`: it is malformed (reading stopped)."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._stack: list[_Frame] = []
        self._pos: Optional[int] = None
        self._scalar: Optional[tuple[Optional[Path], Sink, bool]] = None   # the string or literal being read
        self._token_at: Optional[int] = None   # where the literal being read starts
        self._key: Optional[list[str]] = None  # the object key being read, decoded
        self.done = False
        self.error = False
        self.end: Optional[int] = None

    def advance(self, text: str, start: int, limit: int, final: bool) -> None:
        """Read on up to ``limit``; ``final``: nothing will follow (a literal at the end is whole)."""
        i = start if self._pos is None else self._pos
        while not (self.done or self.error):
            if self._scalar is not None and self._token_at is None:
                i, finished = self._string(text, i, limit, final)
                if not finished:
                    break
                continue
            if self._token_at is not None:
                i = _TOKEN.match(text, i, limit).end()
                if i == limit and not final:
                    break
                self._literal(text[self._token_at:i])
                continue
            while i < limit and text[i] in _WS:
                i += 1
            if i >= limit:
                break
            i = self._structure(text, i)
        self._pos = i
        if self.done and self.end is None:
            self.end = i

    # -- structure --

    def _structure(self, text: str, i: int) -> int:
        c = text[i]
        frame = self._stack[-1] if self._stack else None
        if frame is None:
            return self._begin(c, i)
        state = frame.state
        if frame.kind == "{":
            if state in ("first", "item") and c == '"':
                self._scalar, self._key = (frame.path, frame.sink, False), []
                self._write(frame.sink, '"')
                return i + 1
            if state == "colon" and c == ":":
                self._write(frame.sink, ": ")
                frame.state = "value"
                return i + 1
            if state == "value":
                return self._begin(c, i)
        elif state == "value" or (state == "first" and c != "]"):
            return self._begin(c, i)
        if c == "," and state == "next":
            self._write(frame.sink, ", ")
            frame.state = "item" if frame.kind == "{" else "value"
            return i + 1
        if (c == "}" if frame.kind == "{" else c == "]") and state in ("first", "next"):
            self._stack.pop()
            self._write(frame.sink, c)
            self._ended(frame.path, frame.routed)
            return i + 1
        self.error = True
        return i

    def _begin(self, c: str, i: int) -> int:
        """A value starts with ``c``: ask where it goes (unless it is inside a routed one)."""
        if c in ",:]}":
            self.error = True
            return i
        parent = self._stack[-1] if self._stack else None
        path: Optional[Path] = ()
        if parent is not None:
            asked = parent.sink is None and parent.path is not None and len(parent.path) < self._router.depth
            path = parent.path + (parent.key if parent.kind == "{" else parent.count,) if asked else None
        if path is None:
            sink, routed = (parent.sink if parent is not None else None), False
        else:
            sink, routed = self._router.start(path, c), True
        if c in "{[":
            self._stack.append(_Frame(c, path, sink, routed))
            self._write(sink, c)
        elif c == '"':
            self._scalar = (path, sink, routed)
            self._write(sink, '"')
        else:
            self._scalar, self._token_at = (path, sink, routed), i
        return i + 1 if c in '{["' else i

    def _ended(self, path: Optional[Path], routed: bool) -> None:
        if routed and path is not None:
            self._router.end(path)
        if self._stack:
            frame = self._stack[-1]
            frame.count += 1
            frame.state = "next"
        else:
            self.done = True

    @staticmethod
    def _write(sink: Sink, text: str) -> None:
        if sink is not None and text:
            sink.append(text)

    # -- scalars --

    def _literal(self, token: str) -> None:
        """A number, true, false, null (or NaN/Infinity, which json.loads takes) now whole."""
        assert self._scalar is not None
        path, sink, routed = self._scalar
        self._scalar = self._token_at = None
        try:
            value = json.loads(token)
        except (ValueError, RecursionError):
            self.error = True
            return
        self._write(sink, json.dumps(value, ensure_ascii=False))
        self._ended(path, routed)

    def _string(self, text: str, i: int, limit: int, final: bool) -> tuple[int, bool]:
        """Decode a string body from ``i`` as far as is certain: (index reached, closed). An
        escape (or a surrogate pair) not yet whole waits; decoding is json.loads's, strict."""
        assert self._scalar is not None
        path, sink, routed = self._scalar
        key = self._key
        while i < limit:
            m = _PLAIN.match(text, i, limit)
            if m is not None:
                self._piece(sink, key, m.group())
                i = m.end()
                continue
            c = text[i]
            if c == '"':
                self._write(sink, '"')
                self._scalar = self._key = None
                if key is not None:
                    frame = self._stack[-1]
                    frame.key, frame.state = "".join(key), "colon"
                else:
                    self._ended(path, routed)
                return i + 1, True
            if c != "\\":   # a raw control character
                self.error = True
                return i, False
            if i + 1 >= limit:
                break
            e = text[i + 1]
            if e in _SIMPLE:
                self._piece(sink, key, _SIMPLE[e])
                i += 2
                continue
            if e != "u":
                self.error = True
                return i, False
            if i + 6 > limit:
                break
            code = _hex4(text, i + 2)
            if code is None:
                self.error = True
                return i, False
            step = 6
            if 0xD800 <= code <= 0xDBFF:   # a high surrogate: joined with a low one that follows
                following = text[i + 6:min(i + 12, limit)]
                if len(following) < 6 and not final and "\\u".startswith(following[:2]):
                    break
                if following[:2] == "\\u" and len(following) == 6:
                    low = _hex4(following, 2)
                    if low is None:
                        self.error = True
                        return i, False
                    if 0xDC00 <= low <= 0xDFFF:
                        code, step = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00), 12
            self._piece(sink, key, chr(code))
            i += step
        return i, False

    @staticmethod
    def _piece(sink: Sink, key: Optional[list[str]], decoded: str) -> None:
        if key is not None:
            key.append(decoded)
        if sink is not None:
            sink.append(encode_basestring(decoded)[1:-1])
