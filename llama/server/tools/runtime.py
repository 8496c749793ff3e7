"""Which runtime a built-in tool call runs in (llama-server's `make_tools_io` and
`--tools-runtime`). The spec comes from the `x-tool-runtime` header or the server's
`--tools-runtime`: empty (or `local`) is this host, `docker-container:<id>` and
`podman-container:<id>` attach to a running container, `ssh:<target>` runs on a remote host,
and for `--tools-runtime` only, `docker:<image>`/`podman:<image>` is a container the server
starts and stops. A spec that names something else never falls back to the host: the caller
asked for an isolate, so the call fails (`ToolFailure`).
"""
from __future__ import annotations

import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple, Optional

from llama.server.tools.base import ToolFailure
from llama.server.tools.isolate import ContainerIO, SshIO
from llama.server.tools.toolsio import LocalIO, ToolsIO

CONTAINER_ENGINES = ("docker", "podman")
_SSH_TARGET = re.compile(r"[A-Za-z0-9._@-]+")
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class ContainerSpec(NamedTuple):
    engine: str
    arg: str        # the image when the runtime spawns the container, its id when it attaches
    attach: bool


def parse_container_spec(spec: str) -> Optional[ContainerSpec]:
    """`<engine>-container:<id>` attaches to a running container, `<engine>:<image>` spawns one."""
    for engine in CONTAINER_ENGINES:
        if spec.startswith(f"{engine}-container:"):
            return ContainerSpec(engine, spec[len(engine) + len("-container:"):], True)
        if spec.startswith(f"{engine}:"):
            return ContainerSpec(engine, spec[len(engine) + 1:], False)
    return None


def valid_ssh_target(target: str) -> bool:
    """ssh reads options from its argv: a target such as `-oProxyCommand=...` would run a
    command on this host, so only plain `user@host.name` characters pass."""
    return not target.startswith("-") and _SSH_TARGET.fullmatch(target) is not None


def valid_container_id(container_id: str) -> bool:
    """The id lands on `<engine> exec`'s command line: one that looks like an option
    (`--privileged`) must not pass."""
    return _CONTAINER_ID.fullmatch(container_id) is not None


def is_local(runtime: Optional[str]) -> bool:
    """Whether a runtime spec means this host: none given, or `local`."""
    return not runtime or runtime == "local"


def make_io(runtime: Optional[str], cwd: Optional[str]) -> ToolsIO:
    """The I/O for one call, or ToolFailure for a runtime spec that is not one."""
    cwd = cwd or ""
    if is_local(runtime):
        return LocalIO(cwd)
    container = parse_container_spec(runtime)
    if container is not None:
        # spawning belongs to the runtime that owns the container; a call only attaches
        if not container.attach:
            raise ToolFailure(f"tool runtime must name a running container: {runtime}")
        if not valid_container_id(container.arg):
            raise ToolFailure(f"invalid container id: {container.arg}")
        return ContainerIO(container.engine, container.arg, cwd)
    if runtime.startswith("ssh:"):
        target = runtime[len("ssh:"):]
        if not valid_ssh_target(target):
            raise ToolFailure(f"invalid ssh target: {target}")
        return SshIO(target, cwd)
    raise ToolFailure(f"unknown tool runtime: {runtime}")


def check_runtime(spec: str) -> None:
    """Reject a bad `--tools-runtime` at start rather than at the first call.
    `<engine>:<image>` is valid here (the server spawns that container, see `open_runtime`)."""
    container = parse_container_spec(spec)
    if container is not None and not container.attach:
        if not container.arg:
            raise ToolFailure(f"--tools-runtime {container.engine}:<image> requires an image name")
        return
    make_io(spec, None)


class ToolsRuntime:
    """`--tools-runtime` once the server started: `spec()` is the runtime each call runs in."""

    def __init__(self, spec: str):
        self._spec = spec

    def spec(self) -> str:
        return self._spec

    def close(self) -> None:
        """Release what the runtime owns (nothing, for a target that already existed)."""


class SpawnedContainer(ToolsRuntime):
    """`<engine>:<image>`: a container this server starts (`<engine> run --rm -i <image> sh`,
    kept alive by its open stdin), respawns when it died, and stops on `close()`."""

    START_TIMEOUT = 10.0  # seconds for the engine to write the container's id

    def __init__(self, engine: str, image: str):
        super().__init__(f"{engine}:{image}")
        self.engine = engine
        self.image = image
        self._lock = threading.Lock()
        self._proc: Optional[subprocess.Popen] = None
        self._container_id = ""
        self._spawn()

    def spec(self) -> str:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._spawn()
            return f"{self.engine}-container:{self._container_id}"

    def close(self) -> None:
        # closing stdin ends the container's shell (its pid 1); --rm then removes it
        with self._lock:
            if self._proc is None:
                return
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def _spawn(self) -> None:
        with tempfile.TemporaryDirectory(prefix="llama-tools-runtime-") as tmp:
            cidfile = Path(tmp) / "cid"
            try:
                self._proc = subprocess.Popen(
                    [self.engine, "run", "--rm", "-i", "--cidfile", str(cidfile), self.image, "sh"],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except OSError as e:
                raise ToolFailure(f"failed to spawn {self.engine} container for tools runtime "
                                  f"(image: {self.image})") from e
            deadline = time.monotonic() + self.START_TIMEOUT
            cid = ""
            while not cid and time.monotonic() < deadline and self._proc.poll() is None:
                cid = cidfile.read_text().strip() if cidfile.exists() else ""
                if not cid:
                    time.sleep(0.1)
        if not cid:
            self._proc.kill()
            self._proc.wait()
            raise ToolFailure(f"timed out waiting for {self.engine} container to start (image: {self.image})")
        self._container_id = cid


def open_runtime(spec: str) -> ToolsRuntime:
    """The runtime `--tools-runtime` names: a spawned container for `<engine>:<image>`,
    else the (checked) spec itself."""
    check_runtime(spec)
    container = parse_container_spec(spec)
    if container is not None and not container.attach:
        return SpawnedContainer(container.engine, container.arg)
    return ToolsRuntime(spec)
