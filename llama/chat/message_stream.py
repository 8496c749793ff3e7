"""Replies written as a run of messages, each a header (who it is for) and a body, as gpt-oss's
harmony (harmony.py) and Muse Glimmer (muse_glimmer.py) write them, streamed.

A family reads its messages with a scan from a message boundary: what the messages that have
ended give, which is read once, and what the one still open gives so far, holding back whatever
more text could change (a marker cut in half, trailing whitespace). `MessageStream` keeps the
first and re-reads only the open message on each delta (a token's step costs that message, not
the whole reply), and emits what grew, so its output only ever grows and a stream adds up to the
parse of the whole reply.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from llama.chat.tool_calls import tool_call_id


@dataclass
class MessageParse:
    """What messages give: reasoning, content, and calls as (name, arguments' JSON text so far)."""
    reasoning: str = ""
    content: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)

    def add(self, other: "MessageParse") -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.calls += other.calls

    def copy(self) -> "MessageParse":
        return MessageParse(self.reasoning, self.content, list(self.calls))


def held(text: str, markers: tuple[str, ...]) -> int:
    """Length of the end of `text` that could be the start of one of `markers`."""
    for n in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


def trimmed(parse: MessageParse) -> MessageParse:
    """Trimmed at the end, as the other readers trim; while streaming, whitespace at the end
    may yet be followed by more text."""
    return MessageParse(parse.reasoning.rstrip(), parse.content.rstrip(), list(parse.calls))


class MessageStream(ABC):
    """Text deltas in, OpenAI `delta` fragments out (`ReplyStream`'s interface). A family gives
    its `_scan`; `done` says the reply is over (more text would be left out)."""

    def __init__(self, prefill: str = "", seed: str | int = 0) -> None:
        self.done = False
        self._text = prefill
        self._seed = seed
        self._sent = MessageParse()
        self._ended = MessageParse()   # what the messages that have ended gave: read once
        self._pos = 0                  # where the first message still open begins

    @abstractmethod
    def _scan(self, text: str, pos: int, final: bool) -> tuple[MessageParse, MessageParse, int]:
        """Read the messages from `pos` (a message boundary): (what the messages that end add,
        what the one still open adds so far, where that one begins). When not `final`, the
        open one gives only what more text cannot change."""

    def feed(self, text: str) -> list[dict]:
        self._text += text
        return self._emit(self._read(final=False))

    def finish(self) -> list[dict]:
        return self._emit(self._read(final=True))

    def _read(self, final: bool) -> MessageParse:
        ended, tail, self._pos = self._scan(self._text, self._pos, final)
        self._ended.add(ended)
        now = self._ended.copy()
        now.add(tail)
        return trimmed(now)

    def _emit(self, now: MessageParse) -> list[dict]:
        out: list[dict] = []
        reasoning, content = now.reasoning.lstrip(), now.content.lstrip()
        if len(reasoning) > len(self._sent.reasoning) and reasoning.startswith(self._sent.reasoning):
            out.append({"reasoning_content": reasoning[len(self._sent.reasoning):]})
            self._sent.reasoning = reasoning
        if len(content) > len(self._sent.content) and content.startswith(self._sent.content):
            out.append({"content": content[len(self._sent.content):]})
            self._sent.content = content
        for i, (name, arguments) in enumerate(now.calls):
            if i == len(self._sent.calls):
                out.append({"tool_calls": [{"index": i, "id": tool_call_id(self._seed, i), "type": "function",
                                            "function": {"name": name, "arguments": arguments}}]})
                self._sent.calls.append((name, arguments))
            elif len(arguments) > len(sent := self._sent.calls[i][1]) and arguments.startswith(sent):
                out.append({"tool_calls": [{"index": i, "function": {"arguments": arguments[len(sent):]}}]})
                self._sent.calls[i] = (name, arguments)
        return out
