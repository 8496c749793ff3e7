r"""llama.cpp's built-in named chat formats (`llm_chat_apply_template` in
src/llama-chat.cpp), each written as a small jinja template and rendered by the same
sandboxed `ChatTemplate` as a model's own template.

Why jinja data rather than Python functions: the Llama class then handles one type whatever
the source of the format (a file's template, `chat_template=`, or `chat_format=`), every
format is inspectable and copyable as text (`builtin_template("llama3").source`), and there
is one rendering path to secure and test. Each body is a line-by-line transcription of its
C++ branch, so the two can be read side by side.

Conventions that make the output byte-identical to the C++:
- every tag trims whitespace (`{%- -%}`, `{{- -}}`) and all output is in string literals, so
  the layout of these sources never leaks into the prompt;
- `text(m)` is the message content (a list of `{"type": "text"}` parts is joined; llama.cpp
  only ever sees strings);
- `trim(s)` strips exactly C's `isspace` set (" \t\n\v\f\r"), as llama.cpp's `trim` does;
- `add_generation_prompt` is llama.cpp's `add_ass`, and is ignored where the C++ ignores it
  (mistral-v7, llama2, orion, minicpm, rwkv-world, hunyuan, deepseek-ocr);
- bos/eos tokens are never printed: llama.cpp adds BOS at tokenization, not in the text.

`dots1` has no name in llama.cpp (it is reached only through detection); the name here is ours.
"""
from __future__ import annotations

from llama.chat.template import ChatTemplate

PRELUDE = r"""
{%- macro text(m) -%}
    {%- if m.content is string -%}
        {{- m.content -}}
    {%- elif m.content is defined -%}
        {%- for part in m.content if part.type == 'text' -%}{{- part.text -}}{%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- macro trim(s) -%}{{- s.strip(' \t\n\v\f\r') -}}{%- endmacro -%}
"""


def _generation_prompt(text: str) -> str:
    return "{%- if add_generation_prompt -%}{{- '" + text + "' -}}{%- endif -%}"


def _chatml_like(start: str, sep: str, end: str, prompt: str, *, trimmed: bool = False) -> str:
    """`start + role + sep + content + end` per message, then the generation prompt."""
    content = "trim(text(m))" if trimmed else "text(m)"
    return ("{%- for m in messages -%}{{- '" + start + "' ~ m.role ~ '" + sep + "' ~ " + content + " ~ '" + end
            + "' -}}{%- endfor -%}" + _generation_prompt(prompt))


def _mistral_v1_v3(lead: str, trail: str, trim_assistant: bool) -> str:
    assistant = "trim(text(m))" if trim_assistant else "text(m)"
    return r"""
{%- set ns = namespace(inside=false) -%}
{%- for m in messages -%}
    {%- if not ns.inside -%}{{- '""" + lead + "[INST]" + trail + r"""' -}}{%- set ns.inside = true -%}{%- endif -%}
    {%- if m.role == 'system' -%}{{- text(m) ~ '\n\n' -}}
    {%- elif m.role == 'user' -%}{{- text(m) ~ '""" + lead + r"""[/INST]' -}}
    {%- else -%}{{- '""" + trail + "' ~ " + assistant + r""" ~ '</s>' -}}{%- set ns.inside = false -%}
    {%- endif -%}
{%- endfor -%}
"""


