"""The MCP (Model Context Protocol) servers of `--mcp-servers-config FILE` and
`--mcp-servers-json JSON`, and their tools, as llama-server runs them (server-mcp.cpp).

The config is Cursor's: `{"mcpServers": {name: {"command", "args", "env", "cwd", "timeout_ms"}}}`.
Each server is a child process speaking JSON-RPC 2.0 on its stdin and stdout, one message a
line. At start every server is spawned, greeted (`initialize`, then
`notifications/initialized`), asked for its tools (`tools/list`) and stopped, all at once and
within a bounded time; a server that cannot be spawned or does not answer is left out, the
others serve. A tool `t` of server `s` is served as `s_t`; calling it spawns the server again
when it is not running (a crashed one is respawned on the next call, a command that cannot be
spawned is retried after a cooldown) and sends `tools/call`.

Calls from several threads share one process per server: each request has its own JSON-RPC id
and the one thread that reads the child's output hands each reply to the caller waiting for
that id, skipping notifications and lines that are not JSON. A call waits at most the server's
`timeout_ms`, and no longer than the caller is there or the servers are open.

Answers have llama-server's shape: `{"plain_text_response": text}` with the text parts of the
result joined by newlines, or `{"error": message}` (status 200) for a tool error, an RPC error,
a timeout or a server that is not there; llama-server never fails an MCP call with a 500, so
these tools never raise `ToolFailure`.

POSIX only: the child's pipes are polled with `selectors`, and the child runs in its own
process group so that stopping it stops its own children too.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import select
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from llama.server.tools.base import Emit, Tool, ToolCall
from llama.server.tools.mcp_config import McpServerConfig, McpToolDef, load_config, parse_servers

__all__ = ["McpServerConfig", "McpServers", "McpTool", "McpToolDef", "load_config", "parse_servers",
           "result_to_response"]

log = logging.getLogger("llama.server")

PROTOCOL_VERSION = "2024-11-05"
CLIENT_INFO = {"name": "ggmlpy", "version": "1.0"}
WARMUP_TIMEOUT_S = 10.0        # the whole warm-up at start, every server at once
COOLDOWN_S = 5.0               # after a failed spawn, calls answer "unavailable" this long
EXIT_GRACE_S = 0.5             # a stopping child gets this long after EOF, then after SIGTERM
POLL_S = 0.05                  # how often a wait looks at its deadline and at the caller
MAX_LINE = 8 << 20             # a longer line from a child is dropped
ERR_TAIL = 4096                # characters of a child's stderr kept to say why it died
MAX_PAGES = 100                # of a paginated tools/list

StopCheck = Callable[[], bool]
SPAWN_ERRORS = (OSError, ValueError, subprocess.SubprocessError)   # a missing command, a bad cwd, a NUL in args


def _error_message(reply: dict) -> str:
    """The message of a JSON-RPC error reply."""
    error = reply.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(error, str):
        return error
    return "unknown error"


def _rpc_error(message: str) -> dict:
    """A reply of our own making for a request that got none."""
    return {"error": {"code": -32603, "message": message}}


def result_to_response(result: object) -> dict:
    """A `tools/call` result as llama-server answers it: its text parts joined by newlines,
    or the error a result with `isError` carries."""
    text = ""
    content = result.get("content") if isinstance(result, dict) else None
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict) and part.get("type") == "text":
            if text:
                text += "\n"
            part_text = part.get("text", "")
            text += part_text if isinstance(part_text, str) else ""
    if isinstance(result, dict) and result.get("isError") is True:
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}


def _acquire(lock: threading.Lock, give_up: StopCheck) -> bool:
    """Take `lock` unless `give_up` says to stop waiting first."""
    while not lock.acquire(timeout=POLL_S):
        if give_up():
            return False
    return True


def _is_id(value: object) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


class _Lines:
    """Splits a child's output into lines; a line longer than MAX_LINE is dropped, so a
    child that never writes a newline cannot grow memory without bound."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.skipping = False   # inside a dropped line, until its newline

    def feed(self, chunk: bytes) -> list[bytes]:
        self.buf += chunk
        parts = self.buf.split(b"\n")
        self.buf = parts.pop()
        if self.skipping and parts:
            parts.pop(0)
            self.skipping = False
        if len(self.buf) > MAX_LINE:
            log.warning("MCP: dropping a line of more than %d bytes", MAX_LINE)
            self.buf = bytearray()
            self.skipping = True
        lines = [bytes(p[:-1]) if p.endswith(b"\r") else bytes(p) for p in parts]
        return [line for line in lines if line]


