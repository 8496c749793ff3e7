"""`GET /tools` and `POST /tools`, as llama-server serves its tools (`--tools`, MCP servers).

`GET` lists every tool (base.Tool.to_json). `POST {"tool", "params", "stream"}` runs one:
the headers `x-tool-cwd`, `x-tool-runtime` and `x-resp-type` set the call's working
directory, runtime and response type (the same keys in `params` are ignored: the client,
not the model, decides them); without `x-tool-runtime` the server's `--tools-runtime`
applies. The answer is the tool's JSON; streamed, Server-Sent Events of `{"chunk": ...}`
and a last `{"done": true}` (with `"error"` if the tool failed). An unknown tool is a 404,
a malformed body or a missing or mistyped parameter a 400, a `ToolFailure` a 500. Tools run on worker threads, never on the
event loop.
"""
from __future__ import annotations

import asyncio
import json
import threading
from typing import Callable, Optional

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

from llama.server.errors import APIError, bad_request
from llama.server.generate import read_body
from llama.server.tools.base import Tool, ToolCall, ToolFailure
from llama.server.tools.params import ParamError

HEADER_ONLY = ("cwd", "runtime", "resp_type")


def register(app: FastAPI, tools: Callable[[], list[Tool]], *, runtime: Callable[[], Optional[str]],
             body_limit: int) -> None:
    """`tools`: the tools served now (MCP servers add theirs once warmed up); `runtime`: the
    server's `--tools-runtime` as calls name it."""

    @app.get("/tools")
    async def list_tools():
        return [t.to_json() for t in tools()]

    @app.post("/tools")
    async def call_tool(request: Request):
        body = await read_body(request, body_limit)
        name, params, stream = body.get("tool"), body.get("params", {}), body.get("stream", False)
        if not isinstance(name, str):
            raise bad_request("'tool' must be a string")
        if not isinstance(params, dict) or not isinstance(stream, bool):
            raise bad_request("'params' must be an object and 'stream' a boolean")
        tool = next((t for t in tools() if t.name == name), None)
        if tool is None:
            raise APIError(404, f"tool not found: {name}")
        if stream and not tool.streams:
            raise APIError(404, f"tool {name} does not support streaming")
        params = {k: v for k, v in params.items() if k not in HEADER_ONLY}
        headers = request.headers
        call = ToolCall(cwd=headers.get("x-tool-cwd") or None,
                        runtime=headers.get("x-tool-runtime") or runtime(),
                        resp_type=headers.get("x-resp-type") or None)
        if stream:
            return StreamingResponse(_events(tool, params, call), media_type="text/event-stream")
        try:
            return await run_in_threadpool(tool.invoke, params, call, None)
        except ParamError as e:
            raise bad_request(str(e)) from None
        except ToolFailure as e:
            raise APIError(500, str(e)) from None


async def _events(tool: Tool, params: dict, call: ToolCall):
    """The tool run on a thread, its chunks handed to the event loop as they come."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    gone = threading.Event()
    call.alive = lambda: not gone.is_set()

    def run() -> None:
        done: dict = {"done": True}
        try:
            tool.invoke(params, call, lambda chunk: loop.call_soon_threadsafe(queue.put_nowait, {"chunk": chunk}))
        except Exception as e:   # noqa: BLE001 - any failure ends the stream with its message
            done["error"] = str(e) or type(e).__name__
        loop.call_soon_threadsafe(queue.put_nowait, done)

    threading.Thread(target=run, name=f"ggmlpy-tool-{tool.name}", daemon=True).start()
    try:
        while True:
            event = await queue.get()
            yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
            if event.get("done"):
                return
    finally:
        gone.set()
