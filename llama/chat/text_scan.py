"""Scanning helpers the stream readers share: whitespace skipped, and the end of the text so far
held back where it may be the start of a marker still arriving. Kept apart from the call
streams (call_streams.py) so that the tag readers (nested_tags.py), which those streams
import, can use them too."""
from __future__ import annotations

WS = " \t\n\r"


def skip_ws(text: str, i: int, limit: int) -> int:
    while i < limit and text[i] in WS:
        i += 1
    return i


def held(text: str, lo: int, limit: int, marker: str) -> int:
    """How much of the end of ``text[lo:limit]`` could be the start of ``marker`` (held back)."""
    i = text.find(marker[0], max(lo, limit - len(marker) + 1), limit)
    while i >= 0:
        if marker.startswith(text[i:limit]):
            return limit - i
        i = text.find(marker[0], i + 1, limit)
    return 0
