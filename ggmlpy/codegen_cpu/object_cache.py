"""The CPU backend's object code in the shared disk cache (ggmlpy.disk_cache, folder `cpu`).

An object is keyed by the IR's sha256 and the host (triple, CPU, features, llvmlite and
LLVM versions). Building the IR is most of a cold start's Python time, so each program's
plan key (ProgramBuilder.plan_key: its kernels and the code generator's source) is also
indexed to the IR hash it produced: a warm start finds its object code without any IR.
"""
from __future__ import annotations

import hashlib
import os

from ggmlpy.codegen_cpu.target import host
from ggmlpy.disk_cache import DiskCache

FORMAT_VERSION = 1  # of the object code's conventions (symbols, node table), not of the files
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

    def load_plan(self, plan_key: str) -> bytes | None:
        """Object code by a program's plan key. No index record (or a garbled one) is a miss
        that is not counted: the caller then builds the IR and takes the `load` path."""
        ir_sha256 = self.recall(plan_key)
        if ir_sha256 is None or len(ir_sha256) != 64:
            return None
        return self.get(object_parts(ir_sha256), SUFFIX)

    def remember_plan(self, plan_key: str, ir_text: str) -> None:
        self.remember(plan_key, hashlib.sha256(ir_text.encode()).hexdigest())
