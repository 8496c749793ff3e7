"""llama.cpp's built-in formats, byte for byte against llama.cpp's C++
(expected/_builtin_llama_cpp.json, made by make_builtin_expected.py through
llama-cpp-python's binding of `llama_chat_apply_template`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from llama.chat import BUILTIN_FORMATS, builtin_template

DATA = json.loads((Path(__file__).resolve().parent / "expected" / "_builtin_llama_cpp.json")
                  .read_text(encoding="utf-8"))
REQUIRED = ["chatml", "llama2", "llama2-sys", "llama3", "mistral-v1", "mistral-v3", "mistral-v7", "phi3", "phi4",
            "gemma", "zephyr", "vicuna", "deepseek", "deepseek3", "command-r", "chatglm4", "granite"]


def as_messages(conversation: list[list[str]]) -> list[dict]:
    return [{"role": role, "content": content} for role, content in conversation]


def test_names_are_llama_cpps() -> None:
    assert set(BUILTIN_FORMATS) == set(DATA["llama_cpp_names"]) | {"dots1"}
    assert set(REQUIRED) <= set(BUILTIN_FORMATS)


@pytest.mark.parametrize("name", sorted(DATA["formats"]))
def test_format_matches_llama_cpp(name: str) -> None:
    template = builtin_template(name)
    for record in DATA["formats"][name]:
        messages = as_messages(DATA["conversations"][record["conversation"]])
        got = template.render(messages, add_generation_prompt=record["add_generation_prompt"])
        assert got == record["expected"], (record["conversation"], record["add_generation_prompt"])


@pytest.mark.parametrize("name", ["chatml", "llama3", "gemma", "mistral-v3", "command-r"])
def test_content_parts_render_as_their_joined_text(name: str) -> None:
    """llama.cpp only takes strings; a list of text parts is their concatenation."""
    template = builtin_template(name)
    joined = [{"role": "user", "content": " Describe this. "}]
    parts = [{"role": "user", "content": [{"type": "text", "text": " Describe "},
                                          {"type": "image_url", "image_url": {"url": "x"}},
                                          {"type": "text", "text": "this. "}]}]
    assert template.render(parts) == template.render(joined)


def test_assistant_tool_call_without_content_renders_as_empty() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": []}]
    expected = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]
    assert builtin_template("chatml").render(messages) == builtin_template("chatml").render(expected)
