"""Muse Glimmer's replies: a run of messages, each ``<|start|>assistant to=RECIPIENT<|message|>``
and a body, ended by ``<|eom|>`` (a message follows) or ``<|eot|>`` (the turn is over). The
prompt ends with ``<|start|>assistant``, so the reply begins at its first recipient:

     to=self<|message|>the reasoning<|eom|>
    <|start|>assistant to=user<|message|>the answer<|eom|>
    <|start|>assistant to=get_weather<|message|><atem:function_calls>
    <atem:invoke name="get_weather">
    <atem:parameter name="city">Paris</atem:parameter>
    </atem:invoke>
    </atem:function_calls>

read as llama.cpp's parser (common/parsers/muse-glimmer.cpp) reads them: first any messages to
``self``, the reasoning (content, without their headers, where reasoning is not split off); then
either calls, or the answer (to ``user``, or to no one) up to its end marker, which calls may
follow when it ended with ``<|eom|>``. Where calls are read, a message to any other recipient is
a call: its body holds ATEM markup (`call_formats.ATEM`, a `TagSyntax` read as it streams by
tagged_stream.py), and the function is the one its ``invoke`` names. With parallel calls more
follow, each after an ``<|eom|>``; without, the reply is over at the end of the first call's
markup. What follows the messages read is left out (`done`: the reply is over), and ATEM markup
in the reasoning or the answer is text. With a JSON answer (a response format) a ```json fence
around it is left out. Where there is nothing to split off or read (no reasoning split, no
calls, no JSON answer), llama.cpp takes the reply as it is, markers and all.

Where llama.cpp's parser fails (and llama-server answers with an error), this reader keeps the
text instead: a message to another recipient that holds no call, or a message without a header,
is content as written.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Optional

import regex

from llama.chat.call_formats import ATEM
from llama.chat.call_grammar import parameter_schemas
from llama.chat.json_fence import JsonFence
from llama.chat.message_stream import MessageParse, MessageStream, held
from llama.chat.tagged_stream import TaggedCalls
from llama.chat.text_scan import held as held_at, skip_ws

if TYPE_CHECKING:
    from llama.chat.reply import ReplyReader

_START = "<|start|>assistant"
_EOM, _EOT = "<|eom|>", "<|eot|>"
_ENDS = (_EOM, _EOT)
_HEADER = regex.compile(r"\s*(?:to=(?P<to>[^<]*))?<\|message\|>")
_CALLS_OPEN, _CALLS_CLOSE = "<atem:function_calls>", "</atem:function_calls>"


class _Message(NamedTuple):
    """A message of the reply: where its header and its body begin, where its body ends (so
    far, less what may be an end marker arriving), the marker that ends it ("": none yet, or
    the reply's end) and its recipient ("": none written)."""
    head: int
    body: int
    end: int
    marker: str
    recipient: str


def _message(text: str, pos: int, final: bool) -> Optional[_Message]:
    """The message at `pos` (a message boundary); None while its opening or its header may
    still be arriving."""
    lead = skip_ws(text, pos, len(text))
    head = lead + len(_START) if text.startswith(_START, lead) else pos
    if not final and head == pos and _START.startswith(text[lead:]):
        return None
    header = _HEADER.match(text, head, partial=not final)
    if header is not None and header.partial:
        return None
    body = header.end() if header else head
    ends = [(i, m) for i, m in ((text.find(m, body), m) for m in _ENDS) if i >= 0]
    end, marker = min(ends) if ends else (len(text) - (0 if final else held(text[body:], _ENDS)), "")
    return _Message(head, body, end, marker, (header.group("to") or "").strip() if header else "")


class _CallMessage:
    """A call message's body as it streams: ``<atem:function_calls>``, the ATEM calls, and
    ``</atem:function_calls>`` (`closed`: it has come)."""

    def __init__(self, schemas: Mapping[str, Any]) -> None:
        self._calls = TaggedCalls(ATEM, schemas)
        self._at: Optional[int] = None   # where the calls begin, once the opening tag has come
        self._ended = False              # the calls have been read to their end
        self.closed = False

    def read(self, text: str, start: int, stop: int, final: bool) -> list[tuple[str, str]]:
        """The calls of the body ``text[start:stop]`` so far (`final`: the body ends there):
        none until one is certain, and none at all in a body that is not ATEM markup."""
        if self._at is None:
            i = skip_ws(text, start, stop)
            if not text.startswith(_CALLS_OPEN, i, stop):
                return []
            self._at = i + len(_CALLS_OPEN)
        if not self._ended:
            close = text.find(_CALLS_CLOSE, self._at, stop)
            self.closed = close >= 0
            limit = close if self.closed else stop - held_at(text, self._at, stop, _CALLS_CLOSE)
            self._ended = self.closed or final
            self._calls.advance(text, self._at, limit, self._ended)
        return [(call.name, "".join(call.args)) for call in self._calls.calls]


class MuseStream(MessageStream):
    """Text deltas in, OpenAI `delta` fragments out (`ReplyStream`'s interface), for the reply
    `reader` describes (whether reasoning is split off, whether calls are read and with which
    tools, whether the answer is JSON)."""

    def __init__(self, reader: "ReplyReader") -> None:
        super().__init__(reader.prefill, reader.seed)
        self._split = reader.reasoning is not None
        self._read_calls = reader.tool_format is not None
        self._parallel = reader.parallel
        self._json = reader.json_fence
        self._raw = not (self._split or self._read_calls or self._json)
        self._schemas = parameter_schemas(reader.tools or [])
        self._only_calls = False   # an answer or a call ended with <|eom|>: only calls may follow
        self._messages: dict[int, _CallMessage] = {}   # the call messages, by where their bodies start

    def _scan(self, text: str, pos: int, final: bool) -> tuple[MessageParse, MessageParse, int]:
        ended, tail = MessageParse(), MessageParse()
        if self._raw:   # nothing to split off or read: the reply as it is
            ended.content = text[pos:]
            return ended, tail, len(text)
        while pos < len(text) and not self.done:
            message = _message(text, pos, final)
            if message is None:
                break
            closed = bool(message.marker) or final
            kind = {"self": "reasoning", "user": "answer", "": "answer"}.get(message.recipient, "other")
            if kind == "other" and self._read_calls:
                reader = self._messages.setdefault(message.body, _CallMessage(self._schemas))
                calls = reader.read(text, message.body, message.end, closed)
                if calls and not self._parallel:   # one call: the reply is over where its markup ends
                    calls, closed = calls[:1], closed or reader.closed
                if calls:
                    (ended if closed else tail).calls += calls
                    if not closed:
                        break
                    self._next(message.marker == _EOM and self._parallel)
                    pos = message.end + len(message.marker)
                    continue
                if not closed:
                    break   # not known yet whether it holds a call
            if self._only_calls:   # only calls may follow, and this is none: llama.cpp reads no further
                self.done = True
                break
            out = ended if closed else tail
            body = text[message.body:message.end]
            if kind == "reasoning" and self._split:
                out.reasoning += body
            elif kind == "answer" and self._json:
                out.content += JsonFence().feed(body, final=closed)
            elif kind == "other":   # a message to another recipient that holds no call: as written
                out.content += text[message.head:message.end]
            else:   # the answer, or reasoning not split off
                out.content += body
            if not closed:
                break
            if kind == "reasoning":
                self.done = message.marker == _EOT
            else:
                self._next(message.marker == _EOM and self._read_calls)
            pos = message.end + len(message.marker)
        return ended, tail, pos

    def _next(self, more_calls: bool) -> None:
        """An answer or a call has ended: more calls may follow, or the reply is over."""
        self._only_calls = more_calls
        self.done = not more_calls
