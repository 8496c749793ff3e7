"""Call blocks read as they stream in: each call is given out once its name is whole, its
arguments then growing as the model writes them (llama-server streams calls so).

A stream reader is made for one block (`Block.stream` in call_formats.py, with the format,
the tools' schemas and the head the opening matched) and is advanced over the block's text
as it grows; its `calls` are the calls it has committed to, each with its name, the id the
model wrote (if any) and the pieces of its arguments' JSON text so far. A call, once in
`calls`, stays: text that later turns out malformed ends it where it is (`error`), and the
scanner drops the rest of the block. Until a reader has committed to a call, the scanner
holds the block back and reads it whole at its end (call_readers.py), as before.

What a reader gives out depends only on the text it has seen, never on how the text was cut
into pieces, so a stream adds up to the parse of the whole reply. The arguments' pieces add
up to the text the whole-block readers give: JSON as ``json.dumps`` writes it (json_stream.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol

import regex

from llama.chat.call_readers import _args_text
from llama.chat.json_stream import JsonReader, Path, Sink
from llama.chat.text_scan import WS, held, skip_ws

if TYPE_CHECKING:
    from llama.chat.call_formats import ToolFormat


@dataclass
class StreamedCall:
    """A call given out: its name, its arguments' JSON text as pieces (growing), the id the
    model wrote (None: the stream makes one)."""
    name: str
    args: list[str] = field(default_factory=list)
    id: Optional[str] = None


class CallStream(Protocol):
    calls: list[StreamedCall]

    def advance(self, text: str, start: int, limit: int, final: bool) -> None:
        """Read the block's text ``text[start:limit]`` (``start`` is the same on every call,
        ``limit`` only grows); ``final``: the block has ended there."""


StreamFactory = Callable[["ToolFormat", Mapping[str, Any], dict], CallStream]


def json_value(text: str) -> tuple[bool, Any]:
    """(parsed, value) of JSON text the reader wrote (always JSON, but maybe too deep to parse)."""
    try:
        return True, json.loads(text)
    except (ValueError, RecursionError):
        return False, None


# ----------------------------------------------------------------------------------------------------------
# JSON call objects: {"name": .., "arguments": {..}}, alone, in an array, or in generic's wrapper.


class _Candidate:
    """A JSON object that may be a call, read key by key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name: Optional[str] = None
        self.id: Optional[str] = None
        self.bad = False            # not a call (a bad name, type or arguments)
        self.args: list[str] = []   # the arguments' text, given out as the call's
        self.args_key: Optional[str] = None
        self.args_kind = ""         # "{" (an object, streamed), '"' (JSON text in a string), else not a call
        self.args_whole = False
        self.keys = 0
        self.held: dict[str, list] = {}   # name, id, type and string arguments, until whole
        self.call: Optional[StreamedCall] = None


