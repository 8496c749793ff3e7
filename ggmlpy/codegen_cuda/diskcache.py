"""Compiled kernel modules cached on disk, keyed by named parts (source hash, target, tool
version, flags) as JAX's cache_key does, and checked on the way out.

Each entry is one file: a header line with the payload's length and sha256, then the
payload. An entry whose header or hash does not match (a torn write, a flipped bit) is
reported, deleted and treated as a miss, so the caller rebuilds it. Writes go to a temporary
file first and are renamed into place, so readers never see half an entry.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Mapping

log = logging.getLogger("ggmlpy.codegen_cuda.cache")

MAGIC = b"ggmlpy-kernel-cache v1"


def default_cache_dir() -> Path:
    """`$GGMLPY_CACHE/cuda` (the CPU backend's cache root too; GGMLPY_CACHE_DIR is an older
    name for it), else ~/.cache/ggmlpy/cuda."""
    base = os.environ.get("GGMLPY_CACHE") or os.environ.get("GGMLPY_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "ggmlpy") / "cuda"


def cache_key(parts: Mapping[str, str]) -> str:
    """A stable hex key from named parts; the parts are logged so a miss can be explained."""
    text = "\n".join(f"{k}={parts[k]}" for k in sorted(parts))
    key = hashlib.sha256(text.encode()).hexdigest()
    log.debug("cache key %s from %s", key[:16], {k: (v if len(v) < 80 else v[:16] + "...") for k, v in parts.items()})
    return key


class DiskCache:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0
        self.corrupt = 0

    def path(self, key: str, suffix: str = ".bin") -> Path:
        return self.root / key[:2] / (key + suffix)

    def get(self, key: str, suffix: str = ".bin") -> bytes | None:
        path = self.path(key, suffix)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            self.misses += 1
            return None
        payload = _unwrap(raw)
        if payload is None:
            self.corrupt += 1
            self.misses += 1
            log.warning("kernel cache entry %s is corrupt: deleting it and rebuilding", path)
            path.unlink(missing_ok=True)
            return None
        self.hits += 1
        return payload

    def put(self, key: str, payload: bytes, suffix: str = ".bin") -> Path:
        path = self.path(key, suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = b"%s %d %s\n" % (MAGIC, len(payload), hashlib.sha256(payload).hexdigest().encode())
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header + payload)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def _unwrap(raw: bytes) -> bytes | None:
    """The payload of an entry, or None when its header, length or hash is wrong."""
    end = raw.find(b"\n")
    if end < 0:
        return None
    fields = raw[:end].split(b" ")
    if len(fields) != 4 or b" ".join(fields[:2]) != MAGIC or not fields[2].isdigit():
        return None
    payload = raw[end + 1:]
    if len(payload) != int(fields[2]):
        return None
    if hashlib.sha256(payload).hexdigest().encode() != fields[3]:
        return None
    return payload
