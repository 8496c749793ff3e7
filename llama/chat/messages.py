"""Turn caller messages into what a template may see, as transformers'
`apply_chat_template` does before rendering.

Three steps, each a guard HF added after real templates broke on real inputs:
1. keys whose value is None are dropped (OpenAI clients send `content=None` next to
   `tool_calls`; templates test `message.content is defined`, not `is none`);
2. everything is rebuilt from plain JSON types, anything else becomes an inert
   `"<TypeName>"` placeholder, so no caller object (with methods the sandbox does not know
   are dangerous) ever reaches the template;
3. reasoning given as `reasoning_content`, `thinking` or `reasoning` is copied under
   `reasoning_content` and `thinking`, the names templates read.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def plain_data(value: Any) -> Any:
    """A copy of `value` made only of str/int/float/bool/None/dict/list/tuple."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(key): plain_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain_data(item) for item in value)
    if isinstance(value, np.generic):
        return plain_data(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: plain_data(getattr(value, field.name)) for field in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _alias_reasoning(message: dict) -> dict:
    reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The message list a template renders (a fresh copy; the caller's is never touched)."""
    prepared = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages must be mappings, got {message!r}")
        kept = {key: value for key, value in message.items() if value is not None}
        prepared.append(_alias_reasoning(plain_data(kept)))
    return prepared
