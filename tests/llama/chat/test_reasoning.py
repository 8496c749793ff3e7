"""A thinking model's reasoning split from its answer (llama/chat/reasoning.py), as
llama-server's --reasoning-format splits it: whole replies, the same reply streamed cut at
every character, and the markers read from real templates (tests/llama/chat/templates)."""
from __future__ import annotations

from pathlib import Path

import pytest

from llama.chat.reasoning import KNOWN_TAGS, Reasoning, ReasoningSplit, opens_thinking, thinking_tags

TEMPLATES = Path(__file__).parent / "templates"
THINK = next(t for t in KNOWN_TAGS if t.start == "<think>" and not t.needle)
LING = next(t for t in KNOWN_TAGS if t.inline_when_none)
COHERE = next(t for t in KNOWN_TAGS if t.start == "<|START_THINKING|>")
APRIEL = next(t for t in KNOWN_TAGS if t.start == "<|begin_assistant|>")


@pytest.mark.parametrize("template, tags", [
    ("Qwen-Qwen3-0.6B", THINK), ("Qwen-QwQ-32B", THINK), ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", THINK),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", COHERE),
    ("Apriel-1.6-15b-Thinker-fixed", APRIEL), ("unsloth-Apriel-1.5", None), ("inclusionai-ling-3.0-flash", LING),
    ("meta-llama-Llama-3.1-8B-Instruct", None), ("Qwen-Qwen2.5-7B-Instruct", None),
])
def test_the_markers_come_from_the_template(template, tags):
    assert thinking_tags((TEMPLATES / f"{template}.jinja").read_text()) == tags


CASES = [
    # (markers, format, prompt opened the block, reply) -> (reasoning, content)
    (THINK, "deepseek", False, "<think>\nI am\nthinking\n</think>\n\nHello!", ("I am\nthinking", "Hello!")),
    (THINK, "deepseek", True, "I am thinking</think>\n\nHello!", ("I am thinking", "Hello!")),
    (THINK, "deepseek", True, "cut off while thinking", ("cut off while thinking", "")),
    (THINK, "deepseek", False, "Hello <think>not reasoning</think>", ("", "Hello <think>not reasoning</think>")),
    (THINK, "deepseek", False, "  <think>a</think>b", ("a", "b")),
    (THINK, "deepseek", False, "<think></think>Only the answer", ("", "Only the answer")),
    (THINK, "deepseek", False, "<thin", ("", "<thin")),
    (THINK, "deepseek-legacy", False, "<think>x</think>Hi", ("x", "<think>x</think>Hi")),
    (THINK, "deepseek-legacy", True, "x</think>Hi", ("x", "<think>x</think>Hi")),
    (THINK, "none", True, "x</think>Hi", ("", "x</think>Hi")),
    (COHERE, "deepseek", False, "<|START_THINKING|>plan<|END_THINKING|>Answer", ("plan", "Answer")),
    # Ling 3 under reasoning format "none": the reasoning's text stays, its markers go
    (LING, "inline", True, "x\n</think>\nHi", ("", "x\n\nHi")),
    (LING, "inline", False, "<think>x</think>Hi <think>y</think>", ("", "xHi <think>y</think>")),
    # Apriel 1.6: the reply is read from the marker its prompt wrote, with the reasoning's lead
    (APRIEL, "deepseek", False, "<|begin_assistant|>\nHere are my reasoning steps:\nI am\n[BEGIN FINAL RESPONSE]\nHi",
     ("Here are my reasoning steps:\nI am", "Hi")),
]


@pytest.mark.parametrize("tags, fmt, opened, reply, expected", CASES)
def test_whole_replies(tags, fmt, opened, reply, expected):
    assert Reasoning(tags, fmt, opened).split(reply) == expected


@pytest.mark.parametrize("tags, fmt, opened, reply, expected", CASES)
def test_streams_cut_anywhere_add_up_and_keep_reasoning_out_of_content(tags, fmt, opened, reply, expected):
    """Every cut into two deltas, and one delta per character, give the whole reply's split;
    with a format that splits, no content piece ever holds a marker's text or reasoning."""
    cuts = [[reply[:i], reply[i:]] for i in range(len(reply) + 1)] + [list(reply)]
    for deltas in cuts:
        stream = ReasoningSplit(Reasoning(tags, fmt, opened))
        pieces = [p for d in deltas for p in stream.feed(d)] + stream.finish()
        got = ("".join(s for k, s in pieces if k == "reasoning"), "".join(s for k, s in pieces if k == "content"))
        assert got == expected, deltas
        assert all(s for _, s in pieces), "no empty pieces"
        if fmt == "deepseek" and expected[0]:
            content_so_far = ""
            for kind, s in pieces:
                if kind == "content":
                    content_so_far += s
                    assert expected[1].startswith(content_so_far)


def test_an_open_block_at_the_prompts_end():
    assert opens_thinking("<|im_start|>assistant\n<think>\n", THINK)
    assert not opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK)
    assert not opens_thinking("<|im_start|>assistant\n", None)
    # Apriel 1.6's generation prompt writes the reasoning's lead after the marker
    assert APRIEL.lead == "Here are my reasoning steps:"
    assert opens_thinking("<|begin_user|>\nHi\n<|begin_assistant|>\nHere are my reasoning steps:\n", APRIEL)
    assert not opens_thinking("<|begin_assistant|>\nHere are my reasoning steps:\nx\n[BEGIN FINAL RESPONSE]\n", APRIEL)
    assert not opens_thinking("Here are my reasoning steps:\n", THINK)


def test_apriel_reads_the_reasoning_lead_its_prompt_wrote():
    """Apriel 1.6's generation prompt writes the reasoning's lead after its marker: the reasoning
    starts with it (as llama.cpp reads the generation prompt with the reply); a continued message
    gives the lead way to the message's own reasoning."""
    from llama.api.chat_completion import ChatSetup, reply_reader
    from llama.api.chat_prompt import chat_prompt
    from llama.chat import ChatTemplate
    from llama.chat.reply import parse_reply

    setup = ChatSetup.for_template(ChatTemplate((TEMPLATES / "Apriel-1.6-15b-Thinker-fixed.jinja").read_text(),
                                                lenient=True))
    user = [{"role": "user", "content": "Hi"}]
    prompt = chat_prompt(setup, user)
    assert prompt.opened and prompt.text.endswith("<|begin_assistant|>\nHere are my reasoning steps:\n")
    reply = "a\nb\n[BEGIN FINAL RESPONSE]\nHello!"
    message = parse_reply(reply, reply_reader(setup, prompt, None, "none", "auto"))
    assert (message["reasoning_content"], message["content"]) == ("Here are my reasoning steps:\na\nb", "Hello!")
    raw = parse_reply(reply, reply_reader(setup, prompt, None, "none", "none"))["content"]
    assert raw == "<|begin_assistant|>\nHere are my reasoning steps:\n" + reply
    continued = chat_prompt(setup, user + [{"role": "assistant", "content": "", "reasoning_content": "I'm"}],
                            add_generation_prompt=False)
    assert continued.opened and continued.text.endswith("\n<|begin_assistant|>\nI'm")   # llama.cpp's prompt
    message = parse_reply(" sure[BEGIN FINAL RESPONSE]Yes", reply_reader(setup, continued, None, "none", "auto"))
    assert (message["reasoning_content"], message["content"]) == ("I'm sure", "Yes")
