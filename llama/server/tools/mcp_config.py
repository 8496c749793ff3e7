"""The config of `--mcp-servers-config FILE` and `--mcp-servers-json JSON` (Cursor's format:
`{"mcpServers": {name: {"command", "args", "env", "cwd", "timeout_ms"}}}`), read as
llama-server reads it, and what a server says about one of its tools."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Optional

log = logging.getLogger("llama.server")

DEFAULT_TIMEOUT_MS = 30000     # per request, unless the server's `timeout_ms` says otherwise


@dataclass
class McpServerConfig:
    """One entry of `mcpServers`."""
    name: str
    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)   # over the server's own environment
    cwd: Optional[str] = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS


@dataclass(frozen=True)
class McpToolDef:
    """A tool as its server lists it."""
    server: str
    name: str
    description: str
    input_schema: object   # JSON Schema of the arguments, or None


def parse_servers(config: dict) -> list[McpServerConfig]:
    """The servers of a `{"mcpServers": ...}` object. A field of the wrong type is a
    ValueError naming it (llama-server refuses to start); an entry without a command is
    skipped, and no `mcpServers` at all means no servers, as in llama-server."""
    if not isinstance(config, dict):
        raise ValueError("MCP config must be a JSON object")
    servers = config.get("mcpServers")
    if servers is None:
        return []
    if not isinstance(servers, dict):
        raise ValueError("MCP config: mcpServers must be an object")
    out = []
    for name, entry in servers.items():
        server = _parse_entry(name, entry)
        if server is None:
            log.warning("MCP server '%s' has no command, skipping", name)
            continue
        out.append(server)
    return out


def _parse_entry(name: str, entry: object) -> Optional[McpServerConfig]:
    where = f"mcpServers.{name}"
    if not isinstance(entry, dict):
        raise ValueError(f"MCP config: {where} must be an object")
    command = entry.get("command", "")
    if not isinstance(command, str):
        raise ValueError(f"MCP config: {where}.command must be a string")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"MCP config: {where}.args must be an array of strings")
    env = entry.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError(f"MCP config: {where}.env must be an object of strings")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError(f"MCP config: {where}.cwd must be a string")
    timeout_ms = entry.get("timeout_ms", DEFAULT_TIMEOUT_MS)
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or timeout_ms < 1:
        raise ValueError(f"MCP config: {where}.timeout_ms must be a number of milliseconds, at least 1")
    if not command:
        return None
    return McpServerConfig(name=name, command=command, args=list(args), env=dict(env), cwd=cwd or None,
                           timeout_ms=int(timeout_ms))


def load_config(path: Optional[str], json_text: Optional[str]) -> Optional[dict]:
    """The `{"mcpServers": ...}` of `--mcp-servers-config FILE` and `--mcp-servers-json JSON`
    together, None when neither is given. The file's servers come first; a name given twice
    keeps its first definition, as llama-server does. A file that cannot be read, JSON that
    does not parse or a field of the wrong type is a ValueError: the server must not start."""
    texts = []
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except OSError:
            raise ValueError(f"failed to open MCP config file: {path}") from None
    if json_text:
        texts.append(json_text)
    if not texts:
        return None
    merged: dict[str, object] = {}
    for text in texts:
        try:
            config = json.loads(text)
            servers = parse_servers(config)
        except ValueError as e:
            raise ValueError(f"failed to parse MCP config JSON: {e}") from None
        if not servers:
            log.warning("MCP config: no servers found in JSON")
        for server in servers:
            if server.name in merged:
                log.warning("MCP config: duplicate server name '%s', skipping", server.name)
                continue
            merged[server.name] = config["mcpServers"][server.name]
    return {"mcpServers": merged}
