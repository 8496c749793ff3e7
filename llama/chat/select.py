"""Which chat template a model uses: the rule the Llama class applies.

In order: an explicit `chat_template` source; else `chat_format`: one of llama-cpp-python's
format names (`llama-2`, `chatml`, `zephyr`, ...: its prompts, named_formats.py, since the
keyword is its), else one of llama.cpp's built-in names (`llama2`, `mistral-v7`, ...; the
server and the CLI pass llama.cpp's names as template sources instead, so their `zephyr` is
llama.cpp's), else the name of one of the file's named templates
(`tokenizer.chat_template.<name>`, e.g. `tool_use`); else the file's
`tokenizer.chat_template`; else chatml, llama.cpp's default.

A file's template is always rendered by jinja, even when `detect_format` recognises it as
a built-in (llama.cpp's `--jinja` behaviour): the model author's template is the
specification, while the built-ins are approximations (they ignore tools, and most ignore
their own system-message rules). Asking for the built-in is one `chat_format=` away.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llama.chat.builtin import BUILTIN_FORMATS, builtin_source
from llama.chat.named_formats import FORMATS, HANDLERS_NOT_PROVIDED, FormatTemplate
from llama.chat.template import ChatTemplate

TEMPLATE_KEY = "tokenizer.chat_template"
DEFAULT_FORMAT = "chatml"


def named_templates(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The file's extra templates, `tokenizer.chat_template.<name>` -> source, by name."""
    prefix = TEMPLATE_KEY + "."
    return {key[len(prefix):]: value for key, value in metadata.items()
            if key.startswith(prefix) and isinstance(value, str)}


def select_template(metadata: Mapping[str, Any], *, chat_format: str | None = None,
                    chat_template: str | None = None, bos_token: str = "",
                    eos_token: str = "", lenient: bool = False) -> ChatTemplate | FormatTemplate:
    """The ChatTemplate for a model with GGUF `metadata` (parsed now; a template that does
    not parse raises ChatTemplateError here, one that misbehaves raises it when rendered).
    `lenient`: see ChatTemplate."""
    tokens = {"bos_token": bos_token, "eos_token": eos_token, "lenient": lenient}
    if chat_template is not None:
        return ChatTemplate(chat_template, name="chat_template argument", **tokens)
    if chat_format is not None:
        named = named_templates(metadata)
        if chat_format in FORMATS:
            return FormatTemplate(chat_format)
        if chat_format in HANDLERS_NOT_PROVIDED:
            raise ValueError(f"chat_format {chat_format!r} is a llama-cpp-python chat handler with "
                             "tool-calling logic of its own, which ggmlpy does not have; pass tools "
                             "with the model's own template instead")
        if chat_format in BUILTIN_FORMATS:
            return ChatTemplate(builtin_source(chat_format), name=f"chat format {chat_format!r}", **tokens)
        if chat_format in named:
            return ChatTemplate(named[chat_format], name=f"{TEMPLATE_KEY}.{chat_format}", **tokens)
        known = list(FORMATS) + list(BUILTIN_FORMATS) + [f"{name} (from the file)" for name in sorted(named)]
        raise ValueError(f"unknown chat_format {chat_format!r}; known: {', '.join(known)}")
    source = metadata.get(TEMPLATE_KEY)
    if isinstance(source, str):
        return ChatTemplate(source, name=TEMPLATE_KEY, **tokens)
    return ChatTemplate(builtin_source(DEFAULT_FORMAT), name=f"chat format {DEFAULT_FORMAT!r} (default)", **tokens)
