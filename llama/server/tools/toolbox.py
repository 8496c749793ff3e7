"""The tools one server serves: the built-in ones `--tools` names and the tools of the MCP
servers in its config, as llama-server assembles them (an MCP tool whose `<server>_<tool>`
name is already taken is skipped). The MCP servers start with the server (their warm-up
bounded) and stop with it."""
from __future__ import annotations

import logging

from llama.server.config import ServerConfig
from llama.server.tools.base import Tool
from llama.server.tools.builtin import check_runtime, open_runtime, select_tools
from llama.server.tools.runtime import ToolsRuntime
from llama.server.tools.mcp import McpServers

log = logging.getLogger("ggmlpy.server")


class Toolbox:
    def __init__(self, config: ServerConfig) -> None:
        """The built-in tools are chosen and the runtime checked now: a wrong name or spec
        stops the server at start, as llama-server's setup does."""
        self.builtin: list[Tool] = select_tools(config.tools) if config.tools else []
        if config.tools_runtime:
            check_runtime(config.tools_runtime)
        self._runtime_spec = config.tools_runtime
        self._runtime: ToolsRuntime | None = None
        self.mcp = McpServers.from_config(config.mcp_servers) if config.mcp_servers else None
        self._tools: list[Tool] = list(self.builtin)

    @property
    def enabled(self) -> bool:
        return bool(self.builtin) or self.mcp is not None

    @property
    def runtime(self) -> str | None:
        """The `--tools-runtime` calls run in (a container it spawned named by its id)."""
        return self._runtime.spec() if self._runtime is not None else self._runtime_spec

    def start(self) -> None:
        """Open the tools' runtime (`docker:<image>` spawns its container), spawn and warm up
        the MCP servers, then add their tools."""
        if self._runtime_spec and self.builtin:
            self._runtime = open_runtime(self._runtime_spec)
        if self.mcp is None:
            return
        self.mcp.start()
        names = {t.name for t in self.builtin}
        tools = list(self.builtin)
        for tool in self.mcp.tools():
            if tool.name in names:
                log.warning("MCP tool %r collides with an existing tool, skipping", tool.name)
                continue
            names.add(tool.name)
            tools.append(tool)
        self._tools = tools

    def tools(self) -> list[Tool]:
        return self._tools

    def close(self) -> None:
        """Stop the MCP servers (calls in flight answer at once) and the runtime; again is a no-op."""
        if self.mcp is not None:
            self.mcp.close()
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None
