"""Generate tests/llama/chat/expected/*.json: what Hugging Face transformers renders for each real
template in tests/llama/chat/templates/ and each conversation below.

Run once, with a Python that has transformers (no torch needed):

    /tmp/hfenv/bin/python tests/llama/chat/make_expected.py

The renderer is `transformers.utils.chat_template_utils.render_jinja_template`, called the
way `apply_chat_template(tokenize=False)` calls it (messages normalised by
`_normalize_chat_messages`, special tokens as keyword variables). Each case stores its
inputs next to the expected text (or the error transformers raised), so the test needs only
the JSON.

Dates: `strftime_now` reads `datetime.now()` in transformers; here the module's `datetime`
is replaced by one whose `now()` is FROZEN_NOW, and the test gives ChatTemplate a clock
returning the same instant. Templates that take `date_string` get it from the case kwargs.
"""
from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path

import transformers
from transformers.utils import chat_template_utils as ctu

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
EXPECTED = HERE / "expected"
FROZEN_NOW = "2025-03-14T09:26:53"


class _FrozenDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):  # noqa: D102 - stand-in for datetime.now
        return _dt.datetime.fromisoformat(FROZEN_NOW)


# (substring of the file name, bos, eos): the model's real special tokens where known.
SPECIAL_TOKENS = [
    ("Llama-3", "<|begin_of_text|>", "<|eot_id|>"),
    ("llama-3", "<|begin_of_text|>", "<|eot_id|>"),
    ("Hermes", "<|begin_of_text|>", "<|eot_id|>"),
    ("Qwen", "", "<|im_end|>"),
    ("DeepSeek-R1-Distill-Qwen", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("deepseek", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("gemma", "<bos>", "<eos>"),
    ("Phi", "<s>", "<|endoftext|>"),
    ("granite", "", "<|end_of_text|>"),
    ("CohereForAI", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    ("Cohere2", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    ("SmolLM3", "", "<|im_end|>"),
    ("gpt-oss", "<|startoftext|>", "<|return|>"),
    ("GLM", "[gMASK]<sop>", "<|endoftext|>"),
    ("Kimi", "[BOS]", "[EOS]"),
]
DEFAULT_TOKENS = ("<s>", "</s>")

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city <fast & \"free\">",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Київ"},
                "unit": {"type": "string", "description": "Temperature unit", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}]

# Mistral's templates insist on 9-character alphanumeric call ids.
TOOL_CALL = {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
               "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CASES = [
    {"name": "system_user", "messages": [SYSTEM, {"role": "user", "content": "Hello!"}],
     "add_generation_prompt": True},
    {"name": "user_only", "messages": [{"role": "user", "content": "What is 2+2?"}],
     "add_generation_prompt": True},
    {"name": "multi_turn", "messages": [
        SYSTEM,
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "I am an assistant."},
        {"role": "user", "content": "  Tell me a joke.  "}],
     "add_generation_prompt": True},
    {"name": "no_generation_prompt", "messages": [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi!"}],
     "add_generation_prompt": False},
    {"name": "special_text", "messages": [
        {"role": "system", "content": "Відповідай українською. 日本語もOK. <&\"'>"},
        {"role": "user", "content": "Є питання: a < b && c > \"d\"? — ‘ü’ 🙂\nsecond line"}],
     "add_generation_prompt": True},
    {"name": "content_parts", "messages": [
        SYSTEM,
        {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}]}],
     "add_generation_prompt": True},
    {"name": "tools", "tools": TOOLS, "messages": [
        SYSTEM,
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
        TOOL_RESULT],
     "add_generation_prompt": True},
    {"name": "tools_null_content", "tools": TOOLS, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        TOOL_RESULT,
        {"role": "assistant", "content": "It is 21 °C & clear."}],
     "add_generation_prompt": False},
    {"name": "tools_offered", "tools": TOOLS, "messages": [{"role": "user", "content": "Weather in Київ?"}],
     "add_generation_prompt": True},
    {"name": "reasoning_kwargs", "kwargs": {"enable_thinking": False, "date_string": "14 Mar 2025"},
     "messages": [
         {"role": "user", "content": "Think first: 3*7?"},
         {"role": "assistant", "content": "21", "reasoning_content": "3 times 7 is 21."},
         {"role": "user", "content": "And 3*8?"}],
     "add_generation_prompt": True},
]


