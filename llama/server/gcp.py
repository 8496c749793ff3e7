"""Vertex AI's prediction protocol, as llama-server speaks it when started with
`AIP_MODE=PREDICTION` (Google Cloud's custom-container contract):

- `POST $AIP_PREDICT_ROUTE` (default `/predict`) takes `{"instances": [...]}`, each instance
  a request body naming its endpoint in `@requestFormat`: a camelCase alias of a route
  (`chatCompletions` for `/v1/chat/completions`, `applyTemplate` for `/apply-template`) or
  the route's path. The instances run concurrently through the app's own routes (API key,
  limits and errors as if sent directly), never streamed; the answer is
  `{"predictions": [...]}` in their order, a failed instance holding `{"error": ...}`.
- `GET $AIP_HEALTH_ROUTE`, when set, answers as `/health`.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Mapping

from fastapi import FastAPI, Request
from starlette.routing import Route

from llama.server.errors import APIError, bad_request
from llama.server.generate import read_body

MAX_INSTANCES = 128


@dataclass(frozen=True)
class VertexRoutes:
    predict: str
    health: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "VertexRoutes | None":
        """The routes the AIP_* variables ask for, or None when not serving for Vertex AI
        (`ggmlpy serve` reads them from its environment into the server's config)."""
        if env.get("AIP_MODE") != "PREDICTION":
            return None
        return cls(_slashed(env.get("AIP_PREDICT_ROUTE") or "/predict"),
                   _slashed(env["AIP_HEALTH_ROUTE"]) if env.get("AIP_HEALTH_ROUTE") else None)


def _slashed(path: str) -> str:
    return path if path.startswith("/") else "/" + path


def format_alias(path: str) -> str:
    """A route's camelCase `@requestFormat`: `/v1/chat/completions` -> `chatCompletions`."""
    if path.startswith("/v1"):
        path = path[3:]
    words = [w for w in path.strip("/").replace("-", "/").replace("_", "/").split("/") if w]
    return "".join(w if i == 0 else w[:1].upper() + w[1:] for i, w in enumerate(words))


def register(app: FastAPI, routes: VertexRoutes, body_limit: int) -> None:
    """Add the predict route (and the health alias) to `app`; call after its other routes."""
    posts = [r.path for r in app.routes if isinstance(r, Route) and "POST" in (r.methods or ())
             and "{" not in r.path]
    aliases: dict[str, str] = {}
    for path in posts:
        aliases.setdefault(format_alias(path), path)
    if routes.health is not None:
        health = next(r for r in app.routes if isinstance(r, Route) and r.path == "/health")
        app.add_api_route(routes.health, health.endpoint, methods=["GET"])

    @app.post(routes.predict)
    async def predict(request: Request):
        body = await read_body(request, body_limit)
        instances = body.get("instances")
        if not isinstance(instances, list):
            raise bad_request("request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            raise bad_request(f"instances array exceeds maximum size of {MAX_INSTANCES}")

        async def one(instance: Any) -> Any:
            if not isinstance(instance, dict):
                return APIError(400, "each instance must be a JSON object").body()
            fmt = instance.get("@requestFormat")
            if not isinstance(fmt, str):
                return APIError(400, "each instance must include a string @requestFormat").body()
            path = aliases.get(fmt) or (fmt if fmt in posts else None)
            if path is None:
                return APIError(400, f"no handler registered for @requestFormat: {fmt}").body()
            payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
            if "stream" in payload:
                payload["stream"] = False
            return await _call(request, path, payload)

        return {"predictions": await asyncio.gather(*(one(i) for i in instances))}


async def _call(request: Request, path: str, payload: dict) -> Any:
    """POST `payload` to `path` through the whole app (its middleware included), the
    original request's headers kept: the answer's JSON (its text if not JSON)."""
    raw = json.dumps(payload).encode()
    headers = [(k, v) for k, v in request.scope["headers"] if k.lower() not in (b"content-length", b"content-type")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    scope = dict(request.scope, path=path, raw_path=path.encode(), query_string=b"", headers=headers,
                 method="POST")
    scope.pop("route", None)
    scope.pop("endpoint", None)
    sent = False
    chunks: list[bytes] = []

    async def receive() -> dict:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()   # like a client that keeps the connection open
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await request.app(scope, receive, send)
    text = b"".join(chunks)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text.decode("utf-8", "replace")
