"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) as
llama-server serves it: the request becomes a chat completion's (its
server_chat_convert_anthropic_to_oai), which runs as any chat does, and the answer is a
`message` with content blocks, or, streamed, Anthropic's events (message_start, per block
content_block_start / _delta / _stop, message_delta with the stop reason, message_stop).

Converted: `system` (a string or text blocks), messages whose content is a string or
blocks (`text`, `tool_use` as the assistant's tool calls, `tool_result` as tool messages,
`thinking` as reasoning), `tools` (name, description, input_schema), `tool_choice` (auto;
any or tool: required), `stop_sequences`, `max_tokens` (4096 if absent, as llama-server),
temperature, top_p, top_k, and `thinking` {type: enabled, budget_tokens} as the reasoning
budget (10000 tokens if not given). Images are refused: this server has no vision.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from llama.server.errors import APIError, bad_request
from llama.server.responses_api import NamedEvent

PASSED_THROUGH = ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs")
# llama-server's answer to an image for a model without a vision projector (a 500, as its)
NO_IMAGES = APIError(500, "image input is not supported - hint: if this is unexpected, you may need to "
                     "provide the mmproj")


def chat_body(body: dict) -> dict:
    """The chat-completion request equivalent to a Messages request."""
    messages: list[dict] = []
    system = body.get("system")
    if isinstance(system, str):
        messages.append({"role": "system", "content": system})
    elif isinstance(system, list):
        messages.append({"role": "system", "content": "".join(
            b.get("text", "") for b in system if isinstance(b, dict) and b.get("type") == "text")})
    if not isinstance(body.get("messages"), list):
        raise bad_request("'messages' is required")
    for msg in body["messages"]:
        messages += _messages(msg)
    if not any(m["role"] != "system" for m in messages):   # llama-server answers an empty chat
        messages.append({"role": "user", "content": ""})
    out: dict = {"messages": messages, "max_tokens": body.get("max_tokens", 4096)}
    if isinstance(body.get("tools"), list):
        out["tools"] = [{"type": "function", "function": {
            "name": t.get("name", ""), "description": t.get("description", ""),
            "parameters": t.get("input_schema", {})}} for t in body["tools"] if isinstance(t, dict)]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") == "auto":
            out["tool_choice"] = "auto"
        elif choice.get("type") in ("any", "tool"):
            out["tool_choice"] = "required"
    if "stop_sequences" in body:
        out["stop"] = body["stop_sequences"]
    out.update({k: body[k] for k in PASSED_THROUGH if k in body})
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":   # llama-server's default budget
        out["thinking_budget_tokens"] = thinking.get("budget_tokens", 10000)
    return out


