"""A thinking model's reasoning split from its answer (llama/chat/reasoning.py), as
llama-server's --reasoning-format splits it: whole replies, the same reply streamed cut at
every character, and the markers read from real templates (tests/llama/chat/templates)."""
from __future__ import annotations

from pathlib import Path

import pytest

from llama.chat.reasoning import KNOWN_TAGS, Reasoning, ReasoningSplit, opens_thinking, thinking_tags

TEMPLATES = Path(__file__).parent / "templates"
THINK = next(t for t in KNOWN_TAGS if t.start == "<think>")
COHERE = next(t for t in KNOWN_TAGS if t.start == "<|START_THINKING|>")


@pytest.mark.parametrize("template, tags", [
    ("Qwen-Qwen3-0.6B", THINK), ("Qwen-QwQ-32B", THINK), ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", THINK),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", COHERE),
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
