"""The thinking markers as a template writes them around a message's reasoning, whitespace and
all (Qwen 3.5: `<think>\\n` .. `\\n</think>\\n\\n`, where `ThinkingTags` has the bare markers).

A continued assistant message is written into the prompt with these forms, as llama.cpp writes
it: the markers it uses there are the ones its template analysis learns, with their whitespace,
so a prompt written with the bare markers would not be the one the model sees under llama-server.
`thinking_forms` learns them the same way, by rendering probe messages through the template:

- an assistant message with reasoning (compare_reasoning_presence): the start marker and the
  whitespace between it and the reasoning, and the whitespace, end marker and whitespace after
  the reasoning (only the end and what follows it where no start marker comes before it);
- else the generation prompt with thinking on and off (compare_thinking_enabled): what thinking
  on adds to it, where that is the start marker, or what thinking off adds, where that is the
  end marker;
- else the bare markers.

llama.cpp's own exceptions are kept as data (`FIXED`): the templates it reads with a specialised
parser, which writes fixed markers, and its per-template workarounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import regex

from llama.chat.reasoning import ThinkingTags


@dataclass(frozen=True)
class ThinkingForms:
    """`start`: the start marker and the whitespace the template writes after it; `end`: the end
    marker with the whitespace around it (and what a specialised parser of llama.cpp writes after
    it: Kimi K3's response section). A continued message's reasoning follows `start`, which takes
    the place of what follows it in the generation prompt; `opening`: the generation prompt such
    a parser writes instead of the template's (None: the template's, up to `start`).
    `closes_empty`: a message without reasoning is continued after the end marker alone
    (DeepSeek V4's turns without thinking)."""
    start: str
    end: str
    opening: Optional[str] = None
    closes_empty: bool = False


# (renders messages, add_generation_prompt, enable_thinking) -> the prompt; raises where the template fails
Render = Callable[[list, bool, bool], str]

# llama.cpp's probe texts (chat-diff-analyzer.cpp)
_USER = {"role": "user", "content": "U_USER_MSG Hello END_U"}
_ANSWER = "A_ASST_MSG I can help END_A"
_THOUGHT = "REASON_PART I am thinking END_R"
_SPACE = regex.compile(r"[ \t\n\v\f\r]*")   # the whitespace llama.cpp's parsers skip (C isspace)
_SPACE_AT_END = regex.compile(r"[ \t\n\v\f\r]*\Z")

# Template text -> the forms llama.cpp writes, first match wins: (needles all present, needles all
# absent, forms; None: the bare markers). Its specialised parsers that read reasoning first, in the
# order it tries them, then its per-template workarounds.
FIXED: tuple[tuple[tuple[str, ...], tuple[str, ...], Optional[ThinkingForms]], ...] = (
    (("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]"), ("[CALL_ID]",),   # Ministral 3
     ThinkingForms("[THINK]", "[/THINK]", opening="")),
    (("<|channel|>",), (),   # gpt-oss: the analysis message, then the final one
     ThinkingForms("<|channel|>analysis<|message|>", "<|end|><|start|>assistant<|channel|>final<|message|>",
                   opening="<|start|>assistant")),
    (("<atem:function_calls>", "<|eom|>"), (),   # Muse Glimmer: a message to itself, then the answer's
     ThinkingForms(" to=self<|message|>", "<|eom|><|start|>assistant to=user<|message|>",
                   opening="<|start|>assistant")),
    (("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), (),   # Kimi K2
     ThinkingForms("<think>", "</think>", opening="<|im_assistant|>assistant<|im_middle|>")),
    (("<|open|>", "<|close|>", "<|end_of_msg|>"), (),   # Kimi K3: the thinking section, then the response's
     ThinkingForms("<|open|>think<|sep|>", "<|close|>think<|sep|><|open|>response<|sep|>",
                   opening='<|open|>message role="assistant"<|sep|>')),
    (("<role>ASSISTANT</role>", "<arg_key>"), (),   # Ling 3
     ThinkingForms("<think>", "</think>", opening="<role>ASSISTANT</role>\n")),
    (("<|START_TEXT|>", "<|START_ACTION|>"), (),   # Cohere 2 MoE: the thinking, then the text
     ThinkingForms("<|START_THINKING|>", "<|END_THINKING|><|START_TEXT|>",
                   opening="<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")),
    (("<|tool_list_start|>", "<|tool_list_end|>"), (),   # LFM2
     ThinkingForms("<think>", "</think>", opening="<|im_start|>assistant\n")),
    (("List of tools: [",), ("<|tool_list_start|>",),   # LFM2.5
     ThinkingForms("<think>", "</think>", opening="<|im_start|>assistant\n")),
    (("]<]minimax[>[", "<tool_call>", "<invoke name="), (), None),   # MiniMax M3
    (("dsml_token", "DSML", "function_calls"), (),   # DeepSeek V3.2
     ThinkingForms("<think>", "</think>", opening="<｜Assistant｜>")),
    (("dsml_token", "DSML", "tool_calls"), (),   # DeepSeek V4
     ThinkingForms("<think>", "</think>", opening="<｜Assistant｜>", closes_empty=True)),
    (("'<|tool_call>call:'",), (), ThinkingForms("<|channel>thought\n", "<channel|>")),   # Gemma 4
    (("Tool usage guidelines:", '<function name="', '<param name="'), (),   # MiniCPM 5
     ThinkingForms("<think>\n", "\n</think>\n\n", opening="<|im_start|>assistant\n")),
    # Qwen3-Coder's parser, which Qwen 3.5, Nemotron 3 Nano and StepFun 3.5 get too (those that think)
    (("<tool_call>", "<function=", "<parameter=", "<think>"), ("'<tool_call><function=' ~ tool_call.name ~ '>'",),
     ThinkingForms("<think>\n", "\n</think>\n\n", opening="<|im_start|>assistant\n")),
    # workarounds: Nemotron Nano v2; Laguna, whose template writes whitespace its model does not
    (("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>"), (), ThinkingForms("<think>\n", "</think>")),
    (("laguna_glm_thinking",), (), None),
)


def thinking_forms(render: Render, tags: ThinkingTags, source: str) -> ThinkingForms:
    """The forms of `tags` in the template whose text is `source` and which `render` renders."""
    for present, absent, forms in FIXED:
        if all(n in source for n in present) and not any(n in source for n in absent):
            return forms or ThinkingForms(tags.start, tags.end)
    start, end = _around_reasoning(render, tags)
    if start is None or end is None:
        on_start, off_end = _thinking_switch(render, tags)
        start = on_start if start is None else start
        end = off_end if end is None else end
    return ThinkingForms(tags.start if start is None else start, tags.end if end is None else end)


def _around_reasoning(render: Render, tags: ThinkingTags) -> tuple[Optional[str], Optional[str]]:
    """The markers around a past message's reasoning, as the template renders it (None: not
    found): the start marker and the whitespace after it, and the whitespace, end marker and
    whitespace after the reasoning; where no start marker comes before the reasoning, the end
    marker and the whitespace after it only (llama.cpp's delimiter form)."""
    message = {"role": "assistant", "content": _ANSWER, "reasoning_content": _THOUGHT}
    text = _rendered(render, [_USER, message], False, True)
    at = text.find(_THOUGHT) if text else -1
    if at < 0:
        return None, None
    before, after = text[:at], text[at + len(_THOUGHT):]
    gap = _SPACE.match(after).group()
    if not after[len(gap):].startswith(tags.end):
        return None, None
    end = tags.end + _SPACE.match(after, len(gap) + len(tags.end)).group()
    lead = _SPACE_AT_END.search(before).group()
    if not before[:len(before) - len(lead)].endswith(tags.start):
        return None, end
    return tags.start + lead, gap + end


def _thinking_switch(render: Render, tags: ThinkingTags) -> tuple[Optional[str], Optional[str]]:
    """(start, end) from the generation prompt with thinking on and off: what thinking on adds at
    its end, where that is the start marker; what thinking off adds, where that is the end marker."""
    on = _rendered(render, [_USER], True, True)
    off = _rendered(render, [_USER], True, False)
    if on is None or off is None or on == off:
        return None, None
    if on.startswith(off) and on[len(off):].strip() == tags.start:
        return on[len(off):], None
    if off.startswith(on) and off[len(on):].strip() == tags.end:
        return None, off[len(on):]
    return None, None


def _rendered(render: Render, messages: list, add_generation_prompt: bool, enable_thinking: bool) -> Optional[str]:
    """The probe rendered, None where the template fails on it (llama.cpp skips that probe)."""
    try:
        return render(messages, add_generation_prompt, enable_thinking)
    except Exception:  # noqa: BLE001 - any template error only means the probe tells nothing
        return None
