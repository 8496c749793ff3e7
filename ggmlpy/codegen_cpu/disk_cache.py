"""Object code on disk, keyed by the IR hash, the CPU (name and features) and tool versions.

An entry is a `.o` file and a `.json` record naming its parts and the object's sha256. A
missing, unreadable, stale or corrupt entry is never executed: it is reported (why), removed
and rebuilt. Writes go to a temporary name first, so a crash never leaves half an entry.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from ggmlpy.codegen_cpu.target import host

log = logging.getLogger("ggmlpy.cache")

FORMAT_VERSION = 1


def cache_dir() -> Path:
    """`GGMLPY_CACHE` if set, else ~/.cache/ggmlpy/cpu."""
    root = os.environ.get("GGMLPY_CACHE")
    return Path(root) / "cpu" if root else Path.home() / ".cache" / "ggmlpy" / "cpu"


def key_parts(ir_text: str) -> dict[str, str]:
    parts = {"format": str(FORMAT_VERSION), "ir_sha256": hashlib.sha256(ir_text.encode()).hexdigest()}
    parts.update(host().cache_key_parts())
    return parts


def cache_key(parts: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


class ObjectCache:
    def __init__(self, directory: Path | None = None):
        self.dir = directory or cache_dir()
        self.hits = 0
        self.misses = 0
        self.events: list[tuple[str, str]] = []  # (event, detail) for tests and `ggmlpy bench`

    def _record(self, event: str, detail: str) -> None:
        self.events.append((event, detail))
        log.info("cpu object cache %s: %s", event, detail)

    def load(self, ir_text: str) -> bytes | None:
        return self._load(key_parts(ir_text))

    def load_plan(self, plan_key: str) -> bytes | None:
        """Object code by a program's plan key (ProgramBuilder.plan_key), through the small
        record `remember_plan` left: the IR hash it produced. A missing record is a miss
        (the caller then builds the IR and takes the normal path)."""
        try:
            ir_sha256 = (self.dir / "plans" / plan_key).read_text().strip()
        except OSError:
            return None
        if len(ir_sha256) != 64:
            return None
        parts = {"format": str(FORMAT_VERSION), "ir_sha256": ir_sha256}
        parts.update(host().cache_key_parts())
        return self._load(parts)

    def remember_plan(self, plan_key: str, ir_text: str) -> None:
        path = self.dir / "plans" / plan_key
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(hashlib.sha256(ir_text.encode()).hexdigest())
            os.replace(tmp, path)
        except OSError as e:
            log.warning("could not write the cpu plan index: %s", e)

    def _load(self, parts: dict[str, str]) -> bytes | None:
        key = cache_key(parts)
        obj_path, meta_path = self.dir / f"{key}.o", self.dir / f"{key}.json"
        if not obj_path.exists() or not meta_path.exists():
            self.misses += 1
            self._record("miss", f"{key}: not in the cache")
            return None
        try:
            meta = json.loads(meta_path.read_text())
            data = obj_path.read_bytes()
        except (OSError, ValueError) as e:
            return self._discard(key, f"unreadable entry ({e})")
        if meta.get("parts") != parts:
            return self._discard(key, "stale entry (CPU, tools or format differ)")
        if meta.get("object_sha256") != hashlib.sha256(data).hexdigest():
            return self._discard(key, "corrupt object file (sha256 mismatch)")
        self.hits += 1
        self._record("hit", key)
        return data

    def store(self, ir_text: str, data: bytes) -> None:
        parts = key_parts(ir_text)
        key = cache_key(parts)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            meta = {"parts": parts, "object_sha256": hashlib.sha256(data).hexdigest()}
            for path, payload in ((self.dir / f"{key}.o", data),
                                  (self.dir / f"{key}.json", json.dumps(meta).encode())):
                tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
                tmp.write_bytes(payload)
                os.replace(tmp, path)
            self._record("store", key)
        except OSError as e:  # a read-only or full disk only costs the next start a compile
            log.warning("could not write the cpu object cache: %s", e)

    def _discard(self, key: str, why: str) -> None:
        self.misses += 1
        self._record("discard", f"{key}: {why}")
        for suffix in (".o", ".json"):
            try:
                (self.dir / f"{key}{suffix}").unlink()
            except OSError:
                pass
        return None
