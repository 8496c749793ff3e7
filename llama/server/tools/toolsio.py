"""Where a built-in tool does its I/O (llama-server's `tools_io`): the interface every
runtime implements, and its implementation on this host (`LocalIO`). The isolates (a
container, a host over ssh) are in isolate.py; runtime.py picks one from a call's runtime.
"""
from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from llama.server.tools.process import ExecResult, OnChunk, run_process

GIT_LS_FILES_MAX_OUTPUT = 8 * 1024 * 1024
LIST_ENTRIES_TIMEOUT = 15                     # seconds, one listing (git and walker together)

# directories a listing reports but never descends into: they can be enormous
JUNK_DIR_NAMES = frozenset({
    ".git", ".svn", ".hg", "node_modules", "__pycache__",
    ".venv", "venv", "dist", "build", "target", ".cache", ".idea", ".vscode",
})


@dataclass
class ListEntry:
    rel: str              # '/'-separated, relative to the listed directory
    is_dir: bool = False


@dataclass
class Listing:
    entries: list[ListEntry] = field(default_factory=list)
    err: str = ""             # set when the base is not a directory
    truncated: bool = False   # the walk could not see everything (time budget, unreadable directory)


def split_lines(text: str, strip_dot_slash: bool) -> list[str]:
    """The paths a listing command (git, find) printed, one a line, as '/'-separated
    relative paths."""
    lines = []
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if not line:
            continue
        if strip_dot_slash:
            line = line.removeprefix("./")
        lines.append(line.replace("\\", "/"))
    return lines


def entry_depth(rel: str) -> int:
    """Depth of a '/'-separated relative path: "a/b/c" is 3."""
    return 1 + rel.count("/")


class ToolsIO(ABC):
    """The operations a tool needs, each done in one runtime. `cwd` resolves relative paths
    and is where commands run."""

    def __init__(self, cwd: str = ""):
        self.cwd = cwd

    @abstractmethod
    def resolve(self, path: str) -> str:
        """`path` against the working directory; an absolute path stays as it is."""

    @abstractmethod
    def is_directory(self, path: str) -> bool: ...

    @abstractmethod
    def is_regular_file(self, path: str) -> bool: ...

    @abstractmethod
    def file_size(self, path: str) -> Optional[int]:
        """The size of a regular file, None when it cannot be read."""

    @abstractmethod
    def read_file(self, path: str) -> Optional[bytes]: ...

    @abstractmethod
    def write_file(self, path: str, content: bytes) -> bool:
        """Write the file, creating its parent directories; False when that failed."""

    @abstractmethod
    def list_entries(self, base: str, max_depth: int, kind: str) -> Listing:
        """Entries under `base` (already resolved): `kind` "file", "dir" or "all"; `max_depth`
        0 is unlimited, 1 the direct children only. Files come from `git ls-files` when
        `base` is in a repository (so .gitignore applies), else from a walk that skips the
        junk directories."""

    @abstractmethod
    def run(self, argv: list[str], max_output: int, timeout: float, on_chunk: Optional[OnChunk] = None,
            alive: Optional[Callable[[], bool]] = None) -> ExecResult: ...


class LocalIO(ToolsIO):
    """This host: paths are the server's, `~` is its home directory."""

    def resolve(self, path: str) -> str:
        if path == "~" or path.startswith(("~/", "~\\")):
            path = os.path.expanduser("~") + path[1:]   # unchanged where there is no home directory
        if not os.path.isabs(path):
            path = os.path.join(self.cwd or os.getcwd(), path)
        # drop "." and ".." so they never reach git or the client; '/' for the web UI
        return os.path.normpath(path).replace("\\", "/")

    def is_directory(self, path: str) -> bool:
        return os.path.isdir(self.resolve(path))

    def is_regular_file(self, path: str) -> bool:
        return os.path.isfile(self.resolve(path))

    def file_size(self, path: str) -> Optional[int]:
        full = Path(self.resolve(path))
        try:
            return full.stat().st_size if full.is_file() else None
        except OSError:
            return None

    def read_file(self, path: str) -> Optional[bytes]:
        try:
            return Path(self.resolve(path)).read_bytes()
        except OSError:
            return None

    def write_file(self, path: str, content: bytes) -> bool:
        full = Path(self.resolve(path))
        try:
            full.parent.mkdir(parents=True, exist_ok=True)
            full.write_bytes(content)
        except OSError:
            return False
        return True

    def list_entries(self, base: str, max_depth: int, kind: str) -> Listing:
        if not os.path.isdir(base):
            return Listing(err="path does not exist or is not a directory")
        deadline = time.monotonic() + LIST_ENTRIES_TIMEOUT
        if kind == "file":  # git cannot list directories
            res = self.run(["git", "-C", base, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           GIT_LS_FILES_MAX_OUTPUT, LIST_ENTRIES_TIMEOUT)
            if res.exit_code == 0 and not res.timed_out:
                entries = []
                for rel in res.text.split("\0"):
                    rel = rel.replace("\\", "/")
                    if not rel or (max_depth > 0 and entry_depth(rel) > max_depth):
                        continue
                    if os.path.isfile(os.path.join(base, rel)):
                        entries.append(ListEntry(rel))
                return Listing(entries)
        return self._walk(base, max_depth, kind, deadline)

    def run(self, argv: list[str], max_output: int, timeout: float, on_chunk: Optional[OnChunk] = None,
            alive: Optional[Callable[[], bool]] = None) -> ExecResult:
        return run_process(argv, max_output, timeout, on_chunk, alive=alive, cwd=self.cwd)

    @staticmethod
    def _walk(base: str, max_depth: int, kind: str, deadline: float) -> Listing:
        """Depth first, names in order. A junk directory is listed but not entered, nor is a
        link (it can point back to an ancestor)."""
        out = Listing()
        stack = [(base, "", 0)]
        while stack:
            if time.monotonic() >= deadline:
                out.truncated = True
                return out
            directory, rel_dir, depth = stack.pop()
            try:
                with os.scandir(directory) as it:
                    items = sorted(it, key=lambda e: e.name)
            except PermissionError:
                continue
            except OSError:
                out.truncated = True
                continue
            subdirs = []
            for entry in items:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    continue
                if is_dir:
                    if kind != "file":
                        out.entries.append(ListEntry(rel, True))
                    name = entry.name.lower() if os.name == "nt" else entry.name
                    if name in JUNK_DIR_NAMES or entry.is_symlink():
                        continue
                    if max_depth == 0 or depth + 1 < max_depth:
                        subdirs.append((entry.path, rel, depth + 1))
                elif kind != "dir" and entry.is_file():
                    out.entries.append(ListEntry(rel))
            stack.extend(reversed(subdirs))
        return out
