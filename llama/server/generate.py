"""Running one generation job through the scheduler, streamed (SSE) or not. `builder`
makes the response: `start()/feed(step)/end()` give the stream's chunks, `response()`
the whole answer; the OpenAI jobs of llama.api are builders, and so is llama-server's
`/completion` shape (routes_llama)."""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable

from fastapi import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from llama.server.bridge import Events, events, submit, watched
from llama.server.errors import APIError, bad_request
from llama.server.fields import SlotOptions
from llama.server.responses_api import NamedEvent
from llama.server.scheduler import Task


async def read_body(request: Request, limit: int, *, array: bool = False) -> Any:
    """The JSON body: an object (a list too where `array`), else a 400."""
    raw = await request.body()
    if len(raw) > limit:
        raise APIError(413, f"the request body exceeds {limit} bytes")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if b"\\u" in raw:   # an escape may be a lone UTF-16 surrogate, which JSON allows and text cannot hold
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            raise bad_request(f"the request body holds a lone UTF-16 surrogate "
                              f"(\\u{ord(e.object[e.start]):04x}), which is not text") from None
    if array and isinstance(body, list):
        return body
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON " + ("array" if array else "object"))
    return body


PING = ":\n\n"   # an SSE comment: llama-server's keep-alive, skipped by clients
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
Progress = Callable[[Task, dict], dict]   # a task and its prompt_progress -> the chunk


def _task(seq, ev: Events, slot: SlotOptions, id_slot: int, shift: tuple[int, int],
          return_progress: bool) -> Task:
    return Task(seq, ev.sink, cache_prompt=slot.cache_prompt, id_slot=id_slot, n_keep=shift[0],
                n_discard=shift[1], return_progress=return_progress, lora=slot.lora,
                n_cache_reuse=slot.n_cache_reuse)


def sse(obj: Any) -> str:
    """One SSE event: `data:` alone, or with its `event:` name (the Responses API's)."""
    if isinstance(obj, NamedEvent):
        return f"event: {obj.event}\ndata: {json.dumps(obj.data, ensure_ascii=False)}\n\n"
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def serve(request: Request, scheduler, seq, *, response: Callable[[Task], dict],
                chunks: Callable[[Task], Any], stream: bool, slot: SlotOptions,
                done_marker: bool, shift: tuple[int, int] = (0, 0),
                ping_every: float | None = None, progress: Progress | None = None) -> Response:
    """`response(task)`: the whole answer once done; `chunks(task)`: the stream builder;
    `shift`: the request's (n_keep, n_discard) for a context shift; `ping_every`: seconds
    of silence in a stream before an SSE ping (":", a comment clients skip); `progress`:
    the chunk of a prompt_progress (llama-server's return_progress), in streams only;
    `slot`: the request's use of the slots' caches and its adapters."""
    ev = Events()
    task = _task(seq, ev, slot, slot.id_slot, shift, stream and progress is not None)
    submit(scheduler, task)  # a full queue is a 503 before any byte is sent
    if not stream:
        async with watched(request, scheduler, task):
            async for _ in events(ev):
                pass
        return JSONResponse(response(task))
    body = _stream(scheduler, task, ev, chunks(task), done_marker, ping_every, progress)
    conversation = request.headers.get("x-conversation-id")
    if conversation:   # a resumable stream (llama/server/stream_sessions.py): it outlives the client
        body = request.app.state.streams.start(conversation, body).read_from(0)
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)


async def _stream(scheduler, task: Task, ev: Events, chunks, done_marker: bool,
                  ping_every: float | None = None, progress: Progress | None = None
                  ) -> AsyncIterator[str]:
    try:
        for c in chunks.start():
            yield sse(c)
        async for kind, payload in events(ev, ping_every):
            if kind == "ping":
                yield PING
            elif kind == "progress":
                yield sse(progress(task, payload))
            elif kind == "step":
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


