"""The ingress: one HTTP front for every engine replica (Ray Serve).

Every request but four is relayed whole to an engine replica (engine.py), whose
app is `ggmlpy serve`'s own: same endpoints, validation, errors and SSE chunks. The
ingress adds the guards `ggmlpy serve` has (API keys, body limit, CORS: the same
`install_guards`) and answers what spans the replicas:

- `GET /health`: 200 once at least one replica holds its model (a replica is routable
  only after its constructor loaded it), with the counts; 503 "Loading model" before.
- `GET /metrics`: each replica's Prometheus text, merged: counters and additive gauges
  summed under llama-server's names (dashboards built for one server keep working),
  throughputs recomputed from the summed counters, per-slot averages averaged, plus
  `ggmlpy:replicas`.
- `GET /slots`: every replica's slots, each tagged with its `replica` id.
- `POST /slots/{id}`: slot files act on one replica's slot: `?replica=ID` from /slots.

Each answer carries `x-ggmlpy-replica`, the replica that produced it. When the client
goes away, Serve cancels this request; the relay then cancels the engine call, which
reaches the engine's app as a disconnect and frees the slot.
"""
from __future__ import annotations

import asyncio
import json
import weakref
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.responses import Response, StreamingResponse

from llama.server.ray_serve.metrics import merge_metrics
from llama.server.app import install_guards
from llama.server.config import ServerConfig
from llama.server.errors import APIError, bad_request
from llama.server.generate import sse

ENGINE_ERRORS = (RayError, RayServeException)
GENERATION_PATHS = {"/v1/chat/completions", "/chat/completions", "/v1/completions",
                    "/completions", "/completion"}
INTERNAL_TIMEOUT_S = 5.0
# Engine calls go over Serve's inter-deployment gRPC (`_by_reference=False`) with plain
# pickle, not as Ray tasks whose every streamed item is an object in Ray's object store:
# a streamed token is a few hundred bytes, and with 4 clients on 2 vCPUs this took the
# ingress's CPU from 1.55-1.74 to 0.95-1.13 s per 1024 tokens and the aggregate from
# 102-111 to 112-119 tok/s (docs/distributed.md). The replicas run that gRPC server either
# way; Ray's token check guards it.
STREAM_OPTIONS = {"stream": True, "_by_reference": False, "request_serialization": "pickle",
                  "response_serialization": "pickle"}
# (app, deployment) -> the PrefixAffinityRouter of this process's handles to it
ROUTERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def affinity_text(path: str, body: bytes) -> str | None:
    """What the router matches against the replicas' caches: the chat's messages in
    order (a next turn extends them) or the completion prompt; None for anything else."""
    if path not in GENERATION_PATHS:
        return None
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None  # the engine answers the 400
    if not isinstance(obj, dict):
        return None
    messages, prompt = obj.get("messages"), obj.get("prompt")
    if isinstance(messages, list):
        return "".join(f"{m.get('role')}\x1f{json.dumps(m.get('content'))}\x1e"
                       for m in messages if isinstance(m, dict))
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return " ".join(map(str, prompt))
    return None


def engine_scope(scope: dict, *, method: str | None = None, path: str | None = None) -> dict:
    """A picklable copy of the parts of an ASGI scope the engine's app reads."""
    path = path if path is not None else scope["path"]
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": scope.get("http_version", "1.1"),
            "method": method or scope["method"], "scheme": scope.get("scheme", "http"),
            "path": path, "raw_path": path.encode(), "root_path": "",
            "query_string": scope.get("query_string", b"") if method is None else b"",
            "headers": [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])],
            "client": tuple(scope["client"]) if scope.get("client") else None,
            "server": tuple(scope["server"]) if scope.get("server") else None}


async def read_limited(request: Request, limit: int) -> bytes:
    """The body, refused past `limit` bytes while it arrives (chunked bodies too)."""
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise APIError(413, f"the request body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _unavailable(e: BaseException) -> APIError:
    return APIError(503, f"no engine replica could serve the request: {type(e).__name__}",
                    headers={"Retry-After": "1"})


async def relay(gen: DeploymentResponseGenerator) -> Response:
    """The engine's ASGI messages as this app's response: streamed for SSE, whole else."""
    batches = gen.__aiter__()
    try:
        first = await batches.__anext__()
    except StopAsyncIteration:
        raise APIError(500, "the engine replica sent no response") from None
    except ENGINE_ERRORS as e:
        gen.cancel()
        raise _unavailable(e) from None
    start, rest = first[0], first[1:]
    headers = [(bytes(k), bytes(v)) for k, v in start.get("headers", [])]
    is_sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                 for k, v in headers)
    if not is_sse:
        parts = [m.get("body", b"") for m in rest]
        try:
            async for batch in batches:
                parts += [m.get("body", b"") for m in batch]
        except ENGINE_ERRORS as e:
            raise _unavailable(e) from None
        response = Response(b"".join(parts), status_code=start["status"])
        response.raw_headers = headers
        return response

    async def body() -> AsyncIterator[bytes]:
        try:
            for m in rest:
                yield m.get("body", b"")
            async for batch in batches:
                for m in batch:
                    yield m.get("body", b"")
        except ENGINE_ERRORS as e:  # the status is sent already: the error goes as an event
            yield sse(_unavailable(e).body()).encode()
        finally:
            gen.cancel()  # a no-op once done; else the engine sees its client leave

    response = StreamingResponse(body(), status_code=start["status"])
    response.raw_headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    return response


