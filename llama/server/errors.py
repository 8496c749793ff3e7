"""Errors in OpenAI's shape (`{"error": {"code", "message", "type"}}`), as llama-server
returns them, so clients written for either see the same status codes and types."""
from __future__ import annotations

from fastapi.responses import JSONResponse

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 413: "invalid_request_error", 500: "server_error",
         501: "not_supported_error", 503: "unavailable_error"}


class APIError(Exception):
    """An error with its HTTP status; `headers` such as Retry-After go out with it."""

    def __init__(self, status: int, message: str, *, type: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or TYPES.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"code": self.status, "message": self.message, "type": self.type}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str) -> APIError:
    return APIError(400, message)
