"""`/cors-proxy?url=...` (GET and POST), llama-server's proxy for browser pages that talk to
MCP servers on other origins, served with `--ui-mcp-proxy` (the app answers 403 without).

Only the headers the page names for the target go out: `x-llama-server-proxy-header-<name>`
becomes `<name>`; the client's own credentials (Authorization, cookies, API keys) never
reach the target. The target's status, content type and body come back as they arrive
(streamed, so an MCP server's event stream passes through). http and https only, no
credentials in the URL.
"""
from __future__ import annotations

from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from llama.server.errors import APIError

PREFIX = "x-llama-server-proxy-header-"
TIMEOUT = httpx.Timeout(600.0)   # llama-server's read and write timeouts


def forwarded_headers(headers) -> dict[str, str]:
    """The headers the page asked to send to the target."""
    out = {}
    for key, value in headers.items():
        if key.lower().startswith(PREFIX) and len(key) > len(PREFIX):
            out[key[len(PREFIX):]] = value
    return out


def check_target(url: str | None) -> str:
    """`url` if the proxy may fetch it, else a 500 naming what is wrong (llama-server's)."""
    parts = urlsplit(url or "")
    if not parts.hostname:
        raise APIError(500, "invalid target URL: missing host")
    if parts.password:
        raise APIError(500, "authentication in target URL is not supported")
    if parts.scheme not in ("http", "https"):
        raise APIError(500, f"unsupported URL scheme in target URL: {parts.scheme}")
    return url if parts.path else url + "/"


def register(app: FastAPI) -> None:
    async def proxy(request: Request):
        url = check_target(request.query_params.get("url"))
        client = httpx.AsyncClient(timeout=TIMEOUT)
        upstream = client.build_request(request.method, url, headers=forwarded_headers(request.headers),
                                        content=await request.body() if request.method == "POST" else None)
        try:
            response = await client.send(upstream, stream=True)
        except httpx.HTTPError as e:
            await client.aclose()
            raise APIError(500, f"proxy request to {url} failed: {e}") from None

        async def close() -> None:
            await response.aclose()
            await client.aclose()
        media = response.headers.get("content-type")
        return StreamingResponse(response.aiter_bytes(), status_code=response.status_code, media_type=media,
                                 background=BackgroundTask(close))

    app.add_api_route("/cors-proxy", proxy, methods=["GET", "POST"])
