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


# llama-server's chat_template_caps (its /props), found as llama.cpp's caps_get finds them,
# by rendering probes; each probe's marker must reach the prompt
_USER = {"role": "user", "content": "User message"}
_CAP_TOOLS = [{"type": "function", "function": {
    "name": "tool1_probe", "description": "Tool description", "parameters": {
        "type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
        "required": ["arg"]}}}]
_PLACEHOLDER = "<REASONING_CONTENT_PLACEHOLDER>"
_PRESERVE = {"enable_thinking": True, "preserve_thinking": True, "clear_thinking": False,
             "truncate_history_thinking": False, "drop_thinking": False}


def _try(template: ChatTemplate, messages: list[dict], tools: list | None = None, **variables: Any) -> str | None:
    try:   # no tools is an empty list, as llama.cpp's probes give it
        return template.render(messages, add_generation_prompt=True, tools=tools or [], **variables)
    except ChatTemplateError:
        return None


def _call_turn(arguments: list[Any]) -> list[dict]:
    """llama.cpp's probe of calls: one call per arguments, a result, an answer."""
    calls = [{"id": f"call0000{i + 1}", "type": "function", "function": {"name": "tool1_probe", "arguments": a}}
             for i, a in enumerate(arguments)]
    return [_USER, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
            {"role": "assistant", "content": "The tool response was 'tool response'"}, _USER]


def _mentions(template: ChatTemplate, *names: str) -> bool:
    """Whether the template's source reads one of the variables `names`."""
    return any(n in template.variables for n in names)


def template_caps(template: ChatTemplate) -> dict[str, bool]:
    """What `template` supports, as llama-server reports it in `/props` (`chat_template_caps`).
    llama.cpp watches which probe values the template reads; here a probe counts where its
    marker reaches the prompt (a reasoning effort: where the variable is read at all)."""
    def shows(marker: str, messages: list[dict], tools: list | None = None, **variables: Any) -> bool:
        return marker in (_try(template, messages, tools, **variables) or "")

    typed = _try(template, [{"role": "user", "content": [{"type": "text", "text": "TYPED_MARKER"}]}])
    as_object = shows("value1", _call_turn([{"arg": "value1"}]), _CAP_TOOLS)

    def args(v: str) -> Any:
        return {"arg": v} if as_object else json.dumps({"arg": v})
    return {
        "supports_string_content": _try(template, [{"role": "user", "content": "STRING_MARKER"}]) is not None,
        "supports_typed_content": typed is not None and "TYPED_MARKER" in typed and "'type'" not in typed,
        "supports_tools": shows("tool1_probe", [_USER], _CAP_TOOLS),
        "supports_tool_calls": shows("tool1_probe", _call_turn([args("value1")])),
        "supports_parallel_tool_calls": shows("value2", _call_turn([args("value1"), args("value2")]), _CAP_TOOLS),
        "supports_system_role": shows("SYSTEM_MARKER", [{"role": "system", "content": "SYSTEM_MARKER"}, _USER]),
        "supports_preserve_reasoning": shows(_PLACEHOLDER, [
            _USER, {"role": "assistant", "content": "Assistant message", "reasoning_content": _PLACEHOLDER}, _USER,
            {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning content"}, _USER],
            **_PRESERVE),
        "supports_reasoning_effort": _mentions(template, "reasoning_effort", "reasoning_strength"),
        "supports_object_arguments": as_object,
    }
