"""OpenAI's Responses API (`POST /v1/responses`) as llama-server serves it: the request is
turned into a chat completion's (its server_chat_convert_responses_to_chatcmpl), which runs
as any chat does, and the answer is put in the Responses shapes (a `response` object; when
streamed, its typed events, each an SSE `event:` line with its data).

Input: a string (one user message) or items: messages (`input_text` parts, or a string;
roles user, system, developer, and assistant `output_text`), `function_call` and
`function_call_output` items. `instructions` becomes a system message, `max_output_tokens`
max_tokens, function `tools` chat tools (and a `tool_choice` naming one the chat's form),
`text.format` the chat's `response_format`.
Not supported, as in llama-server: `previous_response_id` (nothing is stored), files and
images (this server has no vision).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from llama.api import responses
from llama.server.errors import bad_request
from llama.server.timings import timings


@dataclass(frozen=True)
class NamedEvent:
    """An SSE event with a name (`event: <name>`), as the Responses stream sends them."""
    event: str
    data: dict


def _rid(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def chat_body(body: dict) -> dict:
    """The chat-completion request equivalent to a Responses request."""
    if "input" not in body:
        raise bad_request("'input' is required")
    if body.get("previous_response_id"):
        raise bad_request("llama.cpp does not support 'previous_response_id'.")
    out = {k: v for k, v in body.items()
           if k not in ("input", "instructions", "tools", "max_output_tokens", "text", "reasoning")}
    messages: list[dict] = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise bad_request("'instructions' must be a string")
        messages.append({"role": "system", "content": body["instructions"]})
    value = body["input"]
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list):
        for item in value:
            _add_item(messages, item)
    else:
        raise bad_request("'input' must be a string or array of objects")
    out["messages"] = messages
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("'tools' must be an array of objects")
        chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                      for t in tools if isinstance(t, dict) and t.get("type") == "function"]
        if chat_tools:
            out["tools"] = chat_tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    if "max_output_tokens" in body:
        out["max_tokens"] = body["max_output_tokens"]
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        out["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "response"), "schema": fmt.get("schema", {}),
            "strict": fmt.get("strict", False)}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    return out


def _text_parts(content: Any, allowed: tuple[str, ...], what: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{what} content must be a string or an array of parts")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_file"):
            raise bad_request(f"'{kind}' is not supported by this server")
        if kind not in allowed:
            raise bad_request(f"'type' must be one of {', '.join(repr(a) for a in allowed)}")
        if not isinstance(part.get("text"), str):
            raise bad_request(f"'{kind}' requires 'text'")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def _add_item(messages: list[dict], item: Any) -> None:
    if not isinstance(item, dict):
        raise bad_request("Cannot determine type of 'item'")
    role, kind = item.get("role"), item.get("type")
    prev = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
    if role in ("user", "system", "developer"):
        messages.append({"role": role, "content": _text_parts(item.get("content"), ("input_text",), role)})
    elif role == "assistant" and kind in ("message", None):
        parts = _text_parts(item.get("content", ""), ("output_text", "input_text"), "assistant")
        if prev is not None and kind == "message":
            prev["content"] = (prev.get("content") or []) + parts
        else:
            messages.append({"role": "assistant", "content": parts})
    elif kind == "function_call":
        for key in ("arguments", "call_id", "name"):
            if not isinstance(item.get(key), str):
                raise bad_request(f"a function_call item needs a string '{key}'")
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        if prev is not None:
            prev.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), (str, list)):
            raise bad_request("a function_call_output item needs 'call_id' and 'output'")
        output = item["output"]
        if isinstance(output, list):
            output = "".join(p["text"] for p in _text_parts(output, ("input_text",), "tool output"))
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
    else:
        raise bad_request("Cannot determine type of 'item'")


@dataclass
class ResponsesAnswer:
    """A chat job's answer in the Responses shapes: `response()` when done; `start`,
    `feed` and `end` the stream's events (llama-server's order: response.created and
    in_progress, output_item.added and content_part.added before the first text,
    output_text.delta per piece, function-call items and argument deltas, then the done
    events and response.completed with the whole response). Every event has its
    sequence_number and its item's output_index, which the official client checks."""

    job: Any
    task: Any
    model: str
    timings_per_token: bool = False   # llama-server's telemetry: `timings` on each text delta
    resp_id: str = field(default_factory=lambda: _rid("resp"))
    msg_id: str = field(default_factory=lambda: _rid("msg"))
    reasoning_id: str = field(default_factory=lambda: _rid("rs"))
    created: int = field(default_factory=responses.now)
    _chunks: Any = None
    _seq: int = 0
    _index: dict = field(default_factory=dict)   # "msg" or a tool call's index -> output_index
    _call_ids: dict = field(default_factory=dict)  # tool call index -> item id

    def _items(self) -> dict:
        """The finished output items, by key ("msg", or a tool call's index)."""
        message = self.job.response()["choices"][0]["message"]
        items = {}
        if message.get("reasoning_content"):
            items["reasoning"] = self._reasoning_item(
                "completed", [{"type": "reasoning_text", "text": message["reasoning_content"]}])
        if message.get("content"):
            items["msg"] = {"type": "message", "id": self.msg_id, "status": "completed",
                            "role": "assistant",
                            "content": [{"type": "output_text", "annotations": [], "logprobs": [],
                                         "text": message["content"]}]}
        for i, call in enumerate(message.get("tool_calls") or []):
            items[i] = {"type": "function_call", "id": self._call_ids.get(i, f"fc_{call['id']}"),
                        "status": "completed", "call_id": call["id"],
                        "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        return items

    def _reasoning_item(self, status: str, content: list) -> dict:
        """A reasoning output item (llama-server's: the text in `content`, no summary)."""
        return {"type": "reasoning", "id": self.reasoning_id, "summary": [], "content": content,
                "encrypted_content": "", "status": status}

    def _usage(self) -> dict:
        seq = self.job.seq
        return {"input_tokens": len(seq.prompt), "output_tokens": len(seq.tokens),
                "total_tokens": len(seq.prompt) + len(seq.tokens),
                "input_tokens_details": {"cached_tokens": self.task.n_cached}}

    def response(self, output: list[dict] | None = None) -> dict:
        return {"id": self.resp_id, "object": "response", "created_at": self.created,
                "completed_at": responses.now(), "status": "completed", "model": self.model,
                "output": list(self._items().values()) if output is None else output,
                "usage": self._usage()}

    # the stream ---------------------------------------------------------------------------
    def _event(self, kind: str, **data: Any) -> NamedEvent:
        self._seq += 1
        return NamedEvent(kind, {"type": kind, "sequence_number": self._seq - 1, **data})

    def _state(self, status: str) -> dict:
        return {"id": self.resp_id, "object": "response", "created_at": self.created,
                "status": status, "model": self.model, "output": []}

    def _added(self, key: Any, item: dict) -> list[NamedEvent]:
        self._index[key] = len(self._index)
        return [self._event("response.output_item.added", output_index=self._index[key], item=item)]

    def start(self) -> list[NamedEvent]:
        self._chunks = self.job.chunks()
        self._chunks.start()
        return [self._event("response.created", response=self._state("in_progress")),
                self._event("response.in_progress", response=self._state("in_progress"))]

    def feed(self, step) -> list[NamedEvent]:
        events = []
        for chunk in self._chunks.feed(step):
            delta = chunk["choices"][0]["delta"]
            if delta.get("reasoning_content"):
                if "reasoning" not in self._index:
                    events += self._added("reasoning", self._reasoning_item("in_progress", []))
                events.append(self._event("response.reasoning_text.delta", item_id=self.reasoning_id,
                                          output_index=self._index["reasoning"], content_index=0,
                                          delta=delta["reasoning_content"]))
            if delta.get("content"):
                if "msg" not in self._index:
                    events += self._added("msg", {"type": "message", "id": self.msg_id,
                                                  "status": "in_progress", "role": "assistant",
                                                  "content": []})
                    events.append(self._event("response.content_part.added", item_id=self.msg_id,
                                              output_index=self._index["msg"], content_index=0,
                                              part={"type": "output_text", "text": "",
                                                    "annotations": []}))
                events.append(self._event("response.output_text.delta", item_id=self.msg_id,
                                          output_index=self._index["msg"], content_index=0,
                                          delta=delta["content"], logprobs=[]))
                if self.timings_per_token:
                    events[-1].data["timings"] = timings(self.task)
            for call in delta.get("tool_calls") or []:
                events += self._call_events(call)
        return events

    def _call_events(self, call: dict) -> list[NamedEvent]:
        i, fn, out = call.get("index", 0), call.get("function") or {}, []
        if fn.get("name") and i not in self._index:
            item_id = self._call_ids[i] = f"fc_{call.get('id') or i}"
            out += self._added(i, {"type": "function_call", "id": item_id, "status": "in_progress",
                                   "call_id": call.get("id"), "name": fn["name"], "arguments": ""})
        if fn.get("arguments") and i in self._index:
            out.append(self._event("response.function_call_arguments.delta", item_id=self._call_ids[i],
                                   output_index=self._index[i], delta=fn["arguments"]))
        return out

    def end(self) -> list[NamedEvent]:
        self._chunks.end()
        items = self._items()
        events = []
        for key, item in items.items():   # items the deltas never opened get the next indices
            if key not in self._index:
                opened = dict(item, status="in_progress")
                if item["type"] in ("message", "reasoning"):
                    opened["content"] = []
                events += self._added(key, opened)
        order = sorted(items, key=lambda k: self._index[k])
        for key in order:
            item, index = items[key], self._index[key]
            if item["type"] == "reasoning":
                events.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                          content_index=0, text=item["content"][0]["text"]))
            elif item["type"] == "message":
                part = item["content"][0]
                events.append(self._event("response.output_text.done", item_id=self.msg_id,
                                          output_index=index, content_index=0, text=part["text"],
                                          logprobs=[]))
                events.append(self._event("response.content_part.done", item_id=self.msg_id,
                                          output_index=index, content_index=0, part=part))
            else:
                events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                          output_index=index, arguments=item["arguments"]))
            events.append(self._event("response.output_item.done", output_index=index, item=item))
        events.append(self._event("response.completed",
                                  response=self.response([items[k] for k in order])))
        events[-1].data["timings"] = timings(self.task)
        return events

    def progress(self, info: dict) -> NamedEvent:
        """llama-server's prompt progress (`return_progress`), as an in_progress event."""
        return self._event("response.in_progress", response=self._state("in_progress"), prompt_progress=info)


ANSWER = ResponsesAnswer   # what routes_openai.generate answers this API's requests with