@dataclass
class _Waiter:
    """A request waiting for its reply."""
    done: threading.Event = field(default_factory=threading.Event)
    reply: Optional[dict] = None


class _Session:
    """One running MCP server: its process, the thread reading its output, and the requests
    waiting for replies, by id. Each (re)spawn is a new session; ids start at 1 again."""

    def __init__(self, config: McpServerConfig):
        self.config = config
        self.timeout_s = config.timeout_ms / 1000
        self._lock = threading.Lock()         # guards _pending, _next_id, _alive, _closed
        self._write_lock = threading.Lock()   # one message at a time on the child's stdin
        self._init_lock = threading.Lock()    # one initialize handshake at a time
        self._initialized = False
        self._pending: dict[object, _Waiter] = {}
        self._next_id = 1
        self._alive = False
        self._closed = False
        self._proc: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None
        self._err_tail = ""
        self.last_error = ""

    def start(self) -> None:
        """Spawn the child and the thread that reads it; one of SPAWN_ERRORS when it cannot be."""
        cfg = self.config
        env = {**os.environ, **cfg.env} if cfg.env else None
        self._proc = subprocess.Popen([cfg.command, *cfg.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, env=env, cwd=cfg.cwd, bufsize=0,
                                      start_new_session=True)
        for pipe in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            os.set_blocking(pipe.fileno(), False)
        self._alive = True
        self._reader = threading.Thread(target=self._read_loop, name=f"mcp-{cfg.name}", daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return self._alive and self._proc is not None and self._proc.poll() is None

    def diagnostics(self) -> str:
        """Why the server failed, for the log: its last error and the end of its stderr."""
        parts = [self.last_error] if self.last_error else []
        if self._err_tail:
            parts.append(f"last stderr: {self._err_tail.strip()}")
        return "; ".join(parts)

    # --- the child's output

    def _read_loop(self) -> None:
        """Read replies (stdout) and the child's log (stderr) until stdout ends, the child is
        gone or the session closes. Polled: a grandchild that inherited the pipes can keep
        them open after the child died, and a blocking read would then never return."""
        try:
            self._pump()
        finally:
            self._mark_dead()

    def _pump(self) -> None:
        out, err = self._proc.stdout.fileno(), self._proc.stderr.fileno()
        splitters = {out: _Lines(), err: _Lines()}
        with selectors.DefaultSelector() as sel:
            sel.register(out, selectors.EVENT_READ)
            sel.register(err, selectors.EVENT_READ)
            stdout_open = True
            while self._alive and stdout_open:
                ready = sel.select(POLL_S)
                if not ready and self._proc.poll() is not None:
                    return   # the child is gone and nothing is left to read
                for key, _ in ready:
                    try:
                        chunk = os.read(key.fd, 65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    if not chunk:
                        sel.unregister(key.fd)
                        stdout_open = stdout_open and key.fd != out
                        continue
                    for line in splitters[key.fd].feed(chunk):
                        if key.fd == out:
                            self._on_message(line)
                        else:
                            self._on_stderr(line)

    def _on_message(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            log.debug("MCP '%s': skipping a line that is not JSON", self.config.name)
            return
        if not isinstance(msg, dict):
            return
        if "method" in msg:
            if "id" in msg:
                self._answer(msg)
            else:
                log.debug("MCP '%s' notification: %s", self.config.name, msg.get("method"))
            return
        rid = msg.get("id")
        if not _is_id(rid):
            return
        with self._lock:
            waiter = self._pending.pop(rid, None)
            if waiter is not None:
                waiter.reply = msg
        if waiter is None:
            log.debug("MCP '%s': dropping a reply nobody waits for (id %r)", self.config.name, rid)
        else:
            waiter.done.set()

    def _answer(self, request: dict) -> None:
        """A request from the server: `ping` is answered; anything else asks for a capability
        we did not declare, which JSON-RPC answers with 'method not found'."""
        reply: dict = {"jsonrpc": "2.0", "id": request["id"]}
        if request["method"] == "ping":
            reply["result"] = {}
        else:
            reply["error"] = {"code": -32601, "message": f"Method not found: {request['method']}"}
        deadline = time.monotonic() + 1.0
        self._send(reply, lambda: time.monotonic() >= deadline)

    def _on_stderr(self, line: bytes) -> None:
        text = line.decode("utf-8", errors="replace")
        log.debug("MCP '%s' stderr: %s", self.config.name, text)
        self._err_tail = (self._err_tail + text + "\n")[-ERR_TAIL:]

    def _mark_dead(self) -> None:
        """No more replies will come: wake every waiting request."""
        with self._lock:
            self._alive = False
            waiters = list(self._pending.values())
            self._pending.clear()
        for waiter in waiters:
            waiter.done.set()

    # --- requests

    def _send(self, message: dict, give_up: StopCheck) -> bool:
        """Write one message; False when the child is gone or `give_up` says to stop first."""
        data = memoryview(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        if not _acquire(self._write_lock, give_up):
            return False
        try:
            if not self._alive:
                return False   # close() may have closed stdin
            fd = self._proc.stdin.fileno()
            total = len(data)
            while data:
                if not self._alive or give_up():
                    if len(data) < total:
                        self._mark_dead()   # half a message on the wire: the stream is lost
                    return False
                try:
                    data = data[os.write(fd, data):]
                except BlockingIOError:
                    select.select([], [fd], [], POLL_S)   # the child is not reading: wait a little
                except OSError:
                    self._mark_dead()
                    return False
            return True
        finally:
            self._write_lock.release()

    def _notify(self, method: str, params: Optional[dict] = None) -> None:
        message: dict = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        deadline = time.monotonic() + 1.0
        self._send(message, lambda: time.monotonic() >= deadline)

    def request(self, method: str, params: Optional[dict], should_stop: StopCheck,
                deadline: Optional[float] = None) -> dict:
        """Send a request and wait for its reply, or make one: 'cancelled' when `should_stop`,
        'request timed out' past the deadline (the server's timeout from now unless given),
        'transport closed' when the child is gone. The server is told of a request we stopped
        waiting for (`notifications/cancelled`), and a late reply is dropped."""
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        waiter = _Waiter()
        with self._lock:
            if not self._alive:
                return _rpc_error("transport closed")
            rid = self._next_id
            self._next_id += 1
            self._pending[rid] = waiter

        def give_up() -> bool:
            return should_stop() or time.monotonic() >= deadline

        message: dict = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            message["params"] = params
        sent = self._send(message, give_up)
        if sent:
            while not waiter.done.is_set() and not give_up():
                waiter.done.wait(min(POLL_S, max(0.0, deadline - time.monotonic())))
        with self._lock:
            self._pending.pop(rid, None)
        if waiter.reply is not None:
            return waiter.reply
        if should_stop():
            reason = "cancelled"
        elif time.monotonic() >= deadline:
            reason = "request timed out"
        else:
            return _rpc_error("transport closed")
        if sent and self._alive:
            self._notify("notifications/cancelled", {"requestId": rid, "reason": reason})
        return _rpc_error(reason)

    def _ensure_init(self, should_stop: StopCheck, deadline: Optional[float] = None) -> Optional[str]:
        """The initialize handshake, once per process; the error when it fails."""
        if self._initialized:
            return None
        if not _acquire(self._init_lock, should_stop):
            return "initialize failed: cancelled"
        try:
            if self._initialized:
                return None
            params = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": CLIENT_INFO}
            reply = self.request("initialize", params, should_stop, deadline)
            if "result" not in reply:
                self.last_error = f"initialize failed: {_error_message(reply)}"
                return self.last_error
            self._notify("notifications/initialized")
            self._initialized = True
            return None
        finally:
            self._init_lock.release()

    def list_tools(self, should_stop: StopCheck, deadline: float) -> list[McpToolDef]:
        """The server's tools (every page of them); none when it fails (see last_error)."""
        if self._ensure_init(should_stop, min(deadline, time.monotonic() + self.timeout_s)) is not None:
            return []
        tools: list[McpToolDef] = []
        cursor = None
        for _ in range(MAX_PAGES):
            reply = self.request("tools/list", {"cursor": cursor} if cursor else None, should_stop,
                                 min(deadline, time.monotonic() + self.timeout_s))
            result = reply.get("result")
            if not isinstance(result, dict):
                self.last_error = f"tools/list failed: {_error_message(reply)}"
                return tools
            listed = result.get("tools")
            for t in listed if isinstance(listed, list) else []:
                if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
                    log.warning("MCP '%s': skipping a tool without a name", self.config.name)
                    continue
                description = t.get("description")
                tools.append(McpToolDef(server=self.config.name, name=t["name"],
                                        description=description if isinstance(description, str) else "",
                                        input_schema=t.get("inputSchema")))
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
        return tools

    def call_tool(self, tool: str, arguments: object, should_stop: StopCheck) -> dict:
        """`tools/call`, answered as llama-server answers it."""
        error = self._ensure_init(should_stop)
        if error is not None:
            return {"error": error}
        reply = self.request("tools/call", {"name": tool, "arguments": arguments}, should_stop)
        if "error" in reply:
            return {"error": _error_message(reply)}
        if "result" in reply:
            return result_to_response(reply["result"])
        return {"error": "invalid response from MCP server"}

    # --- stopping

    def close(self) -> None:
        """Stop the child, the MCP way first: EOF on its stdin, then SIGTERM, then SIGKILL,
        each to its whole process group so its own children go too. Idempotent; bounded."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._mark_dead()
        if self._proc is None:
            return
        with self._write_lock:   # writers give up within POLL_S once dead: none is left on the fd
            self._proc.stdin.close()
        _stop(self._proc)
        self._reader.join(timeout=2.0)
        if not self._reader.is_alive():
            self._proc.stdout.close()
            self._proc.stderr.close()


def _signal(proc: subprocess.Popen, sig: int) -> None:
    """Signal the child and its process group (which it may have left)."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass   # nothing left in the group


def _stop(proc: subprocess.Popen) -> None:
    """Wait for a child whose stdin is closed to exit, signal it when it does not, and kill
    what is left of its process group (a grandchild holding the pipes)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            proc.wait(timeout=EXIT_GRACE_S)
            break
        except subprocess.TimeoutExpired:
            _signal(proc, sig)
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        log.warning("MCP: process %d does not die", proc.pid)
    _signal(proc, signal.SIGKILL)


class McpTool(Tool):
    """One tool of an MCP server, served as `<server>_<tool>`."""
    kind = "mcp"

    def __init__(self, servers: McpServers, tool: McpToolDef):
        self._servers = servers
        self._def = tool
        self.name = f"{tool.server}_{tool.name}"
        self.display_name = self.name

    def definition(self) -> dict:
        schema = self._def.input_schema
        return {"type": "function", "function": {
            "name": self.name, "description": self._def.description,
            "parameters": copy.deepcopy(schema) if isinstance(schema, dict) else {}}}

    def invoke(self, params: dict, call: ToolCall, emit: Optional[Emit] = None) -> dict:
        """Call the tool, for as long as the client is there (`call.alive`)."""
        return self._servers.call(self._def.server, self._def.name, params, lambda: not call.alive())


class McpServers:
    """The configured MCP servers: their warm-up, their tools, and the processes that run
    the calls (one per server, respawned on demand)."""

    def __init__(self, servers: list[McpServerConfig]):
        self._configs = {s.name: s for s in servers}
        self._lock = threading.Lock()   # guards _sessions, _cooldown, _tools
        self._sessions: dict[str, _Session] = {}
        self._cooldown: dict[str, float] = {}   # server -> when it may be spawned again
        self._tools: list[Tool] = []
        self._stopping = threading.Event()

    @classmethod
    def from_config(cls, config: dict) -> McpServers:
        """From a `{"mcpServers": ...}` object; ValueError naming a field of the wrong type."""
        return cls(parse_servers(config))

    def __enter__(self) -> McpServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout: float = WARMUP_TIMEOUT_S) -> None:
        """Spawn every server at once, list its tools and stop it, all within `timeout`
        (plus the time to stop them): a server that cannot be spawned or does not answer in
        time brings no tools, the others do. A tool name that two servers' tools share is
        kept once."""
        deadline = time.monotonic() + timeout
        found: dict[str, list[McpToolDef]] = {}

        def warm_up(cfg: McpServerConfig) -> None:
            found[cfg.name] = self._warm_up(cfg, deadline)

        threads = [threading.Thread(target=warm_up, args=(cfg,), name=f"mcp-warmup-{cfg.name}", daemon=True)
                   for cfg in self._configs.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()) + 4 * EXIT_GRACE_S)
        tools: list[Tool] = []
        names: set[str] = set()
        for name in self._configs:
            for tool_def in found.get(name, []):
                tool = McpTool(self, tool_def)
                if tool.name in names:
                    log.warning("MCP tool \"%s\" from server \"%s\" collides with another, skipping", tool.name, name)
                    continue
                names.add(tool.name)
                tools.append(tool)
        with self._lock:
            self._tools = tools

    def _warm_up(self, cfg: McpServerConfig, deadline: float) -> list[McpToolDef]:
        session = _Session(cfg)
        try:
            session.start()
        except SPAWN_ERRORS as e:
            log.warning("MCP warmup: failed to spawn '%s': %s", cfg.name, e)
            return []
        try:
            tools = session.list_tools(self._stopping.is_set, deadline)
            if session.last_error:
                log.warning("MCP warmup: '%s' failed: %s", cfg.name, session.diagnostics())
            log.info("MCP warmup: '%s' discovered %d tools", cfg.name, len(tools))
            return tools
        finally:
            session.close()

    def tools(self) -> list[Tool]:
        """The tools the warm-up found, in config order."""
        with self._lock:
            return list(self._tools)

    def call(self, server: str, tool: str, arguments: object, should_stop: Optional[StopCheck] = None) -> dict:
        """Call `tool` of `server` (spawning it when it is not running): its answer as
        llama-server gives it, `{"error": ...}` when there is none."""
        session = self._session(server)
        if session is None:
            return {"error": f"MCP server unavailable: {server}"}

        def stop() -> bool:
            return self._stopping.is_set() or (should_stop is not None and should_stop())

        return session.call_tool(tool, arguments, stop)

    def _session(self, name: str) -> Optional[_Session]:
        """The running session of a server, spawned now when it has none or its process died;
        None while closing, for an unknown server, or in the cooldown after a failed spawn."""
        stale: Optional[_Session] = None
        try:
            with self._lock:
                if self._stopping.is_set() or name not in self._configs:
                    return None
                if time.monotonic() < self._cooldown.get(name, 0.0):
                    return None
                session = self._sessions.get(name)
                if session is not None and session.alive():
                    return session
                if session is not None:
                    log.warning("MCP '%s' is no longer alive: %s", name, session.diagnostics())
                    stale = self._sessions.pop(name)
                fresh = _Session(self._configs[name])
                try:
                    fresh.start()
                except SPAWN_ERRORS as e:
                    log.warning("MCP '%s': failed to start: %s", name, e)
                    self._cooldown[name] = time.monotonic() + COOLDOWN_S
                    return None
                self._sessions[name] = fresh
                return fresh
        finally:
            if stale is not None:
                stale.close()

    def close(self) -> None:
        """Stop every server: calls in flight answer 'cancelled' at once, later ones
        'unavailable'. Idempotent."""
        self._stopping.set()
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        threads = [threading.Thread(target=s.close, daemon=True) for s in sessions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
