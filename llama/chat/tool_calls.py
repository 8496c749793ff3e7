"""OpenAI tool calls for chat models: detect the template's call syntax, and parse and stream the
calls out of the generated text (the grammars that force a call are call_grammar.py's).

The families are data (call_formats.py: one entry each, with its blocks, readers and grammar shape);
this module is the one scanner that reads them.

Parsing and streaming are one scanner: :func:`parse_tool_calls` is a :class:`ToolCallStream` fed the whole
text at once, so a streamed reply always adds up to the parsed one. Calls stream as llama-server streams them:
a block's stream reader (call_streams.py) gives a call out once its name is whole, and its arguments as they
grow; the call's first delta carries its index, id, name and the arguments so far, the later ones what the
arguments grew by. A block whose reader has given out no call (or that has no stream reader) is held back and
read whole at its end, so text that turns out malformed, or is cut off before a call's name, comes out as
plain content.
"""
from __future__ import annotations

import hashlib
from typing import Optional

from llama.chat.call_formats import FORMATS, Block, detect_tool_format, tool_format
from llama.chat.call_grammar import generic_tools_instruction, parameter_schemas, tool_call_grammar
from llama.chat.call_streams import CallStream
from llama.chat.text_scan import held, skip_ws

__all__ = ["FORMATS", "ToolCallStream", "assemble_deltas", "detect_tool_format", "generic_tools_instruction",
           "parse_tool_calls", "reasoning_stops", "tool_call_grammar", "tool_call_id"]

Call = tuple
"""A parsed call: the function name, its arguments as JSON text, and the id the model wrote, if any."""

_WS = " \t\r\n"


def reasoning_stops(fmt: Optional[str]) -> tuple[str, ...]:
    """The markers of `fmt` that end a thinking block (its calls' literal openings), as the
    templates that let a call follow unclosed reasoning have them."""
    if fmt is None or not tool_format(fmt).ends_reasoning:
        return ()
    return tuple(b.literal for b in tool_format(fmt).blocks if b.literal)


_ALNUM = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def tool_call_id(seed: str | int, index: int, fmt: str = "hermes") -> str:
    """The id of call number ``index`` of a reply: a hash of (seed, index), so a parse and a stream of the
    same reply agree, and the lead can seed it with the completion id. Mistral gets 9 alphanumerics."""
    spec = tool_format(fmt)
    n = int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest(), "big")
    chars = []
    for _ in range(spec.id_len):
        n, r = divmod(n, len(_ALNUM))
        chars.append(_ALNUM[r])
    return spec.id_prefix + "".join(chars)


# ----------------------------------------------------------------------------------------------------------
# The scanner.


_ScanState = tuple[int, int, int, bool, bool]  # (value start, next index, depth, in a string, after a backslash)


def _json_end(text: str, i: int, state: Optional[_ScanState] = None) -> tuple[Optional[int], _ScanState]:
    """Index just past the JSON object/array opening at ``text[i]``, None if it has not closed yet; and
    the scan state to resume from when more text arrives (so a long call streams in linear time).
    Only brackets outside strings count, so the end is found without parsing (a malformed value still
    ends somewhere, and is then left as content)."""
    start, j0, depth, in_str, esc = state if state is not None and state[0] == i else (i, i, 0, False, False)
    for j in range(j0, len(text)):
        c = text[j]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1, (start, j + 1, depth, in_str, esc)
    return None, (start, len(text), depth, in_str, esc)


_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _hex4(text: str, i: int) -> Optional[int]:
    digits = text[i:i + 4]
    if len(digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in digits):
        return int(digits, 16)
    return None


def _decode_string(text: str, i: int, final: bool) -> tuple[str, int, bool]:
    """Decode the JSON string body from ``text[i]`` as far as is safe: (decoded, index reached, closed).

    Stops before an escape (or a surrogate pair) that is not complete yet, so decoding piece by piece gives
    the same text as decoding the whole. Unknown escapes are kept verbatim; a dangling escape at the end of
    the reply is dropped."""
    out: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return "".join(out), i + 1, True
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= n:
            break
        e = text[i + 1]
        if e != "u":
            out.append(_ESCAPES.get(e, "\\" + e))
            i += 2
            continue
        if i + 6 > n:
            break
        code = _hex4(text, i + 2)
        if code is None:
            out.append("\\u")
            i += 2
            continue
        if 0xD800 <= code < 0xE000:  # a surrogate: pair it, or it stands for U+FFFD
            following = text[i + 6:i + 12]
            if code < 0xDC00 and len(following) < 6 and not final and "\\u".startswith(following[:2]):
                break  # its partner may still be coming
            low = _hex4(following, 2) if code < 0xDC00 and following[:2] == "\\u" else None
            if low is not None and 0xDC00 <= low < 0xE000:
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                i += 12
                continue
            code = 0xFFFD
        out.append(chr(code))
        i += 6
    return "".join(out), (n if final else i), False


