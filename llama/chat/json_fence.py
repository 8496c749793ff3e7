"""A JSON answer's ```json fence, left out of the content as llama.cpp's parsers leave it out:
they take a response format's answer fenced or bare (reply.py's `ReplyStream`, and Muse
Glimmer's answer message, muse_glimmer.py)."""
from __future__ import annotations

from typing import Optional

import regex

_FENCE_OPEN, _FENCE_CLOSE = "```json", "```"
_MAYBE_CLOSE = regex.compile(r"\s*`{0,3}\s*\Z")


class JsonFence:
    """Content with a ```json fence around it taken out, streamed: the start is held until
    it is known whether it opens a fence; inside one, an end that could be the closing
    fence (blanks and backticks) is held until more text shows it is not."""

    def __init__(self) -> None:
        self._held = ""
        self._fenced: Optional[bool] = None   # None: not known yet

    def feed(self, text: str, final: bool = False) -> str:
        text = self._held + text
        self._held = ""
        if self._fenced is None:
            stripped = text.lstrip()
            if stripped.startswith(_FENCE_OPEN):
                self._fenced, text = True, stripped[len(_FENCE_OPEN):].lstrip()
            elif not final and (not stripped or _FENCE_OPEN.startswith(stripped)):
                self._held = text
                return ""
            else:
                self._fenced = False
        if not self._fenced:
            return text
        m = _MAYBE_CLOSE.search(text)
        tail = text[m.start():] if m else ""
        if final:
            return text[:len(text) - len(tail)] + ("" if tail.strip() == _FENCE_CLOSE else tail)
        self._held = tail
        return text[:len(text) - len(tail)]

    def finish(self) -> str:
        return self.feed("", final=True)
