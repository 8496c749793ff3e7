"""The one exception type a malformed GGUF file produces."""
from __future__ import annotations


class GGUFError(ValueError):
    """A GGUF file is malformed or unsupported; the message names the file, field and offset."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None):
        self.path = path
        self.offset = offset
        self.reason = message
        where = f" (at byte offset {offset})" if offset is not None else ""
        prefix = f"{path}: " if path else ""
        super().__init__(f"{prefix}{message}{where}")