# Small templates, one per extra that HF's environment gives templates, rendered with
# USER_HI (and the case's kwargs): tests/llama/chat/expected/_features.json.
USER_HI = [{"role": "user", "content": "hi <&>"}]
FEATURES = {
    "tojson_plain": "{{ messages | tojson }}",
    "tojson_indent_sorted": "{{ {'b': 'ü<', 'a': [1, 2.5, none, true]} | tojson(indent=2, sort_keys=true) }}",
    "tojson_separators_ascii": "{{ {'k': 'é', 'n': 1} | tojson(separators=(',', ':'), ensure_ascii=true) }}",
    "tojson_tools": "{{ tools | tojson(indent=4) }}",
    "strftime_now": "{{ strftime_now('%Y-%m-%d %H:%M:%S %d %b %Y %A') }}",
    "date_string_default": "{% if date_string is not defined %}{% set date_string = strftime_now('%d %b %Y') %}"
                           "{% endif %}{{ date_string }}",
    "bos_eos": "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}",
    "tools_documents_undefined": "{{ tools is none }} {{ documents is none }} {{ foo is defined }}",
    "raise_exception": "{{ raise_exception('Only user messages, please: ' ~ messages[0].role) }}",
    "namespace": "{% set ns = namespace(n=0, last='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                 "{% set ns.last = m.role %}{% endfor %}{{ ns.n }} {{ ns.last }}",
    "namespace_underscore": "{% set ns = namespace(_x=1) %}{{ ns._x }}",
    "dict_global": "{{ dict(a=1, b='x') | tojson }} {{ dict.fromkeys(['p', 'q'], 0) | tojson }}",
    "generation_block": "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}",
    "loopcontrols": "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}"
                    "{% endif %}{{ i }}{% endfor %}",
    "trim_lstrip_blocks": "  {% if true %}\n    yes\n  {% endif %}\n{{ 'end' }}",
    "kwargs": "{{ enable_thinking }} {{ custom_list | join(',') }}",
    "kwargs_override_bos": "{{ bos_token }}",
    "none_keys_dropped": "{% for m in messages %}{{ m.role }}:{{ m.content is defined }};{% endfor %}",
    "reasoning_alias": "{% for m in messages %}{{ m.reasoning_content }}/{{ m.thinking }}/{{ m.reasoning }};"
                       "{% endfor %}",
    "content_parts": "{% for m in messages %}{% for p in m.content %}{{ p.type }}={{ p.text }};{% endfor %}"
                     "{% endfor %}",
    "syntax_error": "{% for m in messages %}{{ m.content }",
    "undefined_call": "{{ missing_function() }}",
    "string_methods": "{{ messages[0].content.upper() }} {{ '  x '.strip() }} {{ 'a,b'.split(',') }} "
                      "{{ 'abc'.startswith('a') }} {{ 'x'.replace('x', 'y') }}",
    "unsafe_list_append": "{% set xs = [] %}{{ xs.append(1) }}{{ xs }}",
    "unsafe_dict_update": "{% set d = {} %}{{ d.update({'a': 1}) }}{{ d }}",
}
FEATURE_CASES = {
    "tojson_tools": {"tools": TOOLS},
    "bos_eos": {"bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": False},
    "kwargs": {"kwargs": {"enable_thinking": False, "custom_list": ["a", "b"]}},
    "kwargs_override_bos": {"kwargs": {"bos_token": "<override>"}},
    "none_keys_dropped": {"messages": [{"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                                       {"role": "user", "content": "x"}]},
    "reasoning_alias": {"messages": [{"role": "assistant", "content": "a", "reasoning_content": "r1"},
                                     {"role": "assistant", "content": "b", "thinking": "r2"},
                                     {"role": "assistant", "content": "c", "reasoning": "r3"},
                                     {"role": "assistant", "content": "d"}]},
    "content_parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                {"type": "image", "url": "u"}]}]},
}


def special_tokens(file_name: str) -> tuple[str, str]:
    for part, bos, eos in SPECIAL_TOKENS:
        if part in file_name:
            return bos, eos
    return DEFAULT_TOKENS


def render(source: str, case: dict, bos: str, eos: str) -> dict:
    messages = ctu._normalize_chat_messages(case["messages"])
    kwargs = {"bos_token": bos, "eos_token": eos, **case.get("kwargs", {})}
    try:
        rendered, _ = ctu.render_jinja_template(
            conversations=[messages], tools=case.get("tools"), chat_template=source,
            add_generation_prompt=case["add_generation_prompt"], **kwargs)
    except Exception as exc:  # recorded: the test asserts ChatTemplateError for these
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"expected": rendered[0]}


def main() -> None:
    ctu.datetime = _FrozenDatetime
    EXPECTED.mkdir(exist_ok=True)
    for path in sorted(TEMPLATES.glob("*.jinja")):
        source = path.read_text(encoding="utf-8")
        bos, eos = special_tokens(path.name)
        cases = [{**case, **render(source, case, bos, eos)} for case in CASES]
        data = {"template": path.name, "bos_token": bos, "eos_token": eos, "now": FROZEN_NOW,
                "generator": f"transformers {transformers.__version__} render_jinja_template", "cases": cases}
        out = EXPECTED / (path.stem + ".json")
        out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        errors = sum("error" in c for c in cases)
        print(f"{path.name}: {len(cases)} cases, {errors} errors", file=sys.stderr)
    features = []
    for name, source in FEATURES.items():
        case = {"name": name, "source": source, "messages": USER_HI, "add_generation_prompt": True,
                "bos_token": "<BOS>", "eos_token": "<EOS>", "kwargs": {}, **FEATURE_CASES.get(name, {})}
        features.append({**case, **render(source, case, case["bos_token"], case["eos_token"])})
    data = {"now": FROZEN_NOW, "generator": f"transformers {transformers.__version__} render_jinja_template",
            "cases": features}
    (EXPECTED / "_features.json").write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
