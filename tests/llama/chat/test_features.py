"""Each extra of HF's template environment (tojson options, strftime_now, namespace, dict,
{% generation %}, loop controls, trim/lstrip_blocks, kwargs, message preparation) checked
on a small template against transformers' own rendering (expected/_features.json, made by
make_expected.py)."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from llama.chat import ChatTemplate, ChatTemplateError

DATA = json.loads((Path(__file__).resolve().parent / "expected" / "_features.json").read_text(encoding="utf-8"))
FROZEN = datetime.fromisoformat(DATA["now"])


@pytest.mark.parametrize("case", DATA["cases"], ids=lambda c: c["name"])
def test_feature_matches_transformers(case: dict) -> None:
    def render() -> str:
        template = ChatTemplate(case["source"], bos_token=case["bos_token"], eos_token=case["eos_token"],
                                name=case["name"], clock=lambda: FROZEN)
        return template.render(case["messages"], add_generation_prompt=case["add_generation_prompt"],
                               tools=case.get("tools"), **case["kwargs"])

    if "error" in case:
        with pytest.raises(ChatTemplateError, match=case["name"]):
            render()
    else:
        assert render() == case["expected"]


def test_caller_messages_are_not_modified() -> None:
    messages = [{"role": "assistant", "content": None, "reasoning": "r"}]
    ChatTemplate("{{ messages | tojson }}").render(messages)
    assert messages == [{"role": "assistant", "content": None, "reasoning": "r"}]


def test_non_mapping_message_is_the_callers_error() -> None:
    with pytest.raises(TypeError):
        ChatTemplate("{{ messages }}").render(["just a string"])