class ToolCallStream:
    """Turns a reply streamed as text deltas into OpenAI ``chat.completion.chunk`` ``delta`` fragments.

    ``feed`` returns the fragments the new text settles: ``{"content": ..}`` for plain text, and per call a
    first ``{"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}]}`` with the arguments
    so far, then ``{"tool_calls": [{"index", "function": {"arguments": ..}}]}`` as they grow. Text that could
    still be the start of a call marker, or is inside a block not yet known to hold a call, is held back;
    ``finish`` releases what is left (such a block as content). Content is trimmed at both ends of the reply,
    as the parse is. With ``parallel`` False only the first call is read: the reply is over (`done`, and the
    rest is left out) where a second call begins, which llama.cpp's grammar would not have let the model write.
    """

    def __init__(self, fmt: str, seed: str | int = 0, tools: Optional[list[dict]] = None,
                 parallel: bool = True) -> None:
        self._fmt = tool_format(fmt)
        self._schemas = parameter_schemas(tools or [])
        self._seed = seed
        self._parallel = parallel
        self._text = ""
        self._pos = 0  # text before this is settled
        self._string_at: Optional[int] = None  # inside a generic "response" string, decoding from here
        self._over = False  # the rest of the reply is ignored (the generic response has ended, or a second call began)
        self.done = False   # a call past the one allowed has begun
        self._calls = 0
        self._started = False  # some content has been emitted
        self._ws = ""  # whitespace held until more content follows it
        self._finished = False
        self._json_scan: Optional[_ScanState] = None  # progress through an open JSON block
        # the open block: where it starts, its stream reader, how many pieces of each call's arguments are out
        self._block_at: Optional[int] = None
        self._reader: Optional[CallStream] = None
        self._sent: list[int] = []
        self._base = 0          # the index of the block's first call
        self._close_from = 0    # where the block's closing marker may begin
        self._stalled = False   # the block's reader failed (a bug, not the model's text): it reads no further
        self._open: Optional[tuple[int, int, Block, dict]] = None   # the open block, as _next_open found it

    def feed(self, delta: str) -> list[dict]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._text += delta
        return self._scan(final=False)

    def finish(self) -> list[dict]:
        if self._finished:
            return []
        self._finished = True
        return self._scan(final=True)

    # -- internals --

    def _content(self, out: list[dict], s: str) -> None:
        if not self._started:
            s = s.lstrip()
        body = s.rstrip()
        if not body:
            self._ws += s
            return
        out.append({"content": self._ws + body})
        self._ws = s[len(body):]
        self._started = True

    def _first(self, out: list[dict], index: int, name: str, call_id: Optional[str], arguments: str) -> bool:
        """A call's first delta (False: a call past the one allowed, left out)."""
        if not self._parallel and index > 0:
            self.done = True
            return False
        call_id = call_id or tool_call_id(self._seed, index, self._fmt.name)
        out.append({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                    "function": {"name": name, "arguments": arguments}}]})
        self._calls = index + 1
        return True

    def _call(self, out: list[dict], call: Call) -> None:
        """A call read whole: one delta."""
        self._first(out, self._calls, call[0], call[2] if len(call) > 2 else None, call[1])

    def _give(self, out: list[dict], reader: CallStream) -> None:
        """What the block's reader has given out since last time."""
        for j, call in enumerate(reader.calls):
            index = self._base + j
            if j == len(self._sent):
                if not self._first(out, index, call.name, call.id, "".join(call.args)):
                    return
                self._sent.append(len(call.args))
            elif len(call.args) > self._sent[j]:
                more = "".join(call.args[self._sent[j]:])
                self._sent[j] = len(call.args)
                if more:
                    out.append({"tool_calls": [{"index": index, "function": {"arguments": more}}]})

    def _next_open(self, final: bool) -> Optional[tuple[int, int, Optional[Block], dict]]:
        """The leftmost block opening from ``_pos``: (start, end of the open match, block, head), with
        block None when the text there could still become an opening (hold it). The head holds what
        the opening writes (its named groups: a function's ``name``, a call's ``id``). Ties go to the
        table order, but an earlier-listed block still undecided there holds the text."""
        best: Optional[tuple[int, int, Optional[Block], dict]] = None
        for block in self._fmt.blocks:
            m = block.pattern.search(self._text, self._pos, partial=not final)
            if m is None or (best is not None and m.start() >= best[0]):
                continue
            best = (m.start(), m.end(), None if m.partial else block, {} if m.partial else m.groupdict())
        return best

    def _read(self, block: Block, payload: str, head: dict) -> Optional[list[Call]]:
        """The block's calls, None if malformed; whatever the model wrote (JSON nested past the recursion
        limit included) must not raise."""
        assert block.read is not None
        try:
            return block.read(payload, self._fmt, self._schemas, head)
        except (ValueError, TypeError, RecursionError, MemoryError, IndexError, KeyError):
            return None

    def _extent(self, block: Block, start: int, open_end: int,
                final: bool) -> tuple[Optional[int], int, int, bool]:
        """(end of the block, None while it is open; its payload's start and end so far; whether the
        payload is one a whole-block reader takes: False for a block cut off or not what its kind says).
        While a block is open, its payload ends before what could be its closing marker."""
        text = self._text
        n = len(text)
        if block.kind == "rest":
            return (n if final else None), open_end, n, True
        if block.kind == "closed":
            lo = start if block.whole or block.keeps_open else open_end
            close = text.find(block.close, max(open_end, self._close_from))
            if close < 0:
                self._close_from = max(open_end, n - len(block.close) + 1)
                return (n, lo, n, False) if final else (None, lo, n - held(text, open_end, n, block.close), False)
            end = close + len(block.close)
            return end, lo, end if block.whole else close, True
        i = skip_ws(text, start if block.json_at_open else open_end, n)
        if i == n or text[i] not in "{[":
            return (None if i == n and not final else i), i, i, False
        end, self._json_scan = _json_end(text, i, self._json_scan)
        if end is None:
            return (n if final else None), i, n, False
        if block.close:   # a closing marker after the JSON (blanks before it), which a model may leave out
            at = skip_ws(text, end, n)
            if not final and n - at < len(block.close) and block.close.startswith(text[at:]):
                self._json_scan = None   # rescanned next time (the JSON has closed: the state would not say so)
                return None, i, end, True
            if text.startswith(block.close, at):
                return at + len(block.close), i, end, True
        return end, i, end, True

    def _stream_reader(self, block: Block, start: int, head: dict) -> Optional[CallStream]:
        """The stream reader of the block opening at ``start`` (made when it is first seen)."""
        if self._block_at != start:
            self._block_at, self._sent, self._base, self._close_from, self._stalled = start, [], self._calls, 0, False
            self._reader = block.stream(self._fmt, self._schemas, head) if block.stream is not None else None
        return self._reader

    def _scan(self, final: bool) -> list[dict]:
        out: list[dict] = []
        text = self._text
        while True:
            if self._over:
                self._pos = len(text)
                break
            if self._string_at is not None:
                decoded, self._string_at, closed = _decode_string(text, self._string_at, final)
                if decoded:
                    self._content(out, decoded)
                self._over = closed or final
                if not self._over:
                    break
                continue
            # an open block stays the one found (its text is not searched again for openings)
            found = self._open if self._open is not None and self._open[0] == self._pos else self._next_open(final)
            if found is None:
                if text[self._pos:]:
                    self._content(out, text[self._pos:])
                self._pos = len(text)
                break
            start, open_end, block, head = found
            if start > self._pos:
                self._content(out, text[self._pos:start])
                self._pos = start
            if block is None:
                break
            if not self._parallel and self._calls and self._block_at != start and block.kind != "string":
                self._over = self.done = True   # a second call: the one allowed has been read
                continue
            if block.kind == "string":
                self._string_at = open_end
                continue
            reader = self._stream_reader(block, start, head)
            end, lo, hi, readable = self._extent(block, start, open_end, final)
            if reader is not None and hi > lo and not self._stalled:
                try:
                    reader.advance(text, lo, hi, end is not None)
                except (ValueError, TypeError, KeyError, IndexError, RecursionError, MemoryError):
                    self._stalled = True   # whatever the model wrote must not raise: the block reads no further
                self._give(out, reader)
            if end is None:
                self._open = (start, open_end, block, head)
                break
            self._open = None
            if reader is None or not reader.calls:
                calls = self._read(block, text[lo:hi], head) if readable else None
                if calls is None:
                    self._content(out, text[start:end])
                for call in calls or []:
                    self._call(out, call)
            self._pos, self._block_at, self._reader = end, None, None
            self._over = self._over or self.done
        return out


def assemble_deltas(deltas: list[dict]) -> tuple[Optional[str], list[dict]]:
    """Fold stream fragments back into (content or None, OpenAI tool calls), as a client does."""
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.get("tool_calls", ()):
            call = calls.setdefault(tc["index"], {"id": None, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
            if "id" in tc:
                call["id"] = tc["id"]
            call["function"]["name"] += tc["function"].get("name", "")
            call["function"]["arguments"] += tc["function"].get("arguments", "")
    return content or None, [calls[i] for i in sorted(calls)]


def parse_tool_calls(text: str, fmt: str, seed: str | int = 0, tools: Optional[list[dict]] = None,
                     parallel: bool = True) -> tuple[Optional[str], list[dict]]:
    """Split a finished reply into its content (None if empty) and OpenAI tool calls
    ``{"id", "type": "function", "function": {"name", "arguments": JSON text}}``. Never raises on model
    text: a block that is malformed or cut off before a call's name stays in the content. ``seed`` makes the
    call ids; ``tools`` type the values of formats that write them as text (XML)."""
    stream = ToolCallStream(fmt, seed, tools, parallel)
    return assemble_deltas(stream.feed(text) + stream.finish())
