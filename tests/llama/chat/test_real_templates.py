"""70 real chat templates (llama.cpp's models/templates/) rendered by ChatTemplate and
compared with what Hugging Face transformers renders for the same inputs
(expected/*.json, made by make_expected.py; see it for how dates are frozen)."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from llama.chat import ChatTemplate, ChatTemplateError

HERE = Path(__file__).resolve().parent
EXPECTED_FILES = sorted(p for p in (HERE / "expected").glob("*.json") if not p.name.startswith("_"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", EXPECTED_FILES, ids=lambda p: p.stem)
def test_template_matches_transformers(path: Path) -> None:
    data = _load(path)
    source = (HERE / "templates" / data["template"]).read_text(encoding="utf-8")
    frozen = datetime.fromisoformat(data["now"])
    template = ChatTemplate(source, bos_token=data["bos_token"], eos_token=data["eos_token"],
                            name=data["template"], clock=lambda: frozen)
    for case in data["cases"]:
        render = lambda: template.render(  # noqa: E731 - one call, two outcomes
            case["messages"], add_generation_prompt=case["add_generation_prompt"], tools=case.get("tools"),
            **case.get("kwargs", {}))
        if "error" in case:
            with pytest.raises(ChatTemplateError) as info:
                render()
            assert data["template"] in str(info.value), case["name"]
        else:
            assert render() == case["expected"], case["name"]


def test_enough_real_templates_and_cases() -> None:
    cases = [case for path in EXPECTED_FILES for case in _load(path)["cases"]]
    assert len(EXPECTED_FILES) >= 40
    assert sum("expected" in case for case in cases) >= 500
