"""A thinking model's reasoning, split from its answer as llama-server splits it.

Thinking models write their reasoning between two markers before the answer (`<think>` ..
`</think>` for Qwen3, QwQ and the DeepSeek R1 family, `<|START_THINKING|>` ..
`<|END_THINKING|>` for Command R7B). Which markers a model uses is read from its chat
template (`thinking_tags`); whether its prompt already opened the block (R1's and QwQ's
templates end the generation prompt with `<think>\\n`) is read from the rendered prompt.

`ReasoningSplit` turns the generated text, whole or streamed, into reasoning and content,
as llama-server's `--reasoning-format`:
- `deepseek` (and `auto`, the default): the leading thinking block becomes
  `reasoning_content`, the rest `content`;
- `deepseek-legacy`: the same `reasoning_content`, and `content` keeps the raw text;
- `none`: nothing is split, `content` is the raw text.

A marker cut in half by the stream is held back until it is known, so no reasoning text ever
reaches `content`. Only a block at the very start is reasoning (after whitespace), as in
llama.cpp: a `<think>` later in an answer is the answer's text. An unclosed block (the
budget ran out, the model stopped) is reasoning to the end.
"""
from __future__ import annotations

from dataclasses import dataclass

REASONING_FORMATS = ("auto", "deepseek", "deepseek-legacy", "none")
INLINE = "inline"   # a Reasoning's format for "none" where the tags are inline_when_none


@dataclass(frozen=True)
class ThinkingTags:
    """The markers around a model's reasoning; `needle`: the template text that says a template
    writes them, where the end marker alone does not (default: the end marker).

    `channel`: a marker the start begins with that opens a block of any kind (Gemma 4's
    `<|channel>`). Then, as llama.cpp's Gemma 4 parser reads a reply, extra channel markers
    before a thinking block are dropped, and the answer runs only to the next channel marker
    (a further thinking block, whose reasoning joins the rest) or to a stray end marker,
    after which the reply is over.

    `lead`: the reasoning's first words, which the template's generation prompt writes after
    the start marker (Apriel 1.6's "Here are my reasoning steps:"). A prompt that ends with
    them has opened the block, and they are read as the reasoning's start, as llama.cpp reads
    the generation prompt with the reply.

    `inline_when_none`: with reasoning format "none" the reasoning stays in the content without
    its markers (llama.cpp's Ling 3 parser), where other families give the block back raw."""
    start: str
    end: str
    needle: str = ""
    channel: str = ""
    lead: str = ""
    inline_when_none: bool = False


# The families llama.cpp's template analysis finds, in the order they are tried (a marker that
# contains another's end comes first).
KNOWN_TAGS = (
    ThinkingTags("<|channel|>analysis<|message|>", "<|end|>", needle="<|channel|>analysis"),   # gpt-oss (harmony)
    # Muse Glimmer: a message to itself, then the answer's message (muse_glimmer.py reads them)
    ThinkingTags(" to=self<|message|>", "<|eom|><|start|>assistant to=user<|message|>",
                 needle="<|start|>assistant to=self<|message|>"),
    ThinkingTags("<mm:think>", "</mm:think>"),                          # MiniMax M3
    ThinkingTags("<|channel>thought", "<channel|>", channel="<|channel>"),   # Gemma 4
    ThinkingTags("<|open|>think<|sep|>", "<|close|>think<|sep|>", needle="open_tag('think')"),   # Kimi K3
    ThinkingTags("<|begin_assistant|>", "[BEGIN FINAL RESPONSE]", needle="<|begin_assistant|>",   # Apriel 1.6
                 lead="Here are my reasoning steps:"),
    ThinkingTags("<think>", "</think>", needle="<role>ASSISTANT</role>", inline_when_none=True),   # Ling 3
    ThinkingTags("<think>", "</think>"),
    # Kimi K2: its parser reads <think> blocks even where the template never writes one
    ThinkingTags("<think>", "</think>", needle="<|tool_calls_section_begin|>"),
    ThinkingTags("<|START_THINKING|>", "<|END_THINKING|>"),
    ThinkingTags("<seed:think>", "</seed:think>"),
    ThinkingTags("[THINK]", "[/THINK]"),
    ThinkingTags("<|think|>", "<|/think|>"),
)


