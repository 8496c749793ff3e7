"""`create_app(config)`: the FastAPI app. It only translates (docs/architecture.md, decision 11):
bodies become `prepare_chat`/`prepare_completion` jobs for the scheduler, events become
OpenAI's (or llama-server's) responses. Security as llama-server: API keys compared in
constant time with `/health` and `/v1/models` public, a request body limit, CORS as
llama-server answers it (llama/server/cors.py). The chat page at `/` (llama/server/webui.py)
unless `--no-ui`.
"""
from __future__ import annotations

import contextlib
import hmac
import threading

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import URL, Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from llama.server import cors_proxy, gcp, rerank, routes_llama, routes_openai, stream_sessions, webui
from llama.server.config import ServerConfig
from llama.server.cors import ALLOW_ORIGIN, allowed_origin, preflight_headers
from llama.server.errors import APIError, feature_disabled
from llama.server.metrics import samples
from llama.server.sleep import IdleSleeper
from llama.server.state import ServerState
from llama.server.stream_sessions import StreamSessions
from llama.server.tools import routes as tool_routes
from llama.server.tools.toolbox import Toolbox

PUBLIC = {"/health", "/v1/health", "/models", "/v1/models"}
# uvicorn's HTTP implementation: h11 writes header names as the app spells them (httptools
# lowercases them), and clients written for llama-server (its own test suite among them)
# read `Access-Control-Allow-Origin` and `Process-Start-Time-Unix` by that spelling.
HTTP_PROTOCOL = "h11"


def create_app(config: ServerConfig, *, load_in_background: bool = True) -> FastAPI:
    state = ServerState(config)
    toolbox = Toolbox(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        loader = threading.Thread(target=state.load, name="ggmlpy-load", daemon=True)
        loader.start()
        if not load_in_background:
            loader.join()
        await run_in_threadpool(toolbox.start)   # MCP servers warm up before the first request
        sleeper = None
        if config.sleep_idle_seconds >= 0:
            sleeper = IdleSleeper(state, config.sleep_idle_seconds,
                                  lambda: samples(state.scheduler) if state.scheduler is not None else [])
            sleeper.start()
        yield
        if sleeper is not None:
            sleeper.stop()
        toolbox.close()
        loader.join(timeout=60)
        if state.scheduler is not None:
            state.scheduler.stop()

    app = FastAPI(title="ggmlpy server", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.server = state
    app.state.toolbox = toolbox
    app.state.streams = StreamSessions()
    install_guards(app, config)
    routes_openai.register(app, state)
    routes_llama.register(app, state)
    rerank.register(app, state)
    stream_sessions.register(app, app.state.streams, config.body_limit)
    if config.ui_mcp_proxy:
        cors_proxy.register(app)
    else:
        disabled(app, "/cors-proxy", ["GET", "POST"])
    if toolbox.enabled:
        tool_routes.register(app, toolbox.tools, runtime=lambda: toolbox.runtime, body_limit=config.body_limit)
    else:
        disabled(app, "/tools", ["GET", "POST"])
    if config.vertex is not None:   # AIP_MODE=PREDICTION: serving for Google Cloud's Vertex AI
        gcp.register(app, config.vertex, config.body_limit)
    if config.webui:
        webui.register(app)
    return app


class Server(uvicorn.Server):
    """uvicorn's server on `HTTP_PROTOCOL`, which on SIGTERM/SIGINT first stops the app's
    tools: a running MCP call or shell command answers at once, so the drain does not wait
    for it (llama-server closes its MCP servers first too)."""

    def __init__(self, app: FastAPI, **config) -> None:
        super().__init__(uvicorn.Config(app, http=HTTP_PROTOCOL, **config))
        self.app = app

    def handle_exit(self, sig, frame) -> None:
        self.app.state.toolbox.close()
        super().handle_exit(sig, frame)


def disabled(app: FastAPI, path: str, methods: list[str]) -> None:
    """`path` answered as llama-server answers a feature it was not started with: 403."""
    async def refuse():
        return feature_disabled()
    app.add_api_route(path, refuse, methods=methods)


def install_guards(app: FastAPI, config: ServerConfig) -> None:
    """The middleware and error handlers every front of the server shares: API keys, the
    body limit, CORS, errors in OpenAI's shape. `create_app` installs them, and so does
    the Ray Serve ingress (llama.server.ray_serve.app), so both answer alike."""
    app.add_middleware(Guard, config=config)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = "File Not Found" if exc.status_code == 404 else str(exc.detail)
        return APIError(exc.status_code, message).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return APIError(400, str(exc)).response()


class Guard:
    """The body limit and the API keys, checked before a request reaches its route, and
    CORS: a preflight answered here, the allowed origin added to every other answer.

    A plain ASGI middleware rather than `@app.middleware("http")`: Starlette's
    BaseHTTPMiddleware hands every chunk of a streamed response from one task to another
    through an anyio memory stream, and with a token per chunk that hand-over was a fifth of
    the event loop's time at 4 streaming clients (py-spy). Here the response passes
    through untouched."""

    def __init__(self, app: ASGIApp, config: ServerConfig) -> None:
        self.app = app
        self.config = config
        # the chat page is public, as llama-server's; `/` even without it, so that it is a 404
        # whether or not a key is given (llama-server skips the key check for `/` either way)
        self.public = PUBLIC | (webui.PATHS if config.webui else {"/"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = Headers(scope=scope).get("origin")
            if scope["method"] == "OPTIONS":
                await send({"type": "http.response.start", "status": 200,
                            "headers": preflight_headers(self.config, origin)})
                await send({"type": "http.response.body", "body": b""})
                return
            allow = allowed_origin(self.config, origin)
            if allow is not None:
                send = _with_origin(send, allow.encode())
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> APIError | None:
        config = self.config
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > config.body_limit):
            return APIError(413, f"the request body exceeds {config.body_limit} bytes")
        if config.api_keys and URL(scope=scope).path not in self.public and not _key_ok(headers, config.api_keys):
            return APIError(401, "Invalid API Key")
        return None


def _with_origin(send: Send, origin: bytes) -> Send:
    """send, adding Access-Control-Allow-Origin to the answer's headers."""
    async def send_with_origin(message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message, headers=[*message.get("headers", []), (ALLOW_ORIGIN, origin)])
        await send(message)
    return send_with_origin


def _key_ok(headers: Headers, keys: list[str]) -> bool:
    """Bearer token or X-Api-Key, compared to every key in constant time."""
    auth = headers.get("authorization", "")
    given = auth[7:] if auth.lower().startswith("bearer ") else headers.get("x-api-key", "")
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given.encode(), key.encode())
    return ok
