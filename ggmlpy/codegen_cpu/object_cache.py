"""The CPU backend's object code in the shared disk cache (ggmlpy.disk_cache, folder `cpu`).

An object (one compile unit: a kernel, or a program's entry function) is keyed by its IR's
sha256 and the host (triple, CPU, features, llvmlite and LLVM versions). Building the IR is
most of a cold start's Python time, so each program's plan key (ProgramBuilder.plan_key: its
kernels and the code generator's source) is also indexed to its units, by name and IR hash:
a warm start finds its object code without any IR.
"""
from __future__ import annotations

import hashlib
import json
import os

from ggmlpy.codegen_cpu.target import host
from ggmlpy.disk_cache import DiskCache

FORMAT_VERSION = 2  # of the object code's conventions (symbols, node table), not of the files
SUFFIX = ".o"


def object_parts(ir_sha256: str) -> dict[str, str]:
    """The key parts of the object compiled from IR whose sha256 is `ir_sha256`, here."""
    return {"format": str(FORMAT_VERSION), "ir_sha256": ir_sha256, **host().cache_key_parts()}


def key_parts(ir_text: str) -> dict[str, str]:
    return object_parts(hashlib.sha256(ir_text.encode()).hexdigest())


class ObjectCache(DiskCache):
    """Object code by IR text, or by plan key once `remember_plan` has indexed it."""

    def __init__(self, directory: str | os.PathLike | None = None):
        super().__init__("cpu", directory)

    def load(self, ir_text: str) -> bytes | None:
        return self.get(key_parts(ir_text), SUFFIX)

    def store(self, ir_text: str, data: bytes) -> None:
        self.put(key_parts(ir_text), data, SUFFIX)

    def load_plan(self, plan_key: str) -> list[tuple[str, str, bytes]] | None:
        """A program's units by its plan key: (name, IR sha256, object code) each. No index
        record (or a garbled one) is a miss that is not counted; a unit whose object is gone
        makes the whole plan a miss. Either way the caller builds the IR and takes the `load`
        path, unit by unit."""
        try:
            units = json.loads(self.recall(plan_key) or "null")
        except ValueError:
            return None
        if not isinstance(units, list) or not units:
            return None
        out = []
        for unit in units:
            if not (isinstance(unit, list) and len(unit) == 2 and all(isinstance(x, str) for x in unit)
                    and len(unit[1]) == 64):
                return None
            data = self.get(object_parts(unit[1]), SUFFIX)
            if data is None:
                return None
            out.append((unit[0], unit[1], data))
        return out

    def remember_plan(self, plan_key: str, units: list[tuple[str, str]]) -> None:
        """Index a program's units, (name, IR sha256) each, under its plan key."""
        self.remember(plan_key, json.dumps([list(u) for u in units]))
