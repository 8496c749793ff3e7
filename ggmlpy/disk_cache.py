"""Compiled code on disk, for every backend: one format, one keying, one corruption rule.

A backend names what its code depends on as key parts (the IR's or source's sha256, the
target, tool versions, flags), as JAX's cache_key does; the key is the sha256 of the sorted
parts, so nothing else decides whether code is reused. Each backend has its own folder
(`cpu`, `cuda`) under `GGMLPY_CACHE`, else ~/.cache/ggmlpy. An entry is two files there:

    <key><suffix>   the payload (object code, cubin, PTX, shared library)
    <key>.json      {"format": 1, "parts": {...}, "sha256": the payload's sha256}

A missing entry is a miss. An unreadable, stale (its record names other parts or another
format) or corrupt (sha256 mismatch: a torn write, a flipped bit) one is never returned: it
is reported, removed and counted as a miss, so the caller rebuilds and stores it again.
Every file is written under a temporary name and renamed into place, so readers never see
half a file; a crash between the two renames leaves a record whose hash the payload fails,
which is the corrupt case above.

A small index maps a cheap key to a value the backend checks itself (the CPU backend's plan
key to its IR hash), so a warm start can find its code before it has built what the real
key hashes.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Mapping

log = logging.getLogger("ggmlpy.cache")

FORMAT = 1
MAX_EVENTS = 256  # the latest events are enough for tests and reports; a server runs for weeks


def cache_dir(backend: str, root: str | None = None) -> Path:
    """The folder of `backend`'s entries: <root>/<backend>, else ~/.cache/ggmlpy/<backend>.
    root None: Options.from_env().cache_dir ($GGMLPY_CACHE), read now, not at import."""
    if root is None:
        from ggmlpy.options import Options

        root = Options.from_env().cache_dir
    return (Path(root) if root else Path.home() / ".cache" / "ggmlpy") / backend


def source_digest(*folders: Path, extra: str = "") -> str:
    """The sha256 of every .py file under `folders` (each named relative to its folder's
    parent), then `extra`: the key part that ties cached results to the code that made
    them, so any edit to that code misses the cache."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            digest.update(str(path.relative_to(folder.parent)).encode())
            digest.update(path.read_bytes())
    digest.update(extra.encode())
    return digest.hexdigest()


def cache_key(parts: Mapping[str, str]) -> str:
    """The hex sha256 of the sorted key parts: equal parts, equal key, in any order."""
    return hashlib.sha256(json.dumps(dict(parts), sort_keys=True).encode()).hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """`data` at `path` through a unique temporary name in the same folder (threads and
    processes may store the same entry at once); raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class DiskCache:
    """One backend's entries. `hits`, `misses` and `discards` count lookups; `events` keeps
    the latest (event, detail) pairs, which are also logged to "ggmlpy.cache"."""

    def __init__(self, backend: str, directory: str | os.PathLike | None = None):
        self.backend = backend
        self.dir = Path(directory) if directory is not None else cache_dir(backend)
        self.hits = 0
        self.misses = 0
        self.discards = 0
        self.events: collections.deque[tuple[str, str]] = collections.deque(maxlen=MAX_EVENTS)

    def paths(self, parts: Mapping[str, str], suffix: str = ".bin") -> tuple[Path, Path]:
        """(payload, record) file of the entry for `parts`."""
        key = cache_key(parts)
        return self.dir / f"{key}{suffix}", self.dir / f"{key}.json"

    def get(self, parts: Mapping[str, str], suffix: str = ".bin") -> bytes | None:
        """The payload stored for `parts`, or None (a miss: build it and `put` it)."""
        key = cache_key(parts)
        payload_path, record_path = self.paths(parts, suffix)
        if not payload_path.exists() or not record_path.exists():
            self.misses += 1
            self._event("miss", f"{key}: not in the cache")
            return None
        try:
            record = json.loads(record_path.read_text())
            data = payload_path.read_bytes()
        except (OSError, ValueError) as e:
            return self._discard(key, payload_path, record_path, f"unreadable entry ({e})")
        if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("parts") != dict(parts):
            return self._discard(key, payload_path, record_path, "stale entry (its key parts or format differ)")
        if record.get("sha256") != hashlib.sha256(data).hexdigest():
            return self._discard(key, payload_path, record_path, "corrupt object file (sha256 mismatch)")
        self.hits += 1
        self._event("hit", key)
        return data

    def put(self, parts: Mapping[str, str], payload: bytes, suffix: str = ".bin") -> None:
        """Store `payload` for `parts`. A failed write (read-only or full disk) is logged and
        only costs the next start a rebuild."""
        payload_path, record_path = self.paths(parts, suffix)
        record = {"format": FORMAT, "parts": dict(parts), "sha256": hashlib.sha256(payload).hexdigest()}
        try:
            write_atomic(payload_path, payload)
            write_atomic(record_path, json.dumps(record, sort_keys=True).encode())
        except OSError as e:
            log.warning("could not write the %s cache entry %s: %s", self.backend, payload_path, e)
            return
        self._event("store", cache_key(parts))

    def discard(self, parts: Mapping[str, str], suffix: str = ".bin", why: str = "unusable") -> None:
        """Remove the entry `get` just returned for `parts` because its caller could not use
        it (a payload that passed the checks here but does not load): that lookup then counts
        as a miss and a discard, not a hit."""
        self.hits -= 1
        payload_path, record_path = self.paths(parts, suffix)
        self._discard(cache_key(parts), payload_path, record_path, why)

    def recall(self, name: str) -> str | None:
        """The value `remember` stored under `name`, or None; the caller checks it."""
        try:
            return (self.dir / "index" / name).read_text().strip()
        except (OSError, ValueError):  # missing, or not text: as good as missing
            return None

    def remember(self, name: str, value: str) -> None:
        """Index `value` under `name` (a file name: hex keys are). A failed write is logged."""
        try:
            write_atomic(self.dir / "index" / name, value.encode())
        except OSError as e:
            log.warning("could not write the %s cache index: %s", self.backend, e)

    def _event(self, event: str, detail: str) -> None:
        self.events.append((event, detail))
        log.log(logging.WARNING if event == "discard" else logging.INFO,
                "%s object cache %s: %s", self.backend, event, detail)

    def _discard(self, key: str, payload_path: Path, record_path: Path, why: str) -> None:
        self.misses += 1
        self.discards += 1
        self._event("discard", f"{key}: {why}")
        for path in (payload_path, record_path):
            try:
                path.unlink(missing_ok=True)
            except OSError:  # a read-only cache: the entry is skipped, only not removed
                pass
        return None