class JsonCalls:
    """Call objects in a block's JSON (`call_from`'s shapes): one object, an array of them, or,
    with ``wrapper``, generic's ``{"tool_calls": [..]}`` / ``{"tool_call": {..}}``.

    A call is given out once its name is whole (and, where the format has ids, its id, or the
    object has ended: the id is sent with the name); llama3's bare objects, which are calls only
    with their arguments, once those have started. Until one is given out, an element that is
    not a call spoils the block (it is then read whole, and is content, as before)."""

    depth = 3   # a call's keys: ("tool_calls", i, key) at most

    def __init__(self, spec: "ToolFormat", wrapper: bool = False) -> None:
        self.calls: list[StreamedCall] = []
        self._spec = spec
        self._wrapper = wrapper
        self._reader = JsonReader(self)
        self._cand: Optional[_Candidate] = None
        self._spoiled = False

    @property
    def error(self) -> bool:
        return self._reader.error

    @property
    def done(self) -> bool:
        return self._reader.done

    def advance(self, text: str, start: int, limit: int, final: bool) -> None:
        self._reader.advance(text, start, limit, final)

    def _is_call(self, path: Path) -> bool:
        if self._wrapper:
            return path == ("tool_call",) or (len(path) == 2 and path[0] == "tool_calls" and isinstance(path[1], int))
        return path == () or (len(path) == 1 and isinstance(path[0], int))

    # -- Router --

    def start(self, path: Path, first: str) -> Sink:
        cand = self._cand
        if cand is not None and path[:-1] == cand.path:
            return self._member(cand, path[-1], first)
        if self._is_call(path) and (path != () or first == "{"):
            if first == "{":
                self._cand = _Candidate(path)
            else:
                self._spoil()
        return None

    def end(self, path: Path) -> None:
        cand = self._cand
        if cand is None:
            return
        if path == cand.path:
            self._cand = None
            self._close(cand)
        elif path[:-1] == cand.path:
            self._member_end(cand, path[-1])

    # -- one call object --

    def _member(self, cand: _Candidate, key: str, first: str) -> Sink:
        spec = self._spec
        cand.keys += 1
        if spec.name_as_key:
            if cand.keys > 1:
                cand.bad = True
                return None
            cand.name = key or None
            cand.bad = not key
            return self._args_start(cand, key, first)
        if key == spec.name_key or key == "type" or (spec.id_key and key == spec.id_key):
            cand.held[key] = []
            return cand.held[key]
        if key in spec.arg_keys and cand.args_key is None:
            return self._args_start(cand, key, first)
        return None

    def _args_start(self, cand: _Candidate, key: str, first: str) -> Sink:
        cand.args_key, cand.args_kind = key, first if first in '{"' else "x"
        if first == '"':
            cand.held["args"] = []
            return cand.held["args"]
        self._commit(cand)
        return cand.args if first == "{" else None

    def _member_end(self, cand: _Candidate, key: str) -> None:
        spec = self._spec
        if key == cand.args_key and not cand.args_whole:   # (a second value under the key is ignored)
            if cand.args_kind == '"':
                ok, value = json_value("".join(cand.held.pop("args")))
                text = _args_text(value) if ok else None
                if text is None:
                    cand.bad = True
                else:
                    cand.args.append(text)
            cand.args_whole = True
        elif key in cand.held:
            value = json_value("".join(cand.held.pop(key)))[1]
            if key == spec.name_key and cand.call is None:
                cand.name = value if isinstance(value, str) and value else None
                cand.bad = cand.bad or cand.name is None
            elif key == "type" and value != "function" and cand.call is None:
                cand.bad = True
            elif key == spec.id_key and value is not None:
                cand.id = str(value)
        self._commit(cand)

    def _commit(self, cand: _Candidate, closed: bool = False) -> None:
        """Give the call out if it is one and enough of it is known."""
        if cand.call is not None or cand.bad or self._spoiled or cand.name is None:
            return
        spec = self._spec
        if cand.args_kind == "x" or (cand.args_kind == '"' and not cand.args_whole):
            return
        if not closed:
            if spec.id_key and cand.id is None:
                return
            if spec.args_required and cand.args_kind != "{" and not cand.args_whole:
                return
        cand.call = StreamedCall(cand.name, cand.args, cand.id)
        self.calls.append(cand.call)

    def _close(self, cand: _Candidate) -> None:
        if cand.args_key is None:   # no arguments: {} (except where they tell a call from an object)
            if cand.call is None and self._spec.args_required:
                cand.bad = True
            else:
                cand.args.append("{}")
                cand.args_kind, cand.args_whole = "{", True
        self._commit(cand, closed=True)
        if cand.call is None:
            self._spoil()

    def _spoil(self) -> None:
        if not self.calls:
            self._spoiled = True


def json_calls(spec: "ToolFormat", schemas: Mapping[str, Any], head: dict) -> CallStream:
    return JsonCalls(spec)


def generic_calls(spec: "ToolFormat", schemas: Mapping[str, Any], head: dict) -> CallStream:
    return JsonCalls(spec, wrapper=True)


# ----------------------------------------------------------------------------------------------------------
# A name in the opening, then the arguments' JSON (Mistral v11, Functionary v3.1, Kimi's bare call).


class _Into:
    """A router that sends the root value to one list."""

    depth = 0

    def __init__(self, sink: list) -> None:
        self.sink = sink

    def start(self, path: Path, first: str) -> Sink:
        return self.sink if path == () else None

    def end(self, path: Path) -> None:
        pass


