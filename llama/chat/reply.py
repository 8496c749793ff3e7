"""A model's reply read as llama-server reads it: reasoning, content and tool calls.

Replies written as messages with headers have their own readers: gpt-oss's harmony
(harmony.py) and Muse Glimmer's (muse_glimmer.py). Every other family is read in two stages,
each streamed: the reasoning is split off first (reasoning.py), then the tool calls are read
out of what is left (tool_calls.py). `ReplyStream` is what a streamed chat completion feeds
its text to; `parse_reply` is the same stream fed the whole reply at once, so a streamed
answer always adds up to the unstreamed one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from llama.chat.harmony import HarmonyStream
from llama.chat.json_fence import JsonFence
from llama.chat.message_stream import MessageStream
from llama.chat.muse_glimmer import MuseStream
from llama.chat.reasoning import Reasoning, ReasoningSplit, partial_suffix
from llama.chat.tool_calls import ToolCallStream, assemble_deltas


@dataclass(frozen=True)
class ReplyReader:
    """How one request's reply is read: `reasoning` (None: not split), `tool_format` (None:
    calls are not parsed, the text stays content), the request's `tools` (they type the
    values of XML calls), the `seed` of the call ids, and the `prefill`: the part of the
    reply the prompt wrote (a continued message), read before the generated text.
    `parallel` False (the request's parallel_tool_calls): only the first call is read."""
    reasoning: Optional[Reasoning] = None
    tool_format: Optional[str] = None
    tools: Optional[list] = None
    seed: str | int = 0
    prefill: str = ""
    # the template's tool-call family (call_formats.py), also where calls are not read: harmony's
    # (gpt-oss) and Muse Glimmer's replies are messages with headers, read by their own readers
    # (harmony.py, muse_glimmer.py); `reasoning` then only says whether to split it off
    family: str = ""
    answer_markers: tuple[str, ...] = ()   # markers around the answer, left out of the content
    parallel: bool = True
    # a JSON answer (response_format with a schema): a ```json fence around it is left out
    # of the content, as llama.cpp's parser takes the answer fenced or bare
    json_fence: bool = False

    def stream(self) -> "ReplyStream | MessageStream":
        if self.family == "harmony":
            return HarmonyStream(self.reasoning is not None, self.prefill, self.seed)
        if self.family == "muse_glimmer":
            return MuseStream(self)
        return ReplyStream(self)


class ReplyStream:
    """Text deltas in, OpenAI `delta` fragments out: `{"reasoning_content": ..}`,
    `{"content": ..}` and the tool-call fragments of `ToolCallStream`."""

    def __init__(self, reader: ReplyReader) -> None:
        self._thoughts = ReasoningSplit(reader.reasoning) if reader.reasoning is not None else None
        self._calls = (ToolCallStream(reader.tool_format, reader.seed, reader.tools, reader.parallel)
                       if reader.tool_format is not None else None)
        self._prefill = reader.prefill
        self._markers = _DropMarkers(reader.answer_markers) if reader.answer_markers else None
        self._fence = JsonFence() if reader.json_fence else None

    @property
    def done(self) -> bool:
        """The reply is complete: with parallel_tool_calls false, a second call has begun (it is
        left out; llama.cpp's grammar would have ended the reply before it)."""
        return self._calls is not None and self._calls.done

    def feed(self, text: str) -> list[dict]:
        return self._deltas(text, final=False)

    def finish(self) -> list[dict]:
        return self._deltas("", final=True)

    def _deltas(self, text: str, final: bool) -> list[dict]:
        text, self._prefill = self._prefill + text, ""
        if self._thoughts is None:
            pieces = [("content", text)] if text else []
        else:
            pieces = self._thoughts.feed(text) + (self._thoughts.finish() if final else [])
        if self._markers is not None:
            pieces = [(kind, self._markers.feed(piece) if kind == "content" else piece) for kind, piece in pieces]
            if final:
                pieces.append(("content", self._markers.finish()))
        if self._fence is not None:
            pieces = [(kind, self._fence.feed(piece) if kind == "content" else piece) for kind, piece in pieces]
            if final:
                pieces.append(("content", self._fence.finish()))
        deltas: list[dict] = []
        for kind, piece in pieces:
            if kind == "reasoning":
                deltas.append({"reasoning_content": piece})
            elif self._calls is not None:
                deltas += self._calls.feed(piece)
            elif piece:
                deltas.append({"content": piece})
        if final and self._calls is not None:
            deltas += self._calls.finish()
        return deltas


class _DropMarkers:
    """Content with some literal markers taken out, streamed: the end of the text that could
    still become a marker is held back."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        self._markers = markers
        self._held = ""

    def feed(self, text: str) -> str:
        text = self._held + text
        for marker in self._markers:
            text = text.replace(marker, "")
        keep = max(partial_suffix(text, m) for m in self._markers)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def finish(self) -> str:
        text, self._held = self._held, ""
        return text


def assemble_message(deltas: list[dict]) -> dict:
    """Stream fragments folded into one assistant message, as a client folds them:
    `content` (None when there is none and calls were made), `reasoning_content` when there
    was any, `tool_calls` when there were any."""
    content, calls = assemble_deltas(deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    message: dict = {"role": "assistant", "content": content if calls else (content or "")}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def parse_reply(text: str, reader: ReplyReader) -> dict:
    """A finished reply as one assistant message (see `assemble_message`)."""
    stream = reader.stream()
    return assemble_message(stream.feed(text) + stream.finish())
