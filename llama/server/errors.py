"""Errors in OpenAI's shape (`{"error": {"code", "message", "type"}}`), as llama-server
returns them, so clients written for either see the same status codes and types."""
from __future__ import annotations

from fastapi.responses import JSONResponse

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 413: "invalid_request_error", 500: "server_error",
         499: "invalid_request_error", 501: "not_supported_error", 503: "unavailable_error"}


class APIError(Exception):
    """An error with its HTTP status; `headers` such as Retry-After go out with it."""

    def __init__(self, status: int, message: str, *, type: str | None = None,
                 headers: dict[str, str] | None = None, fields: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or TYPES.get(status, "server_error")
        self.headers = headers or {}
        self.fields = fields or {}   # more members of the error object (llama-server's n_ctx ...)

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message, "type": self.type, **self.fields}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def feature_disabled() -> JSONResponse:
    """llama-server's answer on the route of a feature it was not started with."""
    return JSONResponse({"error": {"code": 403, "message": "this feature is disabled", "type": "feature_disabled"}},
                        status_code=403)


def bad_request(message: str) -> APIError:
    return APIError(400, message)


def context_overflow(n_prompt: int, n_ctx: int) -> APIError:
    """llama-server's answer to a prompt longer than the slot's context (its WebUI keys on
    the type)."""
    return APIError(400, f"request ({n_prompt} tokens) exceeds the available context size "
                         f"({n_ctx} tokens), try increasing it", type="exceed_context_size_error",
                    fields={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx})
