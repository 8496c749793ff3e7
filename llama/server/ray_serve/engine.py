"""An engine replica: `ggmlpy serve`'s own FastAPI app (llama/server), run in-process.

The seam between the ingress and the engines is ASGI itself. The routes cannot run
apart from the model: validating a request and preparing its job need the tokenizer,
the chat template and the grammar compiler, and the response builders read the
`Sequence` that the scheduler steps. So each replica holds the whole server (model,
scheduler, routes), and the ingress hands it the HTTP request (a clean ASGI scope and
the body); the replica streams back the ASGI messages its app sends. Validation, errors
and SSE chunks are therefore those of `ggmlpy serve`, byte for byte, with one copy of
the route code. A stream the ingress cancels (its client went away) reaches the app as
`http.disconnect`, which frees the slot at the next step (llama/server/bridge.py).
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

from ray import serve

from llama.server.app import create_app
from llama.server.config import ServerConfig

REPLICA_HEADER = b"x-ggmlpy-replica"


class EngineReplica:
    """One model, one continuous-batching scheduler, `config.parallel` slots."""

    def __init__(self, config: ServerConfig):
        self.app = create_app(config)
        self.state = state = self.app.state.server
        # Loaded here, not in a background thread: Serve routes to a replica only once
        # its constructor returned, so a replica that takes requests holds its model.
        state.load()
        if state.load_error is not None:
            raise RuntimeError(f"the model failed to load: {state.load_error}")
        self.replica_id = serve.get_replica_context().replica_id.unique_id

    async def http(self, scope: dict, body: bytes, *, affinity: str | None = None,
                   replica: str | None = None) -> AsyncIterator[list[dict]]:
        """Run one HTTP request through the app; yield its ASGI messages in batches.

        `affinity` and `replica` are for the router (router.py), not used here.
        Messages already queued are sent together: one Ray streaming item per batch."""
        out: asyncio.Queue[dict | None] = asyncio.Queue()
        gone = asyncio.Event()
        body_sent = False

        async def receive() -> dict:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REPLICA_HEADER, self.replica_id.encode())]}
            await out.put(message)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            finally:
                out.put_nowait(None)

        task = asyncio.create_task(run())
        try:
            while True:
                first = await out.get()
                if first is None:
                    return
                batch = [first]
                while not out.empty():
                    nxt = out.get_nowait()
                    if nxt is None:
                        yield batch
                        return
                    batch.append(nxt)
                yield batch
        finally:  # done, or cancelled by the ingress: the app sees its client leave
            gone.set()
            if not task.done():
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(task), 1.0)
                task.cancel()

    def info(self) -> dict[str, Any]:
        return {"replica": self.replica_id, "slots": self.state.config.parallel}

    def __del__(self) -> None:
        """Serve calls this when it stops the replica: the worker thread ends too."""
        if self.state.scheduler is not None:
            self.state.scheduler.stop()