def thinking_tags(template_source: str | None) -> ThinkingTags | None:
    """The thinking markers a chat template writes, None for a model that does not think."""
    if not template_source:
        return None
    return next((t for t in KNOWN_TAGS if (t.needle or t.end) in template_source), None)


def check_format(name: str, where: str = "reasoning_format") -> str:
    """`name` if it is one of llama-server's reasoning formats, else ValueError naming it."""
    if name not in REASONING_FORMATS:
        raise ValueError(f"{where} {name!r} is not one of {', '.join(REASONING_FORMATS)}")
    return name


def opens_thinking(prompt: str, tags: ThinkingTags | None) -> bool:
    """Whether the prompt ends inside a thinking block the template opened (its start marker,
    then the reasoning's `lead` where the template writes one)."""
    if tags is None:
        return False
    return before_lead(prompt, tags).rstrip().endswith(tags.start)


def before_lead(prompt: str, tags: ThinkingTags) -> str:
    """The prompt without the reasoning's `lead` (and the blanks after it) at its end."""
    tail = prompt.rstrip()
    return tail[:-len(tags.lead)] if tags.lead and tail.endswith(tags.lead) else prompt


@dataclass(frozen=True)
class Reasoning:
    """How one chat request's output is split: the markers, the format, and whether the
    prompt already opened the block."""
    tags: ThinkingTags
    fmt: str = "deepseek"
    opened: bool = False
    stops: tuple[str, ...] = ()   # markers that end the reasoning and begin the answer (a tool call's)

    def split(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of a whole reply."""
        stream = ReasoningSplit(self)
        parts = stream.feed(text) + stream.finish()
        reasoning = "".join(s for kind, s in parts if kind == "reasoning")
        content = "".join(s for kind, s in parts if kind == "content")
        return reasoning, content


_BEFORE, _INSIDE, _AFTER, _OVER = "before", "inside", "after", "over"


class ReasoningSplit:
    """Streamed text -> ("reasoning", text) and ("content", text) pieces, in order.

    Reasoning is trimmed at both ends, and the whitespace between the end marker and the
    answer is dropped; the content is passed on as it comes (the tool-call stream trims it)."""

    def __init__(self, reasoning: Reasoning) -> None:
        self.tags = reasoning.tags
        self.fmt = reasoning.fmt
        self._state = _INSIDE if reasoning.opened else _BEFORE
        self._buf = ""          # text not yet settled
        self._started = False   # some reasoning has been emitted
        self._ws = ""           # reasoning whitespace held until more reasoning follows
        self._prefix = self.tags.start if reasoning.opened else ""   # for deepseek-legacy
        self._after_end = False  # the block just closed: the answer's leading whitespace is dropped
        self.stops = reasoning.stops
        self._answered = False   # an answer has ended at a channel marker (tags with a channel)

    def feed(self, text: str) -> list[tuple[str, str]]:
        if self.fmt == "none":
            return [("content", text)] if text else []
        self._buf += text
        return self._scan(final=False)

    def finish(self) -> list[tuple[str, str]]:
        if self.fmt == "none":
            return []
        return self._scan(final=True)

    def _scan(self, final: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while self._buf:
            if self._state == _OVER:
                self._buf = ""
                break
            if self._state == _BEFORE:
                stripped = self._buf.lstrip()
                start = self.tags.start
                kind = self._extra_channel(stripped, final)
                if kind == "extra":
                    self._buf = stripped[len(self.tags.channel):]
                    continue
                if kind == "wait":
                    break
                if kind == "other" and self._answered:   # the answer's end: the reply is over
                    self._state = _OVER
                    continue
                if stripped.startswith(start):
                    self._state = _INSIDE
                    self._prefix = self._buf[:len(self._buf) - len(stripped)] + start
                    self._buf = stripped[len(start):]
                    continue
                if stripped.startswith(self.tags.end) and self.fmt != "deepseek-legacy":
                    self._buf = stripped[len(self.tags.end):]   # an empty block, its opening implied
                    self._state, self._after_end = _AFTER, True
                    continue
                if not final and (not stripped or start.startswith(stripped) or self.tags.end.startswith(stripped)):
                    break   # could still become a marker
                self._state = _AFTER
                continue
            if self._state == _INSIDE:
                end = self._buf.find(self.tags.end)
                stop = self._first_stop()
                if stop >= 0 and (end < 0 or stop < end):
                    self._reasoning(out, self._buf[:stop], closing=True)
                    self._legacy(out, self._buf[:stop])
                    self._buf = self._buf[stop:]
                    self._state = _AFTER
                    continue
                if end >= 0:
                    self._reasoning(out, self._buf[:end], closing=True)
                    raw = self._buf[:end + len(self.tags.end)]
                    self._buf = self._buf[end + len(self.tags.end):]
                    self._state = _AFTER
                    self._legacy(out, raw)
                    self._after_end = True
                    continue
                keep = 0 if final else max(partial_suffix(self._buf, m) for m in (self.tags.end, *self.stops))
                body = self._buf[:len(self._buf) - keep]
                self._reasoning(out, body, closing=final)
                self._legacy(out, body)
                self._buf = self._buf[len(body):]
                break
            # after the block: the answer
            if self._after_end and self.fmt not in ("deepseek-legacy", INLINE):
                stripped = self._buf.lstrip()
                if not stripped:
                    if final:
                        self._buf = ""
                    break
                self._buf = stripped
                self._after_end = False
            self._after_end = False
            if self.tags.channel and self.fmt != "deepseek-legacy":
                if not self._answer_to_channel(out, final):
                    break
                continue
            out.append(("content", self._buf))
            self._buf = ""
        return out

    def _extra_channel(self, stripped: str, final: bool) -> str:
        """What a channel marker at the start of `stripped` is, where the tags have one: "extra"
        (another one follows: Gemma 4 sometimes doubles it, and it is dropped), "wait" (that
        is not known yet), "other" (a block that is not a thinking one), else ""."""
        channel = self.tags.channel
        if not channel or self.fmt == "deepseek-legacy" or not stripped.startswith(channel) \
                or stripped.startswith(self.tags.start):
            return ""
        rest = stripped[len(channel):]
        if rest.startswith(channel):
            return "extra"
        if not final and (channel.startswith(rest) or self.tags.start.startswith(stripped)):
            return "wait"
        return "other"

    def _answer_to_channel(self, out: list, final: bool) -> bool:
        """The answer up to the next channel marker (then a further block: back to before
        one) or a stray end marker (then the reply is over); False when what remains could
        still be the start of either and more text must come."""
        at = [(i, m) for m in (self.tags.channel, self.tags.end) if (i := self._buf.find(m)) >= 0]
        if at:
            i, marker = min(at)
            if i:
                out.append(("content", self._buf[:i]))
            self._buf = self._buf[i:]
            self._state = _OVER if marker == self.tags.end else _BEFORE
            self._answered = True
            return True
        keep = 0 if final else max(partial_suffix(self._buf, m) for m in (self.tags.channel, self.tags.end))
        if len(self._buf) > keep:
            out.append(("content", self._buf[:len(self._buf) - keep]))
            self._buf = self._buf[len(self._buf) - keep:]
        return final and not self._buf

    def _first_stop(self) -> int:
        found = [i for i in (self._buf.find(m) for m in self.stops) if i >= 0]
        return min(found) if found else -1

    def _reasoning(self, out: list, text: str, closing: bool) -> None:
        if self.fmt == INLINE:   # the reasoning's text is content, as it came
            if text:
                out.append(("content", text))
            return
        if not self._started:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            self._ws += text
        else:
            out.append(("reasoning", self._ws + body))
            self._ws = text[len(body):]
            self._started = True
        if closing:
            self._ws = ""

    def _legacy(self, out: list, raw: str) -> None:
        """deepseek-legacy: the raw text of the block in the content too."""
        if self.fmt == "deepseek-legacy" and (raw or self._prefix):
            out.append(("content", self._prefix + raw))
            self._prefix = ""


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (held back: the marker
    may be arriving)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
