"""gpt-oss's harmony replies: a reply is a run of messages, each a header and a body,

    <|channel|>analysis<|message|>reasoning<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": ".."}<|call|>
    <|start|>assistant<|channel|>final<|message|>the answer

read as llama.cpp's gpt-oss parser reads them: the `analysis` channel is reasoning, `final`
and `commentary` are the answer, a message to `functions.NAME` is a call of NAME with the
body as its JSON arguments, and a message to any other recipient (gpt-oss's built-in
`python` or `container.exec`) is left out. With reasoning not split off (reasoning format
"none"), an analysis message stays in the content as written.

`HarmonyStream` is a `MessageStream` (message_stream.py): it reads the text it has so far
and emits what grew. A call streams as the other families' do: once its header has named it
and its body has begun with ``{``, with the arguments that are certain (json_stream.py), which
then only grow.
"""
from __future__ import annotations

import json

import regex

from llama.chat.json_stream import JsonReader
from llama.chat.message_stream import MessageParse, MessageStream, held, trimmed
from llama.chat.text_scan import skip_ws

_START = "<|start|>"
_MESSAGE = "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_MARKERS = (_START, "<|channel|>", _MESSAGE, *_ENDS)
_CHANNEL = regex.compile(r"<\|channel\|>\s*([\w-]+)")
_RECIPIENT = regex.compile(r"\bto=([^\s<]+)")
_ANSWER = ("", "assistant", "user", "all")   # recipients of the reply itself, not of a tool
_ROLE = regex.compile(r"<\|start\|>\w*")
_HEADS = ("<|channel|>", "to=")
_SPACE = regex.compile(r"\s*")


class _Arguments:
    """A call's body read as it streams: its JSON object written back as it becomes certain."""
    depth = 0

    def __init__(self) -> None:
        self.sink: list[str] = []
        self.reader = JsonReader(self)

    def start(self, path: tuple, first: str) -> list | None:
        return self.sink if path == () else None

    def end(self, path: tuple) -> None:
        pass


def _call_arguments(text: str, start: int, stop: int, closed: bool, readers: dict) -> str | None:
    """A call's arguments (None: not a call, or not yet one): a body that begins with ``{`` is
    streamed (then it stays a call, with what its JSON gave); any other is read at its end."""
    i = skip_ws(text, start, stop)
    if i == stop or text[i] != "{":
        return _json_object(text[start:stop]) if closed else None
    args = readers.get(start)
    if args is None:
        args = readers[start] = _Arguments()
    args.reader.advance(text, i, stop, closed)
    return "".join(args.sink)


def _scan(text: str, pos: int, final: bool, split_reasoning: bool,
          readers: dict | None = None) -> tuple[MessageParse, MessageParse, int]:
    """Read the messages from `pos` (a message boundary): (what the messages that have ended
    add, what the one still open adds so far, where that one begins). When not `final`, the
    open one gives only what more text cannot change. `readers`: the calls' argument readers
    by where their bodies start (kept between scans of a stream)."""
    readers = {} if readers is None else readers
    done, tail = MessageParse(), MessageParse()
    while pos < len(text):
        role = _ROLE.match(text, pos) if text.startswith(_START, pos) else None
        head_at = role.end() if role else pos
        lead = _SPACE.match(text, head_at).end()
        if not final and len(text) - lead < max(map(len, _HEADS)) and any(h.startswith(text[lead:]) for h in _HEADS):
            break   # a header may be arriving
        if not text.startswith(_HEADS, lead):   # text outside any message: the answer
            nxt = min([i for i in (text.find(m, head_at + 1) for m in (_START, "<|channel|>")) if i > 0],
                      default=len(text))
            chunk = text[head_at:nxt]
            if final or nxt < len(text):
                done.content += chunk
                pos = nxt
                continue
            tail.content += chunk[:len(chunk) - held(chunk, _MARKERS)]
            break
        body_at = text.find(_MESSAGE, head_at)
        if body_at < 0:
            break   # the header is still arriving (or, at the end, a header with no message)
        header = text[head_at:body_at]
        channels = _CHANNEL.findall(header)
        recipient = (_RECIPIENT.findall(header) or [""])[-1]
        start = body_at + len(_MESSAGE)
        ends = [(i, m) for i, m in ((text.find(m, start), m) for m in _ENDS) if i >= 0]
        end, marker = min(ends) if ends else (len(text), "")
        closed = bool(ends) or final
        body = text[start:end]
        if not closed:
            body = body[:len(body) - held(body, _MARKERS)]
        out = done if closed else tail
        channel = channels[-1] if channels else "final"
        if recipient.startswith("functions."):
            value = _call_arguments(text, start, start + len(body), closed, readers)
            if value is not None:
                out.calls.append((recipient[len("functions."):], value))
        elif recipient in _ANSWER and channel == "analysis":
            if split_reasoning:
                out.reasoning += body
            else:
                out.content += text[head_at:start] + body + marker
        elif recipient in _ANSWER:
            out.content += body
        # anything else is a message to a built-in tool (python, container.exec): not the answer
        if not closed:
            break
        pos = end + len(marker)
    return done, tail, pos


def _json_object(text: str) -> str | None:
    """A call's arguments: JSON text of an object, re-written; None for anything else."""
    try:
        value = json.loads(text.strip())
    except ValueError:
        return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None


def parse_harmony(text: str, final: bool, split_reasoning: bool = True) -> MessageParse:
    """The reasoning, content and calls of `text`; when not `final`, only what more text
    cannot change."""
    done, tail, _ = _scan(text, 0, final, split_reasoning)
    done.add(tail)
    return trimmed(done)


class HarmonyStream(MessageStream):
    """Text deltas in, OpenAI `delta` fragments out (`ReplyStream`'s interface)."""

    def __init__(self, split_reasoning: bool = True, prefill: str = "", seed: str | int = 0) -> None:
        super().__init__(prefill, seed)
        self._split = split_reasoning
        self._readers: dict = {}   # the calls' argument readers

    def _scan(self, text: str, pos: int, final: bool) -> tuple[MessageParse, MessageParse, int]:
        return _scan(text, pos, final, self._split, self._readers)
