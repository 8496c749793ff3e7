"""A chat template: jinja source parsed once, rendered in the sandbox with HF's variables.

`ChatTemplate.render` is the equivalent of transformers'
`tokenizer.apply_chat_template(messages, tokenize=False, ...)` with the tokenizer's bos/eos
tokens: the same environment (`sandbox.py`), the same message preparation (`messages.py`)
and the same variables (`messages`, `tools`, `documents`, `add_generation_prompt`,
`bos_token`, `eos_token`, then any extra keyword such as `enable_thinking`). Every failure
inside the template (syntax, `raise_exception`, a sandbox refusal, a type error in the
template's own logic) becomes a `ChatTemplateError` naming the template.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import functools

import jinja2
import jinja2.meta
from jinja2.exceptions import SecurityError, TemplateSyntaxError

from llama.chat.errors import ChatTemplateError
from llama.chat.messages import plain_data, prepare_messages
from llama.chat.sandbox import Clock, make_environment


class ChatTemplate:
    """A parsed chat template.

    `clock` feeds `strftime_now` (templates such as Llama 3.x print today's date); pass a
    fixed one for reproducible prompts. `lenient`: render, as llama.cpp does, the templates
    that join an undefined variable to a string, where transformers raises (the chat API
    uses it; the default is transformers' behaviour).
    """

    stop: tuple[str, ...] = ()   # a jinja template adds no stop strings (named_formats' do)

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", name: str | None = None,
                 clock: Clock = datetime.now, lenient: bool = False) -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.name = name
        try:
            self._template = make_environment(clock, lenient).from_string(source)
        except TemplateSyntaxError as exc:
            raise ChatTemplateError(self.label, f"does not parse: {exc.message} (line {exc.lineno})") from exc
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(self.label, f"does not parse: {exc}") from exc

    @functools.cached_property
    def variables(self) -> frozenset[str]:
        """The variables the template's source reads from its context (jinja's undeclared
        variables: the ones it does not set itself)."""
        env = self._template.environment
        return frozenset(jinja2.meta.find_undeclared_variables(env.parse(self.source)))

    @property
    def label(self) -> str:
        """How errors name this template."""
        return self.name or "chat template"

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, documents: Sequence[Mapping[str, Any]] | None = None,
               **kwargs: Any) -> str:
        """The prompt text for `messages`. Extra keywords are template variables
        (`enable_thinking=False`, `date_string=...`); they may override `bos_token` and
        `eos_token`, as in HF where kwargs win over the tokenizer's special tokens."""
        prepared = prepare_messages(messages)  # a TypeError here is the caller's, not the template's
        variables = plain_data({"bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs})
        try:
            return self._template.render(
                messages=prepared,
                tools=plain_data(list(tools)) if tools is not None else None,
                documents=plain_data(list(documents)) if documents is not None else None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except SecurityError as exc:
            raise ChatTemplateError(self.label, f"refused by the sandbox: {exc}") from exc
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(self.label, f"raised: {exc}") from exc
        except Exception as exc:  # untrusted code failing in its own logic, e.g. `1/0`, `None + 'x'`
            raise ChatTemplateError(self.label, f"failed: {type(exc).__name__}: {exc}") from exc

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, {len(self.source)} chars)"
