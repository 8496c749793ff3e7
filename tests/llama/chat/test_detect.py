"""detect_format against llama.cpp's `llm_chat_detect_template`.

Two oracles: the format that reading the C++ says each probe string must give (stored
with the probes), and the C++ itself: given a template source, llama.cpp detects a format
and renders with it (or returns -1 when it recognises none), so the built-in we detect
must render the same bytes (expected/_builtin_llama_cpp.json)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from llama.chat import BUILTIN_FORMATS, builtin_template, detect_format

HERE = Path(__file__).resolve().parent
DATA = json.loads((HERE / "expected" / "_builtin_llama_cpp.json").read_text(encoding="utf-8"))


def check_against_cpp(source: str, cpp: dict) -> None:
    detected = detect_format(source)
    for conversation in ("multi_turn", "other_roles"):
        if cpp[conversation] is None:
            assert detected is None
        else:
            assert detected is not None
            messages = [{"role": r, "content": c} for r, c in DATA["conversations"][conversation]]
            assert builtin_template(detected).render(messages) == cpp[conversation], (detected, conversation)


@pytest.mark.parametrize("name", sorted(DATA["real_templates"]))
def test_real_template(name: str) -> None:
    check_against_cpp((HERE / "templates" / name).read_text(encoding="utf-8"), DATA["real_templates"][name])


def test_probes_match_the_reading_of_the_cpp() -> None:
    for probe, record in DATA["detection_probes"].items():
        assert detect_format(probe) == record["llama_cpp_reading"], probe
        check_against_cpp(probe, record)


def test_a_format_name_is_its_own_format() -> None:
    for name in BUILTIN_FORMATS:
        assert detect_format(name) == (None if name == "dots1" else name)


def test_real_templates_detected_as_llama_cpp_does() -> None:
    """Spot checks by family, read off llm_chat_detect_template."""
    expected = {
        "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3", "Qwen-Qwen2.5-7B-Instruct.jinja": "chatml",
        "google-gemma-2-2b-it.jinja": "gemma", "microsoft-Phi-3.5-mini-instruct.jinja": "phi3",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral-v3-tekken",
        "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral-v7", "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek3",
        "ibm-granite-granite-4.0.jinja": "granite-4.0", "ibm-granite-granite-4.1.jinja": "granite-4.1",
        "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite", "openai-gpt-oss-120b.jinja": "gpt-oss",
        "Kimi-K2-Instruct.jinja": "kimi-k2", "GLM-4.6.jinja": "chatglm4", "Cohere2MoE.jinja": "command-r",
        "ByteDance-Seed-OSS.jinja": "seed_oss", "inclusionai-ling-3.0-flash.jinja": "bailing2",
        "upstage-Solar-Open-100B.jinja": "solar-open", "llama-cpp-rwkv-world.jinja": "rwkv-world",
        "unsloth-Apriel-1.5.jinja": "phi3", "Apertus-8B-Instruct.jinja": None, "MiniMax-M2.jinja": None,
    }
    for name, fmt in expected.items():
        assert detect_format((HERE / "templates" / name).read_text(encoding="utf-8")) == fmt, name
