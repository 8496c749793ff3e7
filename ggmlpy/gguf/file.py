"""`GGUFFile`: one model, possibly split over several files, as one metadata and tensor map."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ggmlpy.gguf.constants import (
    KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT, GGUFValueType,
)
from ggmlpy.gguf.errors import GGUFError
from ggmlpy.gguf.memlock import MemoryLock
from ggmlpy.gguf.reader import GGUFField, GGUFPart, TensorInfo

_INTEGER_TYPES = {GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
                  GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64}
_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def split_path(prefix: str | os.PathLike, split_no: int, split_count: int) -> Path:
    """llama.cpp's split naming: PREFIX-00001-of-00003.gguf (split_no counts from 0)."""
    return Path(f"{prefix}-{split_no + 1:05d}-of-{split_count:05d}.gguf")


def _split_int(part: GGUFPart, key: str, default: int | None) -> int | None:
    """An integer split key; any other type is a malformed file, not a Python TypeError."""
    f = part.fields.get(key)
    if f is None:
        return default
    if f.type not in _INTEGER_TYPES:
        raise GGUFError(f"{key} must be an integer, not {f.type.name}", path=str(part.path),
                        offset=f.offset)
    return int(f.value)


class GGUFFile:
    """A read-only GGUF model.

    `metadata` maps keys to Python values (numeric arrays as numpy arrays, string arrays as
    lazily decoded sequences); `fields` keeps the declared value types; `tensors` maps names
    to `TensorInfo` across every part of a split model.

    use_mmap=False reads every part into memory instead of mapping it (llama.cpp's
    `use_mmap`); a part whose mapping fails is read too. `mlock()` locks the bytes in RAM.
    """

    def __init__(self, path: str | os.PathLike, use_mmap: bool = True):
        self.path = Path(path)
        self._parts: list[GGUFPart] = []
        self._use_mmap = use_mmap
        self._lock = MemoryLock()
        try:
            first = GGUFPart(self.path, 0, use_mmap)
            self._parts.append(first)
            self._open_other_parts(first)
        except BaseException:
            self.close()
            raise
        self.version = first.version
        self.alignment = first.alignment
        self.fields: dict[str, GGUFField] = first.fields
        self.metadata: dict[str, Any] = {k: f.value for k, f in first.fields.items()}
        self.tensors: dict[str, TensorInfo] = {}
        for part in self._parts:
            for name, info in part.tensors.items():
                if name in self.tensors:
                    self.close()
                    raise GGUFError(f"tensor {name!r} appears in more than one split part",
                                    path=str(part.path))
                self.tensors[name] = info

    def _open_other_parts(self, first: GGUFPart) -> None:
        count = _split_int(first, KEY_SPLIT_COUNT, 1)
        if count < 0:
            raise GGUFError(f"{KEY_SPLIT_COUNT} is {count}", path=str(self.path),
                            offset=first.fields[KEY_SPLIT_COUNT].offset)
        if count <= 1:  # 0 or 1: not split (llama.cpp reads a missing key as 0)
            return
        no = _split_int(first, KEY_SPLIT_NO, 0)
        if no != 0:
            raise GGUFError(f"this is split part {no + 1} of {count}; open the first part",
                            path=str(self.path))
        m = _SPLIT_NAME.match(self.path.name)
        if not m or int(m["count"]) != count:
            raise GGUFError(f"{KEY_SPLIT_COUNT} is {count} but the file name does not follow "
                            f"NAME-00001-of-{count:05d}.gguf", path=str(self.path))
        prefix = self.path.parent / m["prefix"]
        for i in range(1, count):
            part_path = split_path(prefix, i, count)
            if not part_path.exists():
                raise GGUFError(f"split part {i + 1} of {count} is missing: {part_path}",
                                path=str(self.path))
            part = GGUFPart(part_path, i, self._use_mmap)
            self._parts.append(part)
            got_no = _split_int(part, KEY_SPLIT_NO, None)
            got_count = _split_int(part, KEY_SPLIT_COUNT, None)
            if got_no != i or got_count != count:
                raise GGUFError(f"inconsistent split part: expected {KEY_SPLIT_NO}={i} and "
                                f"{KEY_SPLIT_COUNT}={count}, found {got_no} and {got_count}",
                                path=str(part_path))
        total = _split_int(first, KEY_SPLIT_TENSORS_COUNT, None)
        found = sum(len(p.tensors) for p in self._parts)
        if total is not None and total != found:
            raise GGUFError(f"{KEY_SPLIT_TENSORS_COUNT} is {total} but the parts hold "
                            f"{found} tensors", path=str(self.path))

    @property
    def paths(self) -> list[Path]:
        return [p.path for p in self._parts]

    @property
    def file_size(self) -> int:
        """Bytes of every part together."""
        return sum(p.size for p in self._parts)

    @property
    def data_offset(self) -> int:
        return self._parts[0].data_offset

    @property
    def mapped(self) -> bool:
        """Whether every part is memory-mapped (False: read into memory)."""
        return all(p.mapped for p in self._parts)

    @property
    def locked_bytes(self) -> int:
        """Bytes `mlock` locked in RAM (0 when never asked or refused)."""
        return self._lock.locked_bytes

    def mlock(self) -> bool:
        """Lock every part's bytes in RAM, mapped or read (llama.cpp's use_mlock). False, with
        a warning, when the OS refuses for any part; the file stays usable either way."""
        ok = True
        for part in self._parts:
            ok = self._lock.lock(part.buffer, str(part.path)) and ok
        return ok

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def close(self) -> None:
        self._lock.unlock()  # while the regions are still mapped
        for part in self._parts:
            part.close()
        for info in getattr(self, "tensors", {}).values():
            info._buffer = None
        self._parts = []

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, version={self.version}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")
