"""The isolates a built-in tool can run in (llama-server's `tools_io_isolate`): a running
docker/podman container (`<engine> exec`) or a host over ssh. Every operation is a command
run there, so an isolate must offer a POSIX shell with `sh`, `cat`, `wc`, `mkdir`, `dirname`,
`find` and `timeout`."""
from __future__ import annotations

import re
from abc import abstractmethod
from typing import Callable, Optional

from llama.server.tools.process import ExecResult, OnChunk, run_process
from llama.server.tools.toolsio import (GIT_LS_FILES_MAX_OUTPUT, JUNK_DIR_NAMES, ListEntry, Listing, ToolsIO,
                                        entry_depth, split_lines)

ISOLATE_EXEC_TIMEOUT = 15                     # seconds, the helper commands run in an isolate
ISOLATE_READ_FILE_MAX_SIZE = 64 * 1024 * 1024


def shell_quote_join(argv: list[str]) -> str:
    """One string that a POSIX shell splits back into exactly `argv`."""
    return " ".join("'" + arg.replace("'", "'\\''") + "'" for arg in argv)


class IsolateIO(ToolsIO):
    """A container or remote host: every operation is a command run there. Paths are POSIX
    paths of the isolate."""

    @abstractmethod
    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        """The host command that runs `inner` (a POSIX argv) in the isolate."""

    def resolve(self, path: str) -> str:
        if not self.cwd or path.startswith("/"):
            return path
        return f"{self.cwd}/{path}"

    def is_directory(self, path: str) -> bool:
        return self._test("-d", self.resolve(path))

    def is_regular_file(self, path: str) -> bool:
        return self._test("-f", self.resolve(path))

    def file_size(self, path: str) -> Optional[int]:
        res = self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64, True)
        found = re.match(r"\s*(\d+)", res.text)
        if res.exit_code != 0 or res.timed_out or found is None:
            return None
        return int(found.group(1))

    def read_file(self, path: str) -> Optional[bytes]:
        res = self._exec(["cat", "--", self.resolve(path)], ISOLATE_READ_FILE_MAX_SIZE, False)
        return res.data if res.exit_code == 0 and not res.timed_out else None

    def write_file(self, path: str, content: bytes) -> bool:
        # the content travels on stdin: nothing for the far side to re-parse, no temp file here
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        res = run_process(self.build_argv(["sh", "-c", script, "_", self.resolve(path)], True),
                          4096, ISOLATE_EXEC_TIMEOUT, stdin_data=content)
        return res.exit_code == 0 and not res.timed_out

    def list_entries(self, base: str, max_depth: int, kind: str) -> Listing:
        abs_base = self.resolve(base)
        if not self.is_directory(base):
            return Listing(err="path does not exist or is not a directory")
        if kind == "file":
            res = self._exec(["sh", "-c", 'cd "$1" && git ls-files --cached --others --exclude-standard',
                              "_", abs_base], GIT_LS_FILES_MAX_OUTPUT, True)
            if res.exit_code == 0 and not res.timed_out:
                return Listing([ListEntry(rel) for rel in split_lines(res.text, False)
                                if max_depth <= 0 or entry_depth(rel) <= max_depth])
        out = Listing()
        if kind in ("dir", "all"):
            out.entries += [ListEntry(rel, True) for rel in self._find(abs_base, max_depth, True, out)]
        if kind in ("file", "all"):
            out.entries += [ListEntry(rel) for rel in self._find(abs_base, max_depth, False, out)]
        return out

    def run(self, argv: list[str], max_output: int, timeout: float, on_chunk: Optional[OnChunk] = None,
            alive: Optional[Callable[[], bool]] = None) -> ExecResult:
        # killing the client here does not kill what runs in the isolate, so `timeout` runs
        # there too; the host-side limit leaves it a few seconds to act first
        inner = ["timeout", f"{int(timeout)}s", *argv]
        if self.cwd:  # no transport has a `-w` for this; 127 is a shell's "could not run"
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return run_process(self.build_argv(inner, True), max_output, timeout + 5, on_chunk, alive=alive)

    def _exec(self, inner: list[str], max_output: int, combine_stderr: bool) -> ExecResult:
        return run_process(self.build_argv(inner, False), max_output, ISOLATE_EXEC_TIMEOUT,
                           combine_stderr=combine_stderr)

    def _test(self, flag: str, path: str) -> bool:
        res = self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", path], 4096, True)
        return res.exit_code == 0 and not res.timed_out

    def _find(self, abs_base: str, max_depth: int, dirs: bool, out: Listing) -> list[str]:
        """One `find` pass: junk directories are printed (when listing directories) but pruned.
        -mindepth/-maxdepth work with busybox as well as GNU find."""
        prune = " -o ".join(f"-name {name}" for name in sorted(JUNK_DIR_NAMES))
        cmd = 'cd "$1" && find . -mindepth 1'
        if max_depth > 0:
            cmd += f" -maxdepth {max_depth}"
        cmd += f" \\( {prune} \\) -prune"
        cmd += " -print -o -type d -print" if dirs else " -o -type f -print"
        res = self._exec(["sh", "-c", cmd, "_", abs_base], GIT_LS_FILES_MAX_OUTPUT, True)
        out.truncated = out.truncated or res.timed_out
        return split_lines(res.text, True)


class ContainerIO(IsolateIO):
    """A running container, driven through `<engine> exec` (docker and podman alike)."""

    def __init__(self, engine: str, container_id: str, cwd: str = ""):
        super().__init__(cwd)
        self.engine = engine
        self.container_id = container_id

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        return [self.engine, "exec", *(["-i"] if needs_stdin else []), self.container_id, *inner]


class SshIO(IsolateIO):
    """A remote host over ssh. This is remoting, not isolation: the tools can do whatever the
    target account can. No console, so no prompts: key-based auth and a known host key only."""

    SSH_ARGV = ("ssh", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no",
                "-o", "KbdInteractiveAuthentication=no", "-o", "StrictHostKeyChecking=yes")

    def __init__(self, target: str, cwd: str = ""):
        super().__init__(cwd)
        self.target = target

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        # the remote shell re-parses the command line, so `inner` travels as one quoted word
        return [*self.SSH_ARGV, *([] if needs_stdin else ["-n"]), self.target, shell_quote_join(inner)]