async def serve_all(request: Request, scheduler, seqs: list, builders: list[Callable[[Task], Any]],
                    slot: SlotOptions, shift: tuple[int, int] = (0, 0), stream: bool = False,
                    ping_every: float | None = None) -> Response:
    """Several prompts of one llama-server /completion request, each a task of its own (the
    first taking `id_slot`): `builders[k](task)` makes prompt k's answer (its `response()`,
    or its stream's chunks). The array of the answers, in order, once all are done; or
    streamed, each chunk with its prompt's `index`, as they come."""
    evs = [Events() for _ in seqs]
    tasks = [_task(seq, ev, slot, slot.id_slot if i == 0 else -1, shift, False)
             for i, (seq, ev) in enumerate(zip(seqs, evs))]
    _submit_all(scheduler, tasks)
    answers = [make(task) for make, task in zip(builders, tasks)]
    if stream:
        return StreamingResponse(_stream_indexed(scheduler, tasks, evs, answers, ping_every),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    await _finish_all(request, scheduler, tasks, evs)
    return JSONResponse([answer.response() for answer in answers])


def _submit_all(scheduler, tasks: list[Task]) -> None:
    """Every task queued, or (a full queue: a 503) none."""
    try:
        for task in tasks:
            submit(scheduler, task)
    except APIError:
        for task in tasks:
            scheduler.cancel(task)
        raise


async def _finish_all(request: Request, scheduler, tasks: list[Task], evs: list[Events]) -> None:
    """Wait until every task is done (each cancelled if the client goes)."""
    async with watched(request, scheduler, *tasks):
        for ev in evs:
            async for _ in events(ev):
                pass


async def serve_choices(request: Request, scheduler, jobs: list, *, stream: bool,
                        slot: SlotOptions, shift: tuple[int, int] = (0, 0),
                        ping_every: float | None = None, progress: Progress | None = None,
                        per_prompt: int | None = None) -> Response:
    """OpenAI's `n` > 1 and its several prompts in one request: one task per choice (each a
    slot of its own, the first taking `id_slot`), answered as one response whose choices
    are indexed in order (prompt k's choice j is k * n + j), with the usage of each prompt
    once and every choice's tokens. `jobs`: llama.api's OpenAI jobs (builders), `per_prompt`
    of them for each prompt in turn (all of them by default: one prompt)."""
    per_prompt = per_prompt or len(jobs)
    evs = [Events() for _ in jobs]
    tasks = [_task(job.seq, ev, slot, slot.id_slot if i == 0 else -1, shift,
                   stream and progress is not None)
             for i, (job, ev) in enumerate(zip(jobs, evs))]
    for i, task in enumerate(tasks):
        if i % per_prompt:   # they start from their prompt's first task's cells once it has decoded them
            task.parent = tasks[i - i % per_prompt]
    _submit_all(scheduler, tasks)
    if not stream:
        await _finish_all(request, scheduler, tasks, evs)
        return JSONResponse(merge_choices([job.response() for job in jobs], per_prompt))
    return StreamingResponse(_stream_choices(scheduler, tasks, evs, [job.chunks() for job in jobs],
                                             ping_every, progress, per_prompt),
                             media_type="text/event-stream", headers=SSE_HEADERS)


def merge_choices(answers: list[dict], per_prompt: int) -> dict:
    """The answers of one request -> one: the first's envelope, choice i from answer i, each
    prompt's tokens (`per_prompt` answers share one) counted once."""
    out = dict(answers[0])
    out["choices"] = [{**c, "index": i} for i, a in enumerate(answers) for c in a["choices"]]
    out["usage"] = _summed_usage([a["usage"] for a in answers], per_prompt)
    return out


def _summed_usage(usages: list[dict], per_prompt: int) -> dict:
    prompt = sum(u["prompt_tokens"] for u in usages[::per_prompt])
    completion = sum(u["completion_tokens"] for u in usages)
    return {**usages[0], "prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


async def _merged(evs: list[Events], ping_every: float | None = None
                  ) -> AsyncIterator[tuple[int, str, Any]]:
    """The events of several tasks as they come, (task index, kind, payload), until every
    one is done; only the first task's stream pings, and an error raises."""
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, ev: Events) -> None:
        try:
            async for kind, payload in events(ev, ping_every if i == 0 else None):
                await merged.put((i, kind, payload))
        except APIError as e:
            await merged.put((i, "error", e))

    pumps = [asyncio.create_task(pump(i, ev)) for i, ev in enumerate(evs)]
    try:
        remaining = len(evs)
        while remaining:
            i, kind, payload = await merged.get()
            if kind == "error":
                raise payload
            remaining -= kind == "done"
            yield i, kind, payload
    finally:
        for p in pumps:
            p.cancel()


async def _stream_tasks(scheduler, tasks: list[Task], evs: list[Events], builders: list,
                        chunk_of: Callable[[int, dict], str | None], ping_every: float | None = None,
                        progress: Progress | None = None, tail: Callable[[], list[str]] = list
                        ) -> AsyncIterator[str]:
    """Several tasks' streams as one: each builder's chunks as its task's events come, made
    text by `chunk_of(task index, chunk)` (None: held back), then `tail()`'s."""
    def texts(i: int, chunks) -> list[str]:
        return [t for t in (chunk_of(i, c) for c in chunks) if t is not None]

    try:
        for i, builder in enumerate(builders):
            for text in texts(i, builder.start()):
                yield text
        async for i, kind, payload in _merged(evs, ping_every):
            if kind == "ping":
                yield PING
                continue
            if kind == "progress":
                chunks = [progress(tasks[i], payload)] if progress is not None else []
            else:
                chunks = builders[i].end() if kind == "done" else builders[i].feed(payload)
            for text in texts(i, chunks):
                yield text
        for text in tail():
            yield text
    except APIError as e:  # the status is sent already: the error goes as an event
        yield sse(e.body())
    finally:
        for task in tasks:
            scheduler.cancel(task)


def _stream_indexed(scheduler, tasks: list[Task], evs: list[Events], builders: list,
                    ping_every: float | None = None) -> AsyncIterator[str]:
    """llama-server's chunks of several prompts as they come, each with its prompt's index."""
    return _stream_tasks(scheduler, tasks, evs, builders, lambda i, c: sse({**c, "index": i}), ping_every)


def _stream_choices(scheduler, tasks: list[Task], evs: list[Events], builders: list,
                    ping_every: float | None = None, progress: Progress | None = None,
                    per_prompt: int = 1) -> AsyncIterator[str]:
    """The choices' chunks as they come (each under the first choice's id, with its own
    index), one usage chunk at the end when asked for, then [DONE]."""
    first: dict | None = None
    usages: list[dict] = []

    def stamped(chunk: dict) -> str:   # every chunk under the first one's id and time
        nonlocal first
        first = first or chunk
        return sse({**chunk, "id": first["id"], "created": first["created"]})

    def chunk_of(i: int, chunk: dict) -> str | None:
        if chunk.get("usage") and not chunk.get("choices"):   # the stream's usage chunk, at the end
            usages.append({"index": i, "chunk": chunk})
            return None
        for c in chunk.get("choices", []):
            c["index"] = i
        return stamped(chunk)

    def tail() -> list[str]:
        usages.sort(key=lambda u: u["index"])
        summed = [stamped({**usages[0]["chunk"], "usage": _summed_usage([u["chunk"]["usage"] for u in usages],
                                                                       per_prompt)})] if usages else []
        return summed + ["data: [DONE]\n\n"]

    return _stream_tasks(scheduler, tasks, evs, builders, chunk_of, ping_every, progress, tail)