def _messages(msg: Any) -> list[dict]:
    if not isinstance(msg, dict):
        raise bad_request("a message must be an object with 'role' and 'content'")
    role, content = msg.get("role"), msg.get("content")
    if isinstance(content, str) or content is None:
        return [] if content is None and role == "assistant" else [msg]
    if not isinstance(content, list):
        raise bad_request("a message's 'content' must be a string or an array of blocks")
    text, calls, results, reasoning = [], [], [], ""
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append({"type": "text", "text": block.get("text", "")})
        elif kind == "thinking":
            reasoning += block.get("thinking", "")
        elif kind == "image":
            raise NO_IMAGES
        elif kind == "tool_use":
            calls.append({"id": block.get("id", ""), "type": "function", "function": {
                "name": block.get("name", ""), "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result":
            result = block.get("content")
            if isinstance(result, list):
                if any(isinstance(c, dict) and c.get("type") == "image" for c in result):
                    raise NO_IMAGES
                result = "".join(c.get("text", "") for c in result if isinstance(c, dict) and c.get("type") == "text")
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id", ""),
                            "content": result if isinstance(result, str) else ""})
        else:
            raise bad_request(f"unknown content block type {kind!r}")
    out = []
    if text or calls or reasoning:
        new: dict = {"role": role, "content": text or ""}
        if calls:
            new["tool_calls"] = calls
        if reasoning:
            new["reasoning_content"] = reasoning
        out.append(new)
    return out + results


@dataclass
class MessagesAnswer:
    """A chat job's answer as Anthropic's `message` (`response()`) or its event stream
    (`start`, `feed`, `end`): thinking and text blocks stream as they come, and a tool call
    as llama-server streams it, a tool_use block started once its name is whole and its
    input as `input_json_delta`s while the arguments grow (their concatenation is the
    input's JSON)."""

    job: Any
    task: Any
    model: str
    timings_per_token: bool = False   # accepted as the other APIs' answers take it; no field for it here
    msg_id: str = field(default_factory=lambda: f"msg_{secrets.token_hex(12)}")
    _chunks: Any = None
    _open: str | None = None       # the kind of the block the stream has open ("thinking", "text")
    _n_blocks: int = 0             # blocks the stream has started
    _sent_start: bool = False
    _tool_blocks_at: dict = field(default_factory=dict)   # tool call index -> its block's index

    def _message(self) -> dict:
        return self.job.response()["choices"][0]["message"]

    def _stop(self, message: dict) -> tuple[str, str | None]:
        seq = self.job.seq
        if seq.finish_reason == "length":
            return "max_tokens", None
        if message.get("tool_calls"):
            return "tool_use", None
        word = seq.text.stop_word
        return ("stop_sequence", word) if word else ("end_turn", None)

    def _usage(self) -> dict:
        seq = self.job.seq
        cached = self.task.n_cached
        return {"cache_read_input_tokens": cached, "input_tokens": len(seq.prompt) - cached,
                "output_tokens": len(seq.tokens)}

    @staticmethod
    def _tool_blocks(message: dict) -> list[dict]:
        blocks = []
        for call in message.get("tool_calls") or []:
            try:
                args = json.loads(call["function"]["arguments"])
            except (ValueError, TypeError):
                args = {}
            blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                           "input": args})
        return blocks

    def response(self) -> dict:
        message = self._message()
        blocks = ([{"type": "thinking", "thinking": message["reasoning_content"], "signature": ""}]
                  if message.get("reasoning_content") else [])
        blocks += [{"type": "text", "text": message["content"]}] if message.get("content") else []
        blocks += self._tool_blocks(message)
        reason, word = self._stop(message)
        return {"id": self.msg_id, "type": "message", "role": "assistant", "content": blocks,
                "model": self.model, "stop_reason": reason, "stop_sequence": word,
                "usage": self._usage()}

    # the stream ---------------------------------------------------------------------------
    @staticmethod
    def _event(kind: str, **data: Any) -> NamedEvent:
        return NamedEvent(kind, {"type": kind, **data})

    def progress(self, info: dict) -> NamedEvent:
        """llama-server's prompt progress (`return_progress`), as a ping event carrying it."""
        return NamedEvent("ping", {"type": "ping", "prompt_progress": info})

    def start(self) -> list[NamedEvent]:
        self._chunks = self.job.chunks()
        self._chunks.start()
        return [self._event("message_start", message={
            "id": self.msg_id, "type": "message", "role": "assistant", "content": [],
            "model": self.model, "stop_reason": None, "stop_sequence": None,
            "usage": {**self._usage(), "output_tokens": 0}})]

    def _block(self, kind: str, start: dict | None = None) -> list[NamedEvent]:
        """The events that make `kind` the open block: the previous one stopped, this started."""
        if self._open == kind:
            return []
        events = self._close()
        self._open = kind
        self._n_blocks += 1
        if start is None:
            start = {"type": "thinking", "thinking": ""} if kind == "thinking" else {"type": "text", "text": ""}
        return events + [self._event("content_block_start", index=self._n_blocks - 1, content_block=start)]

    def _close(self) -> list[NamedEvent]:
        if self._open is None:
            return []
        self._open = None
        return [self._event("content_block_stop", index=self._n_blocks - 1)]

    def feed(self, step) -> list[NamedEvent]:
        events = []
        for chunk in self._chunks.feed(step):
            delta = chunk["choices"][0]["delta"]
            if delta.get("reasoning_content"):
                events += self._block("thinking")
                events.append(self._event("content_block_delta", index=self._n_blocks - 1, delta={
                    "type": "thinking_delta", "thinking": delta["reasoning_content"]}))
            if delta.get("content"):
                events += self._block("text")
                events.append(self._event("content_block_delta", index=self._n_blocks - 1,
                                          delta={"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or []:
                events += self._tool_delta(call)
        return events

    def _tool_delta(self, call: dict) -> list[NamedEvent]:
        """A streamed tool call's chunk: its first (with the name) starts a tool_use block."""
        events = []
        function = call.get("function") or {}
        if call["index"] not in self._tool_blocks_at:
            events += self._block(f"tool_use {call['index']}", {
                "type": "tool_use", "id": call.get("id", ""), "name": function.get("name", ""), "input": {}})
            self._tool_blocks_at[call["index"]] = self._n_blocks - 1
        if function.get("arguments"):
            events.append(self._event("content_block_delta", index=self._tool_blocks_at[call["index"]], delta={
                "type": "input_json_delta", "partial_json": function["arguments"]}))
        return events

    def end(self) -> list[NamedEvent]:
        self._chunks.end()
        message = self._message()
        events = self._close()
        reason, word = self._stop(message)
        events.append(self._event("message_delta", delta={"stop_reason": reason, "stop_sequence": word},
                                  usage={"output_tokens": len(self.job.seq.tokens)}))
        events.append(self._event("message_stop"))
        return events


ANSWER = MessagesAnswer   # what routes_openai.generate answers this API's requests with
