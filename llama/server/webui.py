"""The chat page at `/`, as llama-server serves its web UI (off with `--no-ui`).

The page (llama/server/static/: index.html, chat.css, chat.js) is plain files, no build step
and no CDN: it talks only to this server's `/v1/chat/completions`. Like llama-server's, the
page itself is public under `--api-key` (it holds no secret; `Guard` lets `PATHS` through)
while its API calls carry the key the user types into its settings."""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import Response

STATIC = Path(__file__).parent / "static"
# URL path -> (file under STATIC, media type)
FILES = {"/": ("index.html", "text/html; charset=utf-8"),
         "/index.html": ("index.html", "text/html; charset=utf-8"),
         "/webui/chat.css": ("chat.css", "text/css; charset=utf-8"),
         "/webui/chat.js": ("chat.js", "text/javascript; charset=utf-8")}
PATHS = frozenset(FILES)
# Everything from this origin, nothing from elsewhere: the browser itself refuses a request
# that would leave the server (the icon is an empty data: URL, so no /favicon.ico 404).
HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; "
                                      "base-uri 'none'; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff",
           "Cache-Control": "no-cache"}


def register(app: FastAPI) -> None:
    """Serve the page's files at `PATHS` (read once: they are a few kilobytes)."""
    for path, (name, media_type) in FILES.items():
        app.add_api_route(path, _file_route((STATIC / name).read_bytes(), media_type), methods=["GET"],
                          include_in_schema=False)


def _file_route(body: bytes, media_type: str):
    async def serve() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)
    return serve
