"""In-memory cache of compiled graphs by topology signature (docs/architecture.md, decision 3)."""
from __future__ import annotations

import logging
from typing import Callable

from ggmlpy.sched.scheduler import CompiledGraph

log = logging.getLogger("ggmlpy.cache")


class GraphCache:
    """One compile per signature: every ubatch size and KV length shares the entry."""

    def __init__(self) -> None:
        self.entries: dict[str, CompiledGraph] = {}
        self.hits = 0
        self.misses = 0

    def get_or_compile(self, signature: str, compile_fn: Callable[[], CompiledGraph]) -> CompiledGraph:
        entry = self.entries.get(signature)
        if entry is not None:
            self.hits += 1
            log.debug("graph cache hit %s", signature)
            return entry
        self.misses += 1
        log.info("graph cache miss %s: compiling", signature)
        entry = compile_fn()
        self.entries[signature] = entry
        return entry
