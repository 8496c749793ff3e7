"""Running one generation job through the scheduler, streamed (SSE) or not. `builder`
makes the response: `start()/feed(step)/end()` give the stream's chunks, `response()`
the whole answer; the OpenAI jobs of llama.api are builders, and so is llama-server's
`/completion` shape (routes_llama)."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable

from fastapi import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from llama.server.bridge import Events, events, submit, watched
from llama.server.errors import APIError, bad_request
from llama.server.scheduler import Task


async def read_body(request: Request, limit: int) -> dict:
    raw = await request.body()
    if len(raw) > limit:
        raise APIError(413, f"the request body exceeds {limit} bytes")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def serve(request: Request, scheduler, seq, *, response: Callable[[Task], dict],
                chunks: Callable[[Task], Any], stream: bool, cache_prompt: bool, id_slot: int,
                done_marker: bool) -> Response:
    """`response(task)`: the whole answer once done; `chunks(task)`: the stream builder."""
    ev = Events()
    task = Task(seq, ev.sink, cache_prompt=cache_prompt, id_slot=id_slot)
    submit(scheduler, task)  # a full queue is a 503 before any byte is sent
    if not stream:
        async with watched(request, scheduler, task):
            async for _ in events(ev):
                pass
        return JSONResponse(response(task))
    return StreamingResponse(_stream(scheduler, task, ev, chunks(task), done_marker),
                             media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _stream(scheduler, task: Task, ev: Events, chunks, done_marker: bool
                  ) -> AsyncIterator[str]:
    try:
        for c in chunks.start():
            yield sse(c)
        async for kind, payload in events(ev):
            if kind == "step":
                for c in chunks.feed(payload):
                    yield sse(c)
        for c in chunks.end():
            yield sse(c)
        if done_marker:
            yield "data: [DONE]\n\n"
    except APIError as e:  # the status is sent already: the error goes as an event
        yield sse(e.body())
    finally:
        scheduler.cancel(task)  # a client gone mid-stream frees its slot next step
