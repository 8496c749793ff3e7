"""Which llama.cpp built-in format a template is: `llm_chat_detect_template` from
src/llama-chat.cpp, rule for rule and in the same order (order matters: the first match
wins, and several rules overlap).

llama.cpp uses this to pick a C++ formatter for a file's jinja template when jinja is off;
here it is informational (the file's template is rendered by jinja, see `select.py`), and
lets callers and tests see which built-in a template resembles.
"""
from __future__ import annotations

from collections.abc import Callable

from llama.chat.builtin import BUILTIN_FORMATS

Rule = Callable[[Callable[[str], bool]], str | None]


def _mistral_or_llama2(has: Callable[[str], bool]) -> str:
    if has("[SYSTEM_PROMPT]"):
        return "mistral-v7"
    if has("' [INST] ' + system_message") or has("[AVAILABLE_TOOLS]"):
        if has(" [INST]"):
            return "mistral-v1"
        if has('"[INST]"'):
            return "mistral-v3-tekken"
        return "mistral-v3"
    if has("content.strip()"):
        return "llama2-sys-strip"
    if has("bos_token + '[INST]"):
        return "llama2-sys-bos"
    if has("<<SYS>>"):
        return "llama2-sys"
    return "llama2"


def _granite(has: Callable[[str], bool]) -> str:
    if has("<tool_call>") or has("<tools>"):
        return "granite-4.0" if has("g4_default_system_message") else "granite-4.1"
    return "granite"


def _all(*needles: str) -> Callable[[Callable[[str], bool]], bool]:
    return lambda has: all(has(n) for n in needles)


# (condition, format or function of `has` giving the format), in llama.cpp's order.
_RULES: list[tuple[Callable[[Callable[[str], bool]], bool], str | Rule]] = [
    (_all("<|im_start|>"), lambda has: "phi4" if has("<|im_sep|>")
        else "smolvlm" if has("<end_of_utterance>") else "chatml"),
    # `tmpl.find("mistral") == 0` is handled in detect_format (it is a prefix test)
    (_all("[INST]"), _mistral_or_llama2),
    (_all("<|assistant|>", "<|end|>"), "phi3"),
    (_all("[gMASK]<sop>"), "chatglm4"),
    (_all("<|assistant|>", "<|user|>"), lambda has: "exaone-moe" if has("<|tool_declare|>")
        else "falcon3" if has("</s>") else "glmedge"),
    (_all("<|{{ item['role'] }}|>", "<|begin_of_image|>"), "glmedge"),
    (_all("<|user|>", "<|endoftext|>"), "zephyr"),
    (_all("bos_token + message['role']"), "monarch"),
    (_all("<start_of_turn>"), "gemma"),
    (_all("'\\n\\nAssistant: ' + eos_token"), "orion"),
    (_all("GPT4 Correct "), "openchat"),
    (_all("USER: ", "ASSISTANT: "), lambda has: "vicuna-orca" if has("SYSTEM: ") else "vicuna"),
    (_all("### Instruction:", "<|EOT|>"), "deepseek"),
    (_all("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"), "command-r"),
    (_all("<|start_header_id|>", "<|end_header_id|>"), "llama3"),
    (_all("[gMASK]sop"), "chatglm3"),
    (_all("<用户>"), "minicpm"),
    (_all("'Assistant: ' + message['content'] + eos_token"), "deepseek2"),
    (_all("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"), "deepseek3"),
    (_all("[|system|]", "[|assistant|]", "[|endofturn|]"), lambda has: "exaone4" if has("[|tool|]") else "exaone3"),
    (lambda has: has("rwkv-world") or has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"), "rwkv-world"),
    (_all("<|start_of_role|>"), _granite),
    (_all("message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]"),
     "gigachat"),
    (_all("<|role_start|>"), "megrez"),
    (_all(" Ассистент:"), "yandex"),
    (_all("<role>ASSISTANT</role>", "'HUMAN'"), "bailing"),
    (_all("<role>ASSISTANT</role>", '"HUMAN"', "<think>"), "bailing-think"),
    (_all("<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"), "bailing2"),
    (_all("<|header_start|>", "<|header_end|>"), "llama4"),
    (_all("<|endofuserprompt|>"), "dots1"),
    (_all("<|extra_0|>", "<|extra_4|>"), "hunyuan-moe"),
    (_all("<|start|>", "<|channel|>"), "gpt-oss"),
    (_all("<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"), "hunyuan-vl"),
    (_all("<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"), "hunyuan-dense"),
    (_all("<|im_assistant|>assistant<|im_middle|>"), "kimi-k2"),
    (_all("<seed:bos>"), "seed_oss"),
    (_all("'Assistant: '  + message['content'] + '<|separator|>"), "grok-2"),
    (_all("[unused9]系统：[unused10]"), "pangu-embedded"),
    (_all("<|begin|>", "<|end|>", "<|content|>"), "solar-open"),
]


def detect_format(source: str) -> str | None:
    """The built-in format llama.cpp would use for `source` (a template, or a format name),
    or None where llama.cpp answers LLM_CHAT_TEMPLATE_UNKNOWN."""
    if source in BUILTIN_FORMATS and source != "dots1":  # dots1 has no name in llama.cpp
        return source

    def has(needle: str) -> bool:
        return needle in source

    if source.startswith("mistral") and not has("<|im_start|>"):
        return _mistral_or_llama2(has)
    for condition, result in _RULES:
        if condition(has):
            return result if isinstance(result, str) else result(has)
    return None