class NamedArgs:
    """The arguments' JSON object after an opening that named the function: the call is given
    out as its ``{`` arrives (arguments written as a JSON string are read whole at the end)."""

    def __init__(self, name: Optional[str], call_id: Optional[str]) -> None:
        self.calls: list[StreamedCall] = []
        self._name, self._id = name, call_id
        self._reader: Optional[JsonReader] = None
        self.error = False

    @property
    def done(self) -> bool:
        return self._reader is not None and self._reader.done

    def advance(self, text: str, start: int, limit: int, final: bool) -> None:
        if self._reader is None:
            i = skip_ws(text, start, limit)
            if i == limit or self.error:
                return
            if text[i] != "{" or not self._name:
                self.error = True
                return
            call = StreamedCall(self._name, [], self._id or None)
            self.calls.append(call)
            self._reader = JsonReader(_Into(call.args))
            start = i
        self._reader.advance(text, start, limit, final)
        self.error = self._reader.error


def named_args(spec: "ToolFormat", schemas: Mapping[str, Any], head: dict) -> CallStream:
    return NamedArgs(head.get("name"), head.get("id"))


# ----------------------------------------------------------------------------------------------------------
# Calls one after another, each an opening that names it and its arguments up to an end marker
# (Kimi K2's section, DeepSeek R1 and V3.1).


@dataclass(frozen=True)
class CallHead:
    """One way a call opens (a regex with the group ``name``, and ``id`` where the model writes
    one) and the marker that ends its arguments."""
    pattern: regex.Pattern
    args_end: str


class CallListStream:
    """Calls separated by whitespace, each `CallHead`'s opening, its arguments' JSON, its end
    marker. The heads are tried in order; one that could still match holds the text."""

    def __init__(self, heads: tuple[CallHead, ...]) -> None:
        self.calls: list[StreamedCall] = []
        self._heads = heads
        self._pos: Optional[int] = None
        self._head: Optional[CallHead] = None   # the call whose arguments are being read
        self._name_id: tuple[str, Optional[str]] = ("", None)
        self._args_at = 0
        self._search = 0   # where the end marker may begin
        self._reader: Optional[JsonReader] = None
        self.error = False

    def advance(self, text: str, start: int, limit: int, final: bool) -> None:
        i = start if self._pos is None else self._pos
        while not self.error:
            if self._head is None:
                i = skip_ws(text, i, limit)
                if i == limit or not self._open(text, i, limit, final):
                    break
                i = self._search = self._args_at
                continue
            marker = self._head.args_end
            end = text.find(marker, self._search, limit)
            stop = end if end >= 0 else limit - held(text, i, limit, marker)
            if end < 0:
                self._search = max(i, limit - len(marker) + 1)
            if not self._args(text, stop, end >= 0 or final) or end < 0:
                break
            i = end + len(marker)
            self._head, self._reader = None, None
        self._pos = i

    def _open(self, text: str, i: int, limit: int, final: bool) -> bool:
        for head in self._heads:
            m = head.pattern.match(text, i, limit, partial=not final)
            if m is None:
                continue
            if m.partial:
                return False
            self._head, self._args_at = head, m.end()
            self._name_id = (m.group("name"), m.groupdict().get("id"))
            return True
        self.error = True
        return False

    def _args(self, text: str, stop: int, whole: bool) -> bool:
        """Read the arguments up to ``stop``; ``whole``: they end there. False: wait, or failed."""
        if self._reader is None:
            i = skip_ws(text, self._args_at, stop)
            if i == stop:
                return self._fail() if whole else False
            name, call_id = self._name_id
            if text[i] == "{":
                call = StreamedCall(name, [], call_id or None)
                self.calls.append(call)
                self._reader = JsonReader(_Into(call.args))
                self._args_at = i
            elif not whole:
                return False
            else:   # arguments written as a JSON string of an object: read whole
                args = _args_text(text[i:stop].strip())
                if args is None:
                    return self._fail()
                self.calls.append(StreamedCall(name, [args], call_id or None))
                return True
        self._reader.advance(text, self._args_at, stop, whole)
        if self._reader.error or (whole and not self._reader.done):
            return self._fail()
        if whole and text[self._reader.end:stop].strip(WS):
            return self._fail()
        return True

    def _fail(self) -> bool:
        self.error = True
        return False


def call_list(*heads: tuple[str, str]) -> StreamFactory:
    """The stream reader of a block of `CallListStream` calls, each head (regex, end marker)."""
    compiled = tuple(CallHead(regex.compile(r"\s*" + pattern), end) for pattern, end in heads)

    def make(spec: "ToolFormat", schemas: Mapping[str, Any], head: dict) -> CallStream:
        return CallListStream(compiled)
    return make
