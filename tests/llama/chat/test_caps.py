"""Which templates read a tool call's arguments as an object (llama/chat/caps.py), found by
rendering probes, and the messages such a template is given."""
from __future__ import annotations

from pathlib import Path

import pytest

from llama.chat import ChatTemplate
from llama.chat.caps import object_arguments, with_object_arguments

TEMPLATES = Path(__file__).resolve().parent / "templates"
LOOP = "{% for m in messages %}{% for tc in m.tool_calls or [] %}{BODY}{% endfor %}{% endfor %}"


@pytest.mark.parametrize("body, expected", [
    ("{% for k, v in tc.function.arguments|items %}{{ k }}={{ v }}{% endfor %}", True),   # needs a mapping
    ("{{ tc.function.arguments|tojson }}", True),        # text would be quoted a second time
    ("{{ tc.function.arguments }}", False),              # writes the text as it is
    ("{{ tc.function.name }}", False),                   # never shows them
])
def test_probe_on_small_templates(body: str, expected: bool) -> None:
    assert object_arguments(ChatTemplate(LOOP.replace("{BODY}", body))) is expected


@pytest.mark.parametrize("name, expected", [("Qwen3.5-4B", True), ("meta-llama-Llama-3.1-8B-Instruct", True),
                                            ("deepseek-ai-DeepSeek-V3.1", True),
                                            ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", False)])
def test_probe_on_real_templates(name: str, expected: bool) -> None:
    template = ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"), lenient=True)
    assert object_arguments(template) is expected


def test_only_json_objects_become_objects() -> None:
    call = lambda args: {"type": "function", "function": {"name": "f", "arguments": args}}  # noqa: E731
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "tool_calls": [call('{"a": 1}'), call("[1]"), call("not json"), call({"b": 2})]}]
    out = with_object_arguments(messages)
    assert [c["function"]["arguments"] for c in out[1]["tool_calls"]] == [{"a": 1}, "[1]", "not json", {"b": 2}]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'   # the caller's are untouched
