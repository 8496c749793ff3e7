"""The capabilities llama-server reports for a chat template (`/props`' chat_template_caps),
against llama-server's own answers for the 70 real templates (data/template_caps.json,
made by tests/tools/template_caps.py). llama.cpp watches which probe values a template reads;
llama/chat/caps.py sees which reach the prompt, so a few answers differ, each listed here."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from llama.chat import ChatTemplate
from llama.chat.caps import template_caps

HERE = Path(__file__).resolve().parent
EXPECTED = json.loads((HERE / "data" / "template_caps.json").read_text(encoding="utf-8"))
# (template, capability): why ggmlpy's answer differs from llama-server's
DIFFERENT = {
    **{(t, "supports_typed_content"): "the template loops over a list content (llama.cpp counts only selectattr "
       "and indexing as reading it as a list)"
       for t in ("GigaChat3-10B-A1.8B.jinja", "GigaChat3.1-10B-A1.8B.jinja", "LFM2-8B-A1B.jinja",
                 "LFM2.5-8B-A1B.jinja", "LFM2.5-Instruct.jinja", "mistralai-Ministral-3-14B-Reasoning-2512.jinja")},
    **{(t, c): "the template appends to a list, which the sandbox refuses as transformers' does"
       for t in ("Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja")
       for c in ("supports_object_arguments", "supports_parallel_tool_calls", "supports_tool_calls")},
    ("LFM2.5-8B-A1B.jinja", "supports_preserve_reasoning"): "the earlier reasoning reaches the prompt, which "
                                                             "llama.cpp's renderer does not show",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_caps_match_llama_server(name: str) -> None:
    template = ChatTemplate((HERE / "templates" / name).read_text(encoding="utf-8"), lenient=True)
    ours = template_caps(template)
    assert set(ours) == set(EXPECTED[name])
    for cap, value in EXPECTED[name].items():
        if (name, cap) in DIFFERENT:
            assert ours[cap] is not value, f"{cap} now agrees with llama-server: drop it from DIFFERENT"
        else:
            assert ours[cap] is value, cap


@pytest.mark.parametrize("source, caps", [
    ("{{ messages[0].content }}", {"supports_system_role": True, "supports_tools": False}),
    ("{% for m in messages if m.role != 'system' %}{{ m.content }}{% endfor %}{{ tools }}",
     {"supports_system_role": False, "supports_tools": True}),
    ("{{ reasoning_effort or '' }}{{ messages[-1].content }}", {"supports_reasoning_effort": True}),
])
def test_caps_of_small_templates(source: str, caps: dict) -> None:
    ours = template_caps(ChatTemplate(source))
    assert {k: ours[k] for k in caps} == caps