def _mistral_v7(space: str) -> str:
    return r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- '[SYSTEM_PROMPT]""" + space + r"""' ~ text(m) ~ '[/SYSTEM_PROMPT]' -}}
    {%- elif m.role == 'user' -%}{{- '[INST]""" + space + r"""' ~ text(m) ~ '[/INST]' -}}
    {%- else -%}{{- '""" + space + r"""' ~ text(m) ~ '</s>' -}}
    {%- endif -%}
{%- endfor -%}
"""


def _llama2(system: bool, bos_inside: bool, strip: bool) -> str:
    content = "trim(text(m))" if strip else "text(m)"
    system_text = r"'<<SYS>>\n' ~ c ~ '\n<</SYS>>\n\n'" if system else r"c ~ '\n'"
    return r"""
{{- '[INST] ' -}}
{%- set ns = namespace(inside=true) -%}
{%- for m in messages -%}
    {%- set c = """ + content + r""" -%}
    {%- if not ns.inside -%}{%- set ns.inside = true -%}{{- '""" + ("<s>[INST] " if bos_inside else "[INST] ") + r"""' -}}{%- endif -%}
    {%- if m.role == 'system' -%}{{- """ + system_text + r""" -}}
    {%- elif m.role == 'user' -%}{{- c ~ ' [/INST]' -}}
    {%- else -%}{{- c ~ '</s>' -}}{%- set ns.inside = false -%}
    {%- endif -%}
{%- endfor -%}
"""


def _vicuna(orca: bool) -> str:
    system = r"'SYSTEM: ' ~ text(m) ~ '\n'" if orca else r"text(m) ~ '\n\n'"
    return r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- """ + system + r""" -}}
    {%- elif m.role == 'user' -%}{{- 'USER: ' ~ text(m) ~ '\n' -}}
    {%- elif m.role == 'assistant' -%}{{- 'ASSISTANT: ' ~ text(m) ~ '</s>\n' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt("ASSISTANT:")


def _exaone(tool: str | None) -> str:
    tool_branch = (r"{%- elif m.role == 'tool' -%}{{- '" + tool + r"' ~ trim(text(m)) ~ '[|endofturn|]\n' -}}"
                   if tool else "")
    return r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- '[|system|]' ~ trim(text(m)) ~ '[|endofturn|]\n' -}}
    {%- elif m.role == 'user' -%}{{- '[|user|]' ~ trim(text(m)) ~ '\n' -}}
    {%- elif m.role == 'assistant' -%}{{- '[|assistant|]' ~ trim(text(m)) ~ '[|endofturn|]\n' -}}
    """ + tool_branch + r"""
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt("[|assistant|]")


def _granite_4() -> str:
    return r"""
{%- for m in messages -%}
    {%- if m.role == 'assistant_tool_call' -%}{{- '<|start_of_role|>assistant<|end_of_role|><|tool_call|>' -}}
    {%- else -%}{{- '<|start_of_role|>' ~ m.role ~ '<|end_of_role|>' -}}
    {%- endif -%}
    {{- text(m) ~ '<|end_of_text|>\n' -}}
{%- endfor -%}
""" + _generation_prompt("<|start_of_role|>assistant<|end_of_role|>")


def _bailing(think: bool) -> str:
    return r"""
{%- for m in messages -%}
    {{- '<role>' ~ ('HUMAN' if m.role == 'user' else m.role | upper) ~ '</role>' ~ text(m) -}}
{%- endfor -%}
""" + _generation_prompt("<role>ASSISTANT</role>" + ("<think>" if think else ""))


_BODIES: dict[str, str] = {
    "chatml": _chatml_like("<|im_start|>", r"\n", r"<|im_end|>\n", r"<|im_start|>assistant\n"),
    "llama2": _llama2(system=False, bos_inside=False, strip=False),
    "llama2-sys": _llama2(system=True, bos_inside=False, strip=False),
    "llama2-sys-bos": _llama2(system=True, bos_inside=True, strip=False),
    "llama2-sys-strip": _llama2(system=True, bos_inside=False, strip=True),
    "mistral-v1": _mistral_v1_v3(lead=" ", trail=" ", trim_assistant=False),
    "mistral-v3": _mistral_v1_v3(lead="", trail=" ", trim_assistant=True),
    "mistral-v3-tekken": _mistral_v1_v3(lead="", trail="", trim_assistant=False),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": _chatml_like("<|", r"|>\n", r"<|end|>\n", r"<|assistant|>\n"),
    "phi4": _chatml_like("<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _chatml_like("<|", r"|>\n", r"\n", r"<|assistant|>\n"),
    "zephyr": _chatml_like("<|", r"|>\n", r"<|endoftext|>\n", r"<|assistant|>\n"),
    "monarch": r"""
{%- for m in messages -%}
    {{- ('' if loop.first else '<s>') ~ m.role ~ '\n' ~ text(m) ~ '</s>\n' -}}
{%- endfor -%}
""" + _generation_prompt(r"<s>assistant\n"),
    "gemma": r"""
{%- set ns = namespace(system='') -%}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}
        {%- set ns.system = ns.system ~ trim(text(m)) -%}
    {%- else -%}
        {%- set role = 'model' if m.role == 'assistant' else m.role -%}
        {{- '<start_of_turn>' ~ role ~ '\n' -}}
        {%- if ns.system and role != 'model' -%}{{- ns.system ~ '\n\n' -}}{%- set ns.system = '' -%}{%- endif -%}
        {{- trim(text(m)) ~ '<end_of_turn>\n' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt(r"<start_of_turn>model\n"),
    "orion": r"""
{%- set ns = namespace(system='') -%}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}
        {%- set ns.system = ns.system ~ text(m) -%}
    {%- elif m.role == 'user' -%}
        {{- 'Human: ' -}}
        {%- if ns.system -%}{{- ns.system ~ '\n\n' -}}{%- set ns.system = '' -%}{%- endif -%}
        {{- text(m) ~ '\n\nAssistant: </s>' -}}
    {%- else -%}{{- text(m) ~ '</s>' -}}
    {%- endif -%}
{%- endfor -%}
""",
    "openchat": r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- text(m) ~ '<|end_of_turn|>' -}}
    {%- else -%}{{- 'GPT4 Correct ' ~ (m.role[:1] | upper) ~ m.role[1:] ~ ': ' ~ text(m) ~ '<|end_of_turn|>' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt("GPT4 Correct Assistant:"),
    "vicuna": _vicuna(orca=False),
    "vicuna-orca": _vicuna(orca=True),
    "deepseek": r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- text(m) -}}
    {%- elif m.role == 'user' -%}{{- '### Instruction:\n' ~ text(m) ~ '\n' -}}
    {%- elif m.role == 'assistant' -%}{{- '### Response:\n' ~ text(m) ~ '\n<|EOT|>\n' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt(r"### Response:\n"),
    "deepseek2": r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- text(m) ~ '\n\n' -}}
    {%- elif m.role == 'user' -%}{{- 'User: ' ~ text(m) ~ '\n\n' -}}
    {%- elif m.role == 'assistant' -%}{{- 'Assistant: ' ~ text(m) ~ '<｜end▁of▁sentence｜>' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt("Assistant:"),
    "deepseek3": r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- text(m) ~ '\n\n' -}}
    {%- elif m.role == 'user' -%}{{- '<｜User｜>' ~ text(m) -}}
    {%- elif m.role == 'assistant' -%}{{- '<｜Assistant｜>' ~ text(m) ~ '<｜end▁of▁sentence｜>' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt("<｜Assistant｜>"),
    "deepseek-ocr": "{%- for m in messages -%}{{- text(m) -}}{%- endfor -%}",
    "command-r": r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' ~ trim(text(m)) ~ '<|END_OF_TURN_TOKEN|>' -}}
    {%- elif m.role == 'user' -%}{{- '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' ~ trim(text(m)) ~ '<|END_OF_TURN_TOKEN|>' -}}
    {%- elif m.role == 'assistant' -%}{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' ~ trim(text(m)) ~ '<|END_OF_TURN_TOKEN|>' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    "llama3": _chatml_like("<|start_header_id|>", r"<|end_header_id|>\n\n", "<|eot_id|>",
                           r"<|start_header_id|>assistant<|end_header_id|>\n\n", trimmed=True),
    "chatglm3": "{{- '[gMASK]sop' -}}" + _chatml_like("<|", r"|>\n ", "", "<|assistant|>"),
    "chatglm4": "{{- '[gMASK]<sop>' -}}" + _chatml_like("<|", r"|>\n", "", r"<|assistant|>\n"),
    "glmedge": _chatml_like("<|", r"|>\n", "", "<|assistant|>"),
    "minicpm": r"""
{%- for m in messages -%}
    {%- if m.role == 'user' -%}{{- '<用户>' ~ trim(text(m)) ~ '<AI>' -}}
    {%- else -%}{{- trim(text(m)) -}}
    {%- endif -%}
{%- endfor -%}
""",
    "exaone3": _exaone(tool=None),
    "exaone4": _exaone(tool="[|tool|]"),
    "exaone-moe": r"""
{%- for m in messages -%}
    {%- if m.role in ('system', 'user', 'assistant', 'tool') -%}
        {{- '<|' ~ m.role ~ '|>\n' ~ trim(text(m)) ~ '<|endofturn|>\n' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt(r"<|assistant|>\n"),
    "rwkv-world": r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- 'System: ' ~ trim(text(m)) ~ '\n\n' -}}
    {%- elif m.role == 'user' -%}
        {{- 'User: ' ~ trim(text(m)) ~ '\n\n' -}}
        {%- if loop.last -%}{{- 'Assistant:' -}}{%- endif -%}
    {%- elif m.role == 'assistant' -%}{{- 'Assistant: ' ~ trim(text(m)) ~ '\n\n' -}}
    {%- endif -%}
{%- endfor -%}
""",
    "granite": r"""
{%- for m in messages -%}
    {{- '<|start_of_role|>' ~ m.role ~ '<|end_of_role|>' -}}
    {%- if m.role == 'assistant_tool_call' -%}{{- '<|tool_call|>' -}}{%- endif -%}
    {{- text(m) ~ '<|end_of_text|>\n' -}}
{%- endfor -%}
""" + _generation_prompt("<|start_of_role|>assistant<|end_of_role|>"),
    "granite-4.0": _granite_4(),
    "granite-4.1": _granite_4(),
    "gigachat": r"""
{%- set has_system = messages and messages[0].role == 'system' -%}
{{- '<s>' ~ (text(messages[0]) ~ '<|message_sep|>' if has_system else '') -}}
{%- for m in messages -%}
    {%- if loop.first and has_system -%}
    {%- elif m.role == 'user' -%}
        {{- 'user<|role_sep|>' ~ text(m) ~ '<|message_sep|>available functions<|role_sep|>[]<|message_sep|>' -}}
    {%- elif m.role == 'assistant' -%}{{- 'assistant<|role_sep|>' ~ text(m) ~ '<|message_sep|>' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt("assistant<|role_sep|>"),
    "megrez": _chatml_like("<|role_start|>", "<|role_end|>", "<|turn_end|>", "<|role_start|>assistant<|role_end|>"),
    "yandex": r"""
{%- for m in messages -%}
    {%- if m.role == 'user' -%}{{- ' Пользователь: ' ~ text(m) ~ '\n\n' -}}
    {%- elif m.role == 'assistant' -%}{{- ' Ассистент: ' ~ text(m) ~ '\n\n' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt(" Ассистент:[SEP]"),
    "bailing": _bailing(think=False),
    "bailing-think": _bailing(think=True),
    "bailing2": r"""
{%- if not (messages and messages[0].role == 'system') -%}
    {{- '<role>SYSTEM</role>detailed thinking off<|role_end|>' -}}
{%- endif -%}
{%- for m in messages -%}
    {{- '<role>' ~ ('HUMAN' if m.role == 'user' else m.role | upper) ~ '</role>' ~ text(m) ~ '<|role_end|>' -}}
{%- endfor -%}
""" + _generation_prompt("<role>ASSISTANT</role>"),
    "llama4": _chatml_like("<|header_start|>", r"<|header_end|>\n\n", "<|eot|>",
                           r"<|header_start|>assistant<|header_end|>\n\n", trimmed=True),
    "smolvlm": r"""
{{- '<|im_start|>' -}}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- text(m) ~ '\n\n' -}}
    {%- elif m.role == 'user' -%}{{- 'User: ' ~ text(m) ~ '<end_of_utterance>\n' -}}
    {%- else -%}{{- 'Assistant: ' ~ text(m) ~ '<end_of_utterance>\n' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt("Assistant:"),
    "dots1": r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- '<|system|>' ~ text(m) ~ '<|endofsystem|>' -}}
    {%- elif m.role == 'user' -%}{{- '<|userprompt|>' ~ text(m) ~ '<|endofuserprompt|>' -}}
    {%- else -%}{{- '<|response|>' ~ text(m) ~ '<|endofresponse|>' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt("<|response|>"),
    "hunyuan-moe": r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- '<|startoftext|>' ~ text(m) ~ '<|extra_4|>' -}}
    {%- elif m.role == 'assistant' -%}{{- text(m) ~ '<|eos|>' -}}
    {%- else -%}{{- '<|startoftext|>' ~ text(m) ~ '<|extra_0|>' -}}
    {%- endif -%}
{%- endfor -%}
""",
    "gpt-oss": r"""
{%- for m in messages -%}
    {{- '<|start|>' ~ m.role ~ '<|message|>' ~ text(m) ~ ('<|return|>' if m.role == 'assistant' else '<|end|>') -}}
{%- endfor -%}
""" + _generation_prompt("<|start|>assistant"),
    "hunyuan-dense": r"""
{%- for m in messages -%}
    {%- if loop.first and m.role == 'system' -%}{{- text(m) ~ '<｜hy_place▁holder▁no▁3｜>' -}}{%- endif -%}
    {%- if m.role == 'assistant' -%}{{- '<｜hy_Assistant｜>' ~ text(m) ~ '<｜hy_place▁holder▁no▁2｜>' -}}
    {%- elif m.role == 'user' -%}{{- '<｜hy_User｜>' ~ text(m) ~ '<｜hy_Assistant｜>' -}}
    {%- endif -%}
{%- endfor -%}
""",
    "hunyuan-vl": r"""
{{- '<｜hy_begin▁of▁sentence｜>' -}}
{%- for m in messages -%}
    {%- if loop.first and m.role == 'system' -%}{{- text(m) ~ '<｜hy_place▁holder▁no▁3｜>' -}}
    {%- elif m.role == 'user' -%}{{- text(m) ~ '<｜hy_User｜>' -}}
    {%- elif m.role == 'assistant' -%}{{- text(m) ~ '<｜hy_Assistant｜>' -}}
    {%- endif -%}
{%- endfor -%}
""",
    "kimi-k2": r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- '<|im_system|>system<|im_middle|>' -}}
    {%- elif m.role == 'user' -%}{{- '<|im_user|>user<|im_middle|>' -}}
    {%- elif m.role == 'assistant' -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}
    {%- elif m.role == 'tool' -%}{{- '<|im_system|>tool<|im_middle|>' -}}
    {%- endif -%}
    {{- text(m) ~ '<|im_end|>' -}}
{%- endfor -%}
""" + _generation_prompt("<|im_assistant|>assistant<|im_middle|>"),
    "seed_oss": r"""
{%- for m in messages -%}
    {{- '<seed:bos>' ~ m.role ~ '\n' ~ (trim(text(m)) if m.role == 'assistant' else text(m)) ~ '<seed:eos>' -}}
{%- endfor -%}
""" + _generation_prompt(r"<seed:bos>assistant\n"),
    "grok-2": r"""
{%- for m in messages -%}
    {%- if m.role == 'system' -%}{{- 'System: ' ~ trim(text(m)) ~ '<|separator|>\n\n' -}}
    {%- elif m.role == 'user' -%}{{- 'Human: ' ~ trim(text(m)) ~ '<|separator|>\n\n' -}}
    {%- elif m.role == 'assistant' -%}{{- 'Assistant: ' ~ text(m) ~ '<|separator|>\n\n' -}}
    {%- endif -%}
{%- endfor -%}
""" + _generation_prompt("Assistant:"),
    "pangu-embedded": r"""
{%- set labels = {'system': '系统', 'user': '用户', 'assistant': '助手', 'tool': '工具', 'function': '方法'} -%}
{%- for m in messages -%}
    {%- if loop.first and m.role != 'system' -%}{{- '[unused9]系统：[unused10]' -}}{%- endif -%}
    {%- if m.role in labels -%}{{- '[unused9]' ~ labels[m.role] ~ '：' ~ text(m) ~ '[unused10]' -}}{%- endif -%}
{%- endfor -%}
""" + _generation_prompt("[unused9]助手："),
    "solar-open": _chatml_like("<|begin|>", "<|content|>", "<|end|>", "<|begin|>assistant"),
}

BUILTIN_FORMATS: tuple[str, ...] = tuple(sorted(_BODIES))
"""The names `chat_format=` accepts: llama.cpp's `llama_chat_builtin_templates()`, plus `dots1`."""


def builtin_source(name: str) -> str:
    """The jinja source of a built-in format."""
    try:
        return PRELUDE + _BODIES[name]
    except KeyError:
        raise ValueError(f"unknown chat format {name!r}; known formats: {', '.join(BUILTIN_FORMATS)}") from None


def builtin_template(name: str) -> ChatTemplate:
    """A built-in format as a ChatTemplate (it prints no bos/eos, so none are needed)."""
    return ChatTemplate(builtin_source(name), name=f"chat format {name!r}")
