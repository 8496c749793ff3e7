"""llama-cpp-python's named chat formats against that library's own renderings
(expected/_llama_cpp_python_formats.json, made by make_named_formats_expected.py), and their
use through `Llama(chat_format=...)`: the prompt and the format's stop strings."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from llama.chat.named_formats import FORMATS, FormatTemplate, render

EXPECTED = json.loads((Path(__file__).parent / "expected" / "_llama_cpp_python_formats.json").read_text(encoding="utf-8"))
RECORDS = EXPECTED["records"]


def test_every_format_is_recorded():
    assert {r["format"] for r in RECORDS} == set(FORMATS)


@pytest.mark.parametrize("record", RECORDS, ids=[f"{r['format']}-{r['case']}" for r in RECORDS])
def test_prompt_and_stop_are_llama_cpp_pythons(record):
    template = FormatTemplate(record["format"])
    assert render(FORMATS[record["format"]], record["messages"]) == record["prompt"]
    assert template.render(record["messages"], add_generation_prompt=True) == record["prompt"]
    assert list(template.stop) == record["stop"]


def test_chat_format_reaches_the_prompt_and_the_stop_list(smollm2_path):
    """`chat_format="zephyr"`: the prompt is the format's and its stop string "</s>" ends the
    reply (llama-cpp-python adds a format's stop strings to the request's)."""
    from llama import Llama
    llm = Llama(str(smollm2_path), n_ctx=512, n_threads=2, chat_format="zephyr", verbose=False)
    record = next(r for r in RECORDS if r["format"] == "zephyr" and r["case"] == "one_user")
    msgs = record["messages"]
    assert llm.apply_chat_template(msgs) == record["prompt"]
    forced = llm.tokenize(b" hi</s> more", add_bos=False)
    n_prompt = len(llm.tokenize(record["prompt"].encode(), special=True))

    def script(input_ids, scores):
        k = len(input_ids) - n_prompt
        out = scores * 0 - float("inf")
        out[forced[k] if k < len(forced) else llm.token_eos()] = 0.0
        return out
    out = llm.create_chat_completion(msgs, max_tokens=10, temperature=0, logits_processor=[script])
    assert out["choices"][0]["message"]["content"] == " hi"
    assert out["choices"][0]["finish_reason"] == "stop"
