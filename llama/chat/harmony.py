"""gpt-oss's harmony replies: a reply is a run of messages, each a header and a body,

    <|channel|>analysis<|message|>reasoning<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": ".."}<|call|>
    <|start|>assistant<|channel|>final<|message|>the answer

read as llama.cpp's gpt-oss parser reads them: the `analysis` channel is reasoning, `final`
and `commentary` are the answer, a message to `functions.NAME` is a call of NAME with the
body as its JSON arguments, and a message to any other recipient (gpt-oss's built-in
`python` or `container.exec`) is left out. With reasoning not split off (reasoning format
"none"), an analysis message stays in the content as written.

`HarmonyStream` has `ReplyStream`'s interface. It parses the text it has so far and emits
what changed; the parse of a prefix holds back whatever could still change (a marker cut in
half, trailing whitespace, a call not yet ended), so its output only ever grows.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import regex

from llama.chat.tool_calls import tool_call_id

_START = "<|start|>"
_MESSAGE = "<|message|>"
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_MARKERS = (_START, "<|channel|>", _MESSAGE, *_ENDS)
_CHANNEL = regex.compile(r"<\|channel\|>\s*([\w-]+)")
_RECIPIENT = regex.compile(r"\bto=([^\s<]+)")
_ANSWER = ("", "assistant", "user", "all")   # recipients of the reply itself, not of a tool
_ROLE = regex.compile(r"<\|start\|>\w*")


@dataclass
class _Parse:
    reasoning: str = ""
    content: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)


def _held(text: str) -> int:
    """Length of the end of `text` that could be the start of a marker."""
    for n in range(min(len(text), max(map(len, _MARKERS)) - 1), 0, -1):
        if any(m.startswith(text[-n:]) for m in _MARKERS):
            return n
    return 0


def parse_harmony(text: str, final: bool, split_reasoning: bool = True) -> _Parse:
    """The reasoning, content and calls of `text`; when not `final`, only what more text
    cannot change."""
    out = _Parse()
    pos = 0
    while pos < len(text):
        role = _ROLE.match(text, pos) if text.startswith(_START, pos) else None
        head_at = role.end() if role else pos
        rest = text[head_at:].lstrip()
        if not final and any(m.startswith(rest) for m in ("<|channel|>", "to=")):
            break   # a header may be arriving
        if not rest.startswith(("<|channel|>", "to=")):   # text outside any message: the answer
            nxt = min([i for i in (text.find(m, head_at + 1) for m in (_START, "<|channel|>")) if i > 0],
                      default=len(text))
            chunk = text[head_at:nxt]
            out.content += chunk if final or nxt < len(text) else chunk[:len(chunk) - _held(chunk)]
            pos = nxt
            continue
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
            body = body[:len(body) - _held(body)]
        channel = channels[-1] if channels else "final"
        if recipient.startswith("functions."):
            if closed:
                args = body.strip()
                try:
                    value = json.loads(args)
                except ValueError:
                    value = None
                if isinstance(value, dict):
                    out.calls.append((recipient[len("functions."):], json.dumps(value, ensure_ascii=False)))
        elif recipient in _ANSWER and channel == "analysis":
            if split_reasoning:
                out.reasoning += body
            else:
                out.content += text[head_at:start] + body + (marker if ends else "")
        elif recipient in _ANSWER:
            out.content += body
        # anything else is a message to a built-in tool (python, container.exec): not the answer
        if not closed:
            break
        pos = end + len(marker)
    out.reasoning = out.reasoning.rstrip()   # trimmed, as the other readers trim; while streaming,
    out.content = out.content.rstrip()       # whitespace at the end may yet be followed by more text
    return out


def writes_harmony(template_source: str | None) -> bool:
    """Whether a chat template writes harmony messages (gpt-oss's)."""
    src = template_source or ""
    return "<|channel|>" in src and _MESSAGE in src


class HarmonyStream:
    """Text deltas in, OpenAI `delta` fragments out (`ReplyStream`'s interface)."""

    def __init__(self, split_reasoning: bool = True, prefill: str = "", seed: str | int = 0) -> None:
        self._split = split_reasoning
        self._text = prefill
        self._seed = seed
        self._sent = _Parse()

    def feed(self, text: str) -> list[dict]:
        self._text += text
        return self._emit(parse_harmony(self._text, final=False, split_reasoning=self._split))

    def finish(self) -> list[dict]:
        return self._emit(parse_harmony(self._text, final=True, split_reasoning=self._split))

    def _emit(self, now: _Parse) -> list[dict]:
        out: list[dict] = []
        reasoning, content = now.reasoning.lstrip(), now.content.lstrip()
        if len(reasoning) > len(self._sent.reasoning) and reasoning.startswith(self._sent.reasoning):
            out.append({"reasoning_content": reasoning[len(self._sent.reasoning):]})
            self._sent.reasoning = reasoning
        if len(content) > len(self._sent.content) and content.startswith(self._sent.content):
            out.append({"content": content[len(self._sent.content):]})
            self._sent.content = content
        for i in range(len(self._sent.calls), len(now.calls)):
            name, arguments = now.calls[i]
            out.append({"tool_calls": [{"index": i, "id": tool_call_id(self._seed, i), "type": "function",
                                        "function": {"name": name, "arguments": ""}}]})
            out.append({"tool_calls": [{"index": i, "function": {"arguments": arguments}}]})
            self._sent.calls.append(now.calls[i])
        return out
