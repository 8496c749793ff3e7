"""Between the scheduler's worker thread and asyncio: a task's events land in an asyncio
queue of the request's event loop (`call_soon_threadsafe`), and a client that goes away
cancels its task at once, whether it waits in the queue or runs in a slot."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

from fastapi import Request

from llama.server.errors import APIError
from llama.server.scheduler import CallTask, QueueFull, Scheduler, Task


class Events:
    """The per-request queue a task's sink writes to (from the worker thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    def sink(self, kind: str, payload: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, payload))


def submit(scheduler: Scheduler, task: Task | CallTask) -> None:
    try:
        scheduler.submit(task)
    except QueueFull:
        raise APIError(503, "the server is busy: every slot is taken and the queue is full",
                       headers={"Retry-After": "1"}) from None


async def _watch_disconnect(request: Request, scheduler: Scheduler, tasks: tuple) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            for task in tasks:
                scheduler.cancel(task)
            return


@contextlib.asynccontextmanager
async def watched(request: Request, scheduler: Scheduler, *tasks: Task | CallTask):
    """While the body runs, a disconnect of the client cancels the tasks; so does the
    body's own cancellation (the server shutting down, the stream closed)."""
    watcher = asyncio.create_task(_watch_disconnect(request, scheduler, tasks))
    try:
        yield
    except BaseException:
        for task in tasks:
            scheduler.cancel(task)
        raise
    finally:
        watcher.cancel()


async def events(events_: Events, ping_every: float | None = None
                 ) -> AsyncIterator[tuple[str, Any]]:
    """The task's ("step", Step) events until "done"; an "error" raises its APIError. With
    `ping_every` (seconds), ("ping", None) after each such silence (a stream's keep-alive)."""
    while True:
        # a timer that queues the ping, cancelled when an event comes first: cheaper per
        # event than wait_for, which wraps every get in a task of its own
        timer = None if ping_every is None else events_.loop.call_later(
            ping_every, events_.queue.put_nowait, ("ping", None))
        kind, payload = await events_.queue.get()
        if timer is not None:
            timer.cancel()
        if kind == "error":
            raise payload
        yield kind, payload
        if kind == "done":
            return


async def run_call(request: Request, scheduler: Scheduler, fn) -> Any:
    """Run `fn` on the worker thread between steps; its result."""
    ev = Events()
    task = CallTask(fn, ev.sink)
    submit(scheduler, task)
    async with watched(request, scheduler, task):
        async for kind, payload in events(ev):
            if kind == "done":
                return payload
    return None
