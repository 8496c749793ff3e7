"""The interface every server tool has (llama-server's `server_tool`), and what a call
carries besides its parameters.

A tool answers a call with a JSON object: its result (`plain_text_response` is the text a
model sees) or, for a mistake in the call the model can correct (an edit whose text is not
unique, a bad `type`), `{"error": "..."}` with status 200. A failure of the server's side
(an unknown runtime, an MCP server that does not answer) raises `ToolFailure`: status 500.
A tool that streams (`streams = True`) calls `emit` with each chunk of its output as it
comes, when the caller asked for a stream.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Optional

Emit = Callable[[str], None]


class ToolFailure(RuntimeError):
    """The server could not run the call (answered 500 with the message)."""


@dataclass
class ToolCall:
    """What a call carries besides its parameters: the working directory (the `x-tool-cwd`
    header; relative paths resolve against it), the runtime it runs in (`x-tool-runtime`,
    else the server's `--tools-runtime`: `local`, `ssh:<target>`,
    `docker-container:<id>`, `podman-container:<id>`, ...), the response type asked for
    (`x-resp-type`), and whether the client is still there."""
    cwd: Optional[str] = None
    runtime: Optional[str] = None
    resp_type: Optional[str] = None
    alive: Callable[[], bool] = field(default=lambda: True)


class Tool(ABC):
    """One tool: its name, how it is shown, what it may do, and its OpenAI definition."""
    name: str
    display_name: str
    write: bool = False        # it changes files or runs commands
    streams: bool = False      # it can stream its output (`emit`)
    uses_cwd: bool = False     # it resolves paths and runs against the working directory
    kind: str = "server"       # llama-server's `type`: "server" (built-in) or "mcp"

    @abstractmethod
    def definition(self) -> dict:
        """The OpenAI function-tool object (`{"type": "function", "function": {...}}`)."""

    @abstractmethod
    def invoke(self, params: dict, call: ToolCall, emit: Optional[Emit] = None) -> dict:
        """Run the tool (blocking; the route runs it off the event loop)."""

    def to_json(self) -> dict:
        """The tool as `GET /tools` lists it."""
        return {"display_name": self.display_name, "tool": self.name, "type": self.kind,
                "permissions": {"write": self.write}, "uses_cwd": self.uses_cwd,
                "definition": self.definition()}
