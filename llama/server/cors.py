"""CORS as llama-server answers it (tools/server/server-http.cpp's pre-routing handler):

- `--cors-origins` "*" (the default): the request's Origin is reflected, with credentials;
- "localhost": reflected only when its host is localhost, 127.0.0.1 or ::1 (any port);
- otherwise a comma-separated list: an Origin on it is reflected (llama-server sends the
  list itself, which browsers refuse when it names more than one);
- a preflight (OPTIONS) is answered at once, 200 with an empty body, before the API key is
  asked for: Allow-Credentials, Allow-Methods (`--cors-methods`), Allow-Headers
  (`--cors-headers`), and the origin where allowed.
"""
from __future__ import annotations

from urllib.parse import urlsplit

from llama.server.config import ServerConfig

LOCALHOST = "localhost"
# Header names as llama-server writes them: some clients (the llama.cpp server suite among
# them) copy the headers into a plain dict and look them up by this spelling.
ALLOW_ORIGIN = b"Access-Control-Allow-Origin"
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


def allowed_origin(config: ServerConfig, origin: str | None) -> str | None:
    """The Access-Control-Allow-Origin value for a request from `origin`, or None."""
    if not origin:
        return None
    allowed = config.cors_origins.strip()
    if allowed == "*":
        return origin
    if allowed == LOCALHOST:
        try:
            host = urlsplit(origin).hostname
        except ValueError:
            return None
        return origin if host in LOCAL_HOSTS else None
    return origin if origin in {o.strip() for o in allowed.split(",")} else None


def preflight_headers(config: ServerConfig, origin: str | None) -> list[tuple[bytes, bytes]]:
    """The headers of the answer to an OPTIONS request."""
    headers = [(b"Access-Control-Allow-Credentials", b"true"),
               (b"Access-Control-Allow-Methods", config.cors_methods.encode()),
               (b"Access-Control-Allow-Headers", config.cors_headers.encode()),
               (b"Content-Length", b"0"), (b"Content-Type", b"text/html")]
    allow = allowed_origin(config, origin)
    if allow is not None:
        headers.append((ALLOW_ORIGIN, allow.encode()))
    return headers