class Cluster:
    """The engine replicas as the ingress sees them: routed calls and pinned ones."""

    def __init__(self, engine: DeploymentHandle):
        self.engine = engine

    def stream(self, scope: dict, body: bytes, **routing: Any) -> DeploymentResponseGenerator:
        return self.engine.options(**STREAM_OPTIONS).http.remote(scope, body, **routing)

    async def replica_ids(self) -> list[str]:
        """The replicas the handle's router can route to (none while they load)."""
        key = (self.engine.app_name, self.engine.deployment_name)
        router = ROUTERS.get(key)
        if router is None:  # the handle builds its router on its first call
            response = self.engine.info.remote()
            try:
                await asyncio.wait_for(asyncio.shield(response), 2.0)
            except (asyncio.TimeoutError, *ENGINE_ERRORS):
                response.cancel()
            router = ROUTERS.get(key)
        return router.replica_ids() if router is not None else []

    async def each(self, request: Request, path: str) -> list[tuple[str, int, bytes]]:
        """GET `path` on every replica, one after the other (calls made by one request
        share its id, which Serve's router uses to match a replica to its request)."""
        out = []
        for rid in await self.replica_ids():
            gen = self.stream(engine_scope(request.scope, method="GET", path=path), b"",
                              replica=rid)
            try:
                status, body = await asyncio.wait_for(_collect(gen), INTERNAL_TIMEOUT_S)
            except (asyncio.TimeoutError, *ENGINE_ERRORS):
                gen.cancel()
                continue
            out.append((rid, status, body))
        return out


async def _collect(gen: DeploymentResponseGenerator) -> tuple[int, bytes]:
    status, parts = 500, []
    async for batch in gen:
        for m in batch:
            if m["type"] == "http.response.start":
                status = m["status"]
            else:
                parts.append(m.get("body", b""))
    return status, b"".join(parts)


def create_ingress_app(engine: DeploymentHandle, config: ServerConfig) -> FastAPI:
    app = FastAPI(title="ggmlpy server (Ray Serve)", docs_url=None, redoc_url=None,
                  openapi_url=None)
    install_guards(app, config)
    cluster = Cluster(engine)

    @app.get("/health")
    @app.get("/v1/health")
    async def health(request: Request) -> dict:
        ids = await cluster.replica_ids()
        ok = [rid for rid, status, _ in await cluster.each(request, "/health") if status == 200]
        if not ok:
            raise APIError(503, "Loading model")
        return {"status": "ok", "replicas": len(ok), "replicas_routable": len(ids)}

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if not config.metrics:
            raise APIError(501, "This server does not support metrics endpoint. Start it with "
                           "`--metrics`", type="not_supported_error")
        texts = [b.decode() for _, s, b in await cluster.each(request, "/metrics") if s == 200]
        if not texts:
            raise APIError(503, "Loading model")
        return Response(merge_metrics(texts), media_type="text/plain; version=0.0.4")

    @app.get("/slots")
    async def slots(request: Request) -> list[dict]:
        if not config.slots:
            raise APIError(501, "This server does not support slots endpoint. Start it with "
                           "`--slots`", type="not_supported_error")
        out = []
        for rid, status, body in await cluster.each(request, "/slots"):
            if status == 200:
                out += [{**slot, "replica": rid} for slot in json.loads(body)]
        if not out:
            raise APIError(503, "Loading model")
        return out

    @app.post("/slots/{slot_id}")
    async def slot_action(slot_id: int, request: Request, replica: str = "") -> Response:
        ids = await cluster.replica_ids()
        if not replica and len(ids) == 1:
            replica = ids[0]
        if replica not in ids:
            raise bad_request("name the replica: ?replica=ID, one of the ids /slots lists")
        body = await read_limited(request, config.body_limit)
        scope = engine_scope(request.scope)
        scope["query_string"] = b"&".join(p for p in request.scope["query_string"].split(b"&")
                                          if not p.startswith(b"replica="))
        return await relay(cluster.stream(scope, body, replica=replica))

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
    async def forward(request: Request, path: str) -> Response:
        body = await read_limited(request, config.body_limit)
        affinity = affinity_text(request.scope["path"], body) if request.method == "POST" else None
        return await relay(cluster.stream(engine_scope(request.scope), body, affinity=affinity))

    return app
