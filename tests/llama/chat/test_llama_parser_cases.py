"""llama.cpp's own chat-parser cases (its tests/test-chat.cpp), run against ggmlpy.

Each case of parser_cases/test_chat.jsonl (written by llama.cpp's test binary, see
make_cases.sh) gives a real template, the request (messages, tools, tool_choice,
enable_thinking, reasoning_format, a continued message), a model output, and the message
llama.cpp parses out of it. ggmlpy renders the prompt with the same template, reads the
output as a chat completion reads it (`reply_reader`, `ReplyStream`), and must give the same
content, reasoning_content and tool calls (content and reasoning compared trimmed, arguments
as JSON values, ids where llama.cpp's parse has one, all as llama.cpp's test compares them).
Streamed one character at a time, the same output must add up to the same message. The prompt
must end with llama.cpp's generation prompt for the request (a continued message's included).

Cases ggmlpy does not pass yet are listed in parser_cases/known_failures.json with the
reason; they run as strict xfails, so one that starts passing must be taken off the list.
"""
from __future__ import annotations

import json
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest

from llama.api.chat_completion import ChatSetup, reply_reader
from llama.api.chat_prompt import ChatPrompt, chat_prompt
from llama.chat import ChatTemplate
from llama.chat.reply import assemble_message, parse_reply

HERE = Path(__file__).resolve().parent
CASES_DIR = HERE / "parser_cases"


def _load_cases() -> list[dict]:
    cases, seen = [], Counter()
    for line in (CASES_DIR / "test_chat.jsonl").read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        stem = case["template"].removesuffix(".jinja")
        case["id"] = f"{stem}-{seen[stem]}"
        seen[stem] += 1
        cases.append(case)
    return cases


CASES = _load_cases()
# the case's continuation -> the request's continue_final_message, as llama-server reads it
CONTINUATION = {"none": None, "content": "content", "reasoning": "reasoning_content"}
KNOWN = json.loads((CASES_DIR / "known_failures.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def _setup(template: str) -> ChatSetup:
    source = (HERE / "templates" / template).read_text(encoding="utf-8")
    return ChatSetup.for_template(ChatTemplate(source, name=template, lenient=True))


def _prompt(case: dict) -> ChatPrompt:
    """The prompt a chat completion would render for this case's request."""
    return chat_prompt(_setup(case["template"]), case["messages"], tools=case["tools"] or None,
                       reasoning="on" if case["enable_thinking"] else "off",
                       add_generation_prompt=case["add_generation_prompt"],
                       continue_final_message=CONTINUATION[case["continue_final_message"]])


def _read(case: dict):
    """The reply reader a chat completion would use for this case's request."""
    tools = case["tools"] or None
    choice = case["tool_choice"] if tools else "none"
    return reply_reader(_setup(case["template"]), _prompt(case), tools, choice, case["reasoning_format"],
                        case["parallel_tool_calls"], json_answer=bool(case["json_schema"]))


def _args(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _comparable(message: dict, ids: list[str] | None = None) -> dict:
    """The parts of a message llama.cpp's test compares, in the form it compares them."""
    calls = message.get("tool_calls") or []
    return {
        "content": (message.get("content") or "").strip(),
        "reasoning_content": (message.get("reasoning_content") or "").strip(),
        "tool_calls": [{"name": c["function"]["name"], "arguments": _args(c["function"]["arguments"]),
                        **({"id": c.get("id")} if ids and ids[i] else {})}
                       for i, c in enumerate(calls)],
    }


def _outcome(case: dict) -> tuple[dict, dict, dict]:
    """(expected, ggmlpy's parse, ggmlpy's stream one character at a time), comparable."""
    reader = _read(case)
    ids = case["expect_tool_call_ids"]
    if case["is_partial"]:   # llama.cpp parses a cut-off output: what a stream has settled so far
        whole = assemble_message(reader.stream().feed(case["input"]))
    else:
        whole = parse_reply(case["input"], reader)
    stream = reader.stream()
    deltas = [d for ch in case["input"] for d in stream.feed(ch)]
    if not case["is_partial"]:
        deltas += stream.finish()
    return _comparable(case["expect"], ids), _comparable(whole, ids), _comparable(assemble_message(deltas), ids)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_llama_cpp_parser_case(case: dict) -> None:
    if case["id"] in KNOWN:
        pytest.xfail(KNOWN[case["id"]])
    expected, whole, streamed = _outcome(case)
    assert whole == expected
    assert streamed == whole


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_the_prompt_ends_with_llama_cpps_generation_prompt(case: dict) -> None:
    """The prompt ends as llama.cpp's does: its generation prompt, which for a continued message
    holds the message written with the template's thinking markers, whitespace and all."""
    assert _prompt(case).text.endswith(case["generation_prompt"])


def format_counts() -> dict[str, tuple[int, int, int]]:
    """(templates, cases, cases passed) per tool-call format, the format of each template as
    ggmlpy detects it (the table in the README)."""
    templates: dict[str, set] = {}
    cases: Counter = Counter()
    passed: Counter = Counter()
    for case in CASES:
        fmt = _setup(case["template"]).tool_format
        templates.setdefault(fmt, set()).add(case["template"])
        cases[fmt] += 1
        passed[fmt] += case["id"] not in KNOWN
    return {fmt: (len(templates[fmt]), cases[fmt], passed[fmt]) for fmt in sorted(cases)}


def test_the_readme_reports_the_count_per_format() -> None:
    readme = (HERE.parents[2] / "README.md").read_text(encoding="utf-8")
    for fmt, (n_templates, n_cases, n_passed) in format_counts().items():
        assert f"| `{fmt}` | {n_templates} | {n_passed} of {n_cases} |" in readme, fmt
    total = len(CASES) - len(KNOWN)
    assert (f"{total} of {len(CASES)} cases" if KNOWN else f"all {len(CASES)} cases") in readme


def test_known_failures_are_cases_and_still_fail() -> None:
    """The list names real cases, and each still fails (a fixed one must leave the list)."""
    by_id = {c["id"]: c for c in CASES}
    assert set(KNOWN) <= set(by_id)
    fixed = []
    for case_id in KNOWN:
        try:
            expected, whole, streamed = _outcome(by_id[case_id])
        except Exception:  # noqa: BLE001 - a case that raises still fails
            continue
        if whole == expected and streamed == whole:
            fixed.append(case_id)
    assert fixed == []
