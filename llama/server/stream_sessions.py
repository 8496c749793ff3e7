"""Resumable streams, as llama-server's (tools/server/server-stream.cpp): a streamed request with
an `X-Conversation-Id` header keeps the bytes of its SSE stream in a session under that id.

- The generation goes on when the client disconnects: a task of the server's event loop drives
  the stream into the session, and the response only reads the session.
- `GET /v1/stream?conv_id=ID&from=N` replays the bytes from offset N and follows the live ones
  until the stream ends (404 for an unknown or expired id, 400 for an offset no longer held).
- `DELETE /v1/stream?conv_id=ID` stops the generation and forgets the session (204, also for
  an id already gone).
- `POST /v1/streams/lookup` with `{"conversation_ids": [...]}` reports the sessions of the ids
  it is given (an id also matches its `ID::model` variants), never the others.

A new request under the same id replaces (and stops) the old session. A session holds its
last MAX_BYTES; a finished one is forgotten TTL_SECONDS after it ended.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from llama.server.errors import APIError, bad_request
from llama.server.generate import SSE_HEADERS, read_body

log = logging.getLogger(__name__)

MAX_BYTES = 4 * 1024 * 1024
TTL_SECONDS = 300


class StreamSession:
    """One stream's bytes: `total` written so far, of which the first `dropped` are gone."""

    def __init__(self, conversation_id: str):
        self.conversation_id = conversation_id
        self.started_at = int(time.time())
        self.completed_at = 0          # llama-server's 0: still running
        self.dropped = 0
        self._buf = bytearray()
        self._changed = asyncio.Condition()
        self._driver: asyncio.Task | None = None

    @property
    def total(self) -> int:
        return self.dropped + len(self._buf)

    @property
    def done(self) -> bool:
        return self.completed_at != 0

    def start(self, source: AsyncIterator[str]) -> None:
        """Drive `source` (the SSE text of a response) into the session on the event loop."""
        self._driver = asyncio.get_running_loop().create_task(self._drive(source))

    def stop(self) -> None:
        """Stop the generation: the driver is cancelled, which closes the source (and its
        finally releases the request's slot)."""
        if self._driver is not None:
            self._driver.cancel()

    async def _drive(self, source: AsyncIterator[str]) -> None:
        try:
            async for text in source:
                await self._write(text.encode("utf-8"))
        except Exception:   # the stream's own errors go out as events; anything else ends it here
            log.exception("resumable stream %s failed", self.conversation_id)
        finally:
            async with self._changed:
                self.completed_at = int(time.time())
                self._changed.notify_all()

    async def _write(self, data: bytes) -> None:
        async with self._changed:
            self._buf += data
            extra = len(self._buf) - MAX_BYTES
            if extra > 0:
                del self._buf[:extra]
                self.dropped += extra
            self._changed.notify_all()

    async def read_from(self, offset: int) -> AsyncIterator[bytes]:
        """The bytes from `offset` on, as they come, until the stream ends (a reader that
        fell behind the kept bytes stops)."""
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: self.total > offset or self.done)
                if offset < self.dropped:
                    return
                chunk = bytes(self._buf[offset - self.dropped:])
                finished = self.done
            if chunk:
                offset += len(chunk)
                yield chunk
            elif finished:
                return

    def describe(self) -> dict:
        return {"conversation_id": self.conversation_id, "is_done": self.done, "total_bytes": self.total,
                "started_at": self.started_at, "completed_at": self.completed_at}


class StreamSessions:
    """The server's sessions by conversation id."""

    def __init__(self) -> None:
        self._sessions: dict[str, StreamSession] = {}

    def _expire(self) -> None:
        cutoff = time.time() - TTL_SECONDS
        for key in [k for k, s in self._sessions.items() if s.done and s.completed_at <= cutoff]:
            del self._sessions[key]

    def start(self, conversation_id: str, source: AsyncIterator[str]) -> StreamSession:
        self._expire()
        self.stop(conversation_id)
        session = self._sessions[conversation_id] = StreamSession(conversation_id)
        session.start(source)
        return session

    def get(self, conversation_id: str) -> StreamSession | None:
        self._expire()
        return self._sessions.get(conversation_id)

    def stop(self, conversation_id: str) -> None:
        session = self._sessions.pop(conversation_id, None)
        if session is not None:
            session.stop()

    def lookup(self, ids: list[str]) -> list[dict]:
        self._expire()
        return [s.describe() for i in ids for key, s in self._sessions.items()
                if key == i or key.startswith(i + "::")]


def register(app: FastAPI, sessions: StreamSessions, body_limit: int) -> None:
    """GET and DELETE /v1/stream, POST /v1/streams/lookup (llama-server's routes)."""

    def conversation(request: Request) -> str:
        conv_id = request.query_params.get("conv_id", "")
        if not conv_id:
            raise bad_request("Missing conversation id (conv_id)")
        return conv_id

    @app.get("/v1/stream")
    async def replay(request: Request):
        session = sessions.get(conversation(request))
        if session is None:
            raise APIError(404, "Stream not found or expired", type="not_found_error")
        try:
            offset = int(request.query_params.get("from", "0"))
        except ValueError:
            raise bad_request("Invalid 'from' offset") from None
        if offset < session.dropped or offset < 0:
            raise bad_request("Stream offset lost, please restart")
        return StreamingResponse(session.read_from(offset), media_type="text/event-stream", headers=SSE_HEADERS)

    @app.delete("/v1/stream")
    async def stop(request: Request):
        sessions.stop(conversation(request))
        return Response(status_code=204)

    @app.post("/v1/streams/lookup")
    async def lookup(request: Request):
        body = await read_body(request, body_limit)
        ids = body.get("conversation_ids", [])
        if not isinstance(ids, list):
            raise bad_request('"conversation_ids" must be an array of strings')
        return JSONResponse(sessions.lookup([i for i in ids if isinstance(i, str) and i]))
