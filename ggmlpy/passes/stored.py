"""The pass pipeline's result on disk, so that a warm start runs no pass.

A context runs its passes (dce, cse, view folding, fusion marks) over each graph it
compiles: about 0.3 s of Python for SmolLM2's two graphs on a 2 GHz core, a fifth of a warm
start there. The passes are pure functions of the graph (docs/architecture.md, decision 4) and a graph's
signature names everything they read (ops, types, shapes, strides, params, roles), so their
result is stored per signature, pass list and source version, next to the compiled code:

    <cache root>/graphs/<key>.pickle (+ .json)   the optimised graph (ggmlpy/ir/serial.py)

The key's parts are the input graph's signature, the pass names, a hash of the code the
passes run (ggmlpy/passes and ggmlpy/ir, like the CPU code generator's own hash), the
fusion rules the backends handed the fusion pass (fusion.rules_key: their names and the
source of their modules) and Python's version. An entry is checked like every cache entry (ggmlpy/disk_cache.py: format,
parts, sha256); one that does not load or breaks an IR invariant (check_graph) is removed
and the passes run again. A loaded graph takes fresh tensor ids, so it never shares an id
with a tensor of this process. Buffer planning is not stored: a context's backends plan
their own splits when they compile them (the pipeline's own plan is for dumps), so the
context runs every pass but "buffers".

Trust: an entry is a pickle, so whoever can write the cache folder can run code in every
process that reads it, exactly as with the object code stored beside it; keep the folder
(~/.cache/ggmlpy, or $GGMLPY_CACHE) private.
"""
from __future__ import annotations

import functools
import logging
import pickle
import sys
from pathlib import Path
from typing import Sequence

from ggmlpy.disk_cache import DiskCache, source_digest
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.serial import dump_graph, load_graph
from ggmlpy.passes.common import PassError, check_graph
from ggmlpy.passes.fusion import Rule, rules_key
from ggmlpy.passes.pipeline import BUFFERS, pipeline_name, run_pipeline

log = logging.getLogger("ggmlpy.cache")

SUFFIX = ".pickle"


@functools.lru_cache(maxsize=1)
def passes_version() -> str:
    """A hash of the code that turns a graph into its optimised graph (this package and
    ggmlpy.ir): any edit to it changes every key."""
    here = Path(__file__).resolve().parent
    return source_digest(here, here.parent / "ir")


class StoredPipeline:
    """Optimised graphs by input signature, on disk. `disk`'s counters and events say what
    each lookup found (hits, misses, discards)."""

    def __init__(self, directory: str | Path):
        self.disk = DiskCache("graphs", directory)

    def optimise(self, graph: Graph, signature: str, passes: Sequence[str],
                 rules: Sequence[Rule] | None = None) -> Graph:
        """`graph` after `passes` (less "buffers"), from the disk when stored, else computed
        and stored. `signature`: graph.signature(), which the caller already has; `rules`:
        the fusion pass's rules (pipeline.context_rules), needed when `passes` name it."""
        names = tuple(p for p in passes if p != BUFFERS)
        parts = self.key_parts(signature, names, rules)
        blob = self.disk.get(parts, SUFFIX)
        if blob is not None:
            loaded = self._load(blob)
            if loaded is not None:
                return loaded
            self.disk.discard(parts, SUFFIX, "the stored graph does not load or breaks an IR invariant")
        optimised = run_pipeline(graph, backend=pipeline_name(names), passes=names, rules=rules).graph
        self.disk.put(parts, dump_graph(optimised), SUFFIX)
        return optimised

    @staticmethod
    def key_parts(signature: str, passes: Sequence[str], rules: Sequence[Rule] | None = None) -> dict[str, str]:
        """The disk cache's key parts for the graph of `signature` after `passes` (less
        "buffers", which is not stored) with the fusion `rules`."""
        names = [p for p in passes if p != BUFFERS]
        return {"what": "optimised graph", "signature": signature, "passes": "+".join(names),
                "source": passes_version(), "python": "%d.%d" % sys.version_info[:2],
                "fusion_rules": rules_key(rules) if rules is not None and "fusion" in names else ""}

    @staticmethod
    def _load(blob: bytes) -> Graph | None:
        try:
            graph, _ = load_graph(blob, fresh_ids=True)
            check_graph(graph)
        except (pickle.UnpicklingError, PassError, AttributeError, ImportError, EOFError, KeyError,
                TypeError, ValueError, IndexError) as e:
            log.warning("stored optimised graph unusable: %s: %s", type(e).__name__, e)
            return None
        return graph
