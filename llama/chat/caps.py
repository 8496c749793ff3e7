"""What a chat template does with a tool call's arguments, found by rendering probes as
llama.cpp's template analysis does: OpenAI sends them as JSON text, but many templates read
them as an object (`arguments|items`, `arguments|tojson`), and llama-server hands those
templates objects. `object_arguments` says whether a template is one of them;
`with_object_arguments` makes the messages such a template wants. `parallel_calls` says
whether a template writes a second call of one message (llama.cpp's default for a request's
`parallel_tool_calls`)."""
from __future__ import annotations

import json
from typing import Any

from llama.chat.errors import ChatTemplateError
from llama.chat.template import ChatTemplate

_ARGS = {"probe_arg": "probe-value"}
_TOOLS = [{"type": "function", "function": {"name": "probe_tool", "description": "a probe", "parameters": {
    "type": "object", "properties": {"probe_arg": {"type": "string"}}, "required": ["probe_arg"]}}}]


def _probe(arguments: Any, n_calls: int = 1) -> list[dict]:
    """One call and its result (the arguments probe), or two calls, one result and an answer
    (llama.cpp's parallel-calls probe)."""
    calls = [{"id": f"call_probe{i or ''}", "type": "function",
              "function": {"name": "probe_tool" if i == 0 else "probe_tool_second", "arguments": arguments}}
             for i in range(n_calls)]
    after = [{"role": "assistant", "content": "Done."}] if n_calls > 1 else []
    return [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_probe", "content": "ok"}, *after,
            {"role": "user", "content": "Go on"}]


def _render(template: ChatTemplate, arguments: Any, n_calls: int = 1) -> str | None:
    try:
        return template.render(_probe(arguments, n_calls), add_generation_prompt=True, tools=_TOOLS)
    except ChatTemplateError:
        return None


def object_arguments(template: ChatTemplate) -> bool:
    """Whether `template` reads arguments as an object: given JSON text it fails or writes the
    text JSON-quoted a second time, and given the object it writes the value."""
    as_text = _render(template, json.dumps(_ARGS))
    if as_text is not None and '\\"probe_arg\\"' not in as_text:
        return False
    as_object = _render(template, _ARGS)
    return as_object is not None and "probe-value" in as_object


def parallel_calls(template: ChatTemplate) -> bool:
    """Whether `template` writes the second of two calls in one message (one that refuses two,
    as Llama 3.1's does, or leaves calls out, does not)."""
    return any("probe_tool_second" in (_render(template, args, n_calls=2) or "")
               for args in (json.dumps(_ARGS), _ARGS))


def with_object_arguments(messages: list[dict]) -> list[dict]:
    """`messages` with each tool call's arguments given as JSON text of an object turned into
    that object (other text is left as it is)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message = {**message, "tool_calls": [_objectified(c) for c in calls]}
        out.append(message)
    return out


def _objectified(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        args = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": args}} if isinstance(args, dict) else call
