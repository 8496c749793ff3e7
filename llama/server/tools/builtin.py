"""llama-server's built-in tools (`--tools`), with llama-server's names, parameters, results
and error texts: read_file, file_glob_search, grep_search, exec_shell_command, write_file,
edit_file and get_info, in that order.

The file tools are in files.py and edit.py, the runtimes they run in (this host, a
container, a host over ssh) in runtime.py; this module has the two command tools and the
registry the server builds its tool list from.
"""
from __future__ import annotations

import codecs
import os
from typing import Optional

from llama.server.tools.base import Emit, Tool, ToolCall
from llama.server.tools.edit import EditFile
from llama.server.tools.files import FileGlobSearch, GrepSearch, ReadFile, WriteFile, function_tool
from llama.server.tools.params import need_str, opt_int
from llama.server.tools.process import ExecResult
from llama.server.tools.runtime import ToolsRuntime, check_runtime, is_local, make_io, open_runtime

__all__ = ["BUILTIN_TOOLS", "EditFile", "ExecShellCommand", "FileGlobSearch", "GetInfo", "GrepSearch",
           "ReadFile", "ToolsRuntime", "WriteFile", "builtin_tools", "check_runtime", "open_runtime",
           "select_tools"]

EXEC_MAX_OUTPUT_SIZE = 16 * 1024
EXEC_MAX_TIMEOUT = 60        # seconds
EXEC_DEFAULT_TIMEOUT = 10    # seconds
GET_INFO_MAX_OUTPUT = 4096
GET_INFO_TIMEOUT = 5         # seconds


def _exit_line(res: ExecResult) -> str:
    """What follows a command's output, so the model knows how it ended."""
    tail = f"\n[exit code: {res.exit_code}]"
    return tail + " [exit due to timed out]" if res.timed_out else tail


def _shell_argv(command: str, runtime: Optional[str]) -> list[str]:
    """An isolate is always POSIX; this host's shell is cmd on Windows."""
    if os.name == "nt" and is_local(runtime):
        return ["cmd", "/c", command]
    return ["sh", "-c", command]


class ExecShellCommand(Tool):
    """exec_shell_command: run a shell command in the working directory, stdout and stderr
    together. Streamed, each chunk reaches the client as the command writes it, then the exit
    line; the command is killed when the client leaves."""
    name = "exec_shell_command"
    display_name = "Execute shell command"
    write = True
    streams = True
    uses_cwd = True

    def definition(self) -> dict:
        return function_tool(self.name, "Execute a shell command and return its output (stdout and stderr combined).", {
            "command": {"type": "string", "description": "Shell command to execute"},
            "timeout": {"type": "integer",
                        "description": f"Timeout in seconds (default {EXEC_DEFAULT_TIMEOUT}, max {EXEC_MAX_TIMEOUT})"},
            "max_output_size": {"type": "integer",
                                "description": f"Maximum output size in bytes (default {EXEC_MAX_OUTPUT_SIZE})"},
        }, ["command"])

    def invoke(self, params: dict, call: ToolCall, emit: Optional[Emit] = None) -> dict:
        """The output and exit line as `plain_text_response`; streamed (`emit`), the same text
        goes out in chunks and the result is empty."""
        command = need_str(params, "command")
        timeout = min(opt_int(params, "timeout", EXEC_DEFAULT_TIMEOUT), EXEC_MAX_TIMEOUT)
        max_output = opt_int(params, "max_output_size", EXEC_MAX_OUTPUT_SIZE)
        if max_output < 0:  # llama-server reads it as a size_t: a negative one is huge, then capped
            max_output = EXEC_MAX_OUTPUT_SIZE
        max_output = min(max_output, EXEC_MAX_OUTPUT_SIZE)
        argv = _shell_argv(command, call.runtime)
        io = make_io(call.runtime, call.cwd)

        if emit is None:
            res = io.run(argv, max_output, timeout)
            return {"plain_text_response": res.text + _exit_line(res)}

        # a chunk can end inside a UTF-8 sequence: the decoder keeps the partial tail
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

        def on_chunk(data: bytes) -> bool:
            text = decoder.decode(data)
            if text:
                emit(text)
            return call.alive()

        res = io.run(argv, max_output, timeout, on_chunk, alive=call.alive)
        if not call.alive():
            return {}
        emit(decoder.decode(b"", final=True) + _exit_line(res))
        return {}


class GetInfo(Tool):
    """get_info: the runtime's OS (`uname -a`, `ver` on Windows) and working directory."""
    name = "get_info"
    display_name = "Get Runtime Info"
    uses_cwd = True

    def definition(self) -> dict:
        return function_tool(self.name, "Returns runtime info: the OS name/version and the current working directory",
                             {})

    def invoke(self, params: dict, call: ToolCall, emit: Optional[Emit] = None) -> dict:
        io = make_io(call.runtime, call.cwd)
        local = is_local(call.runtime)
        argv = ["cmd", "/c", "ver"] if os.name == "nt" and local else ["uname", "-a"]
        res = io.run(argv, GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT)
        # a failed start or a timeout leaves a diagnostic in the output, which is no OS name
        os_info = res.text.strip() if res.exit_code == 0 and not res.timed_out else "unknown"
        cwd = call.cwd or ""
        if not cwd and local:
            cwd = os.getcwd().replace("\\", "/")
        elif not cwd:
            pwd = io.run(["pwd"], GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT)
            cwd = pwd.text.strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
        return {"os": os_info, "cwd": cwd}


# llama-server's order, which `GET /tools` keeps
BUILTIN_TOOLS: tuple[type[Tool], ...] = (
    ReadFile, FileGlobSearch, GrepSearch, ExecShellCommand, WriteFile, EditFile, GetInfo,
)


def builtin_tools() -> list[Tool]:
    """One instance of each built-in tool, in llama-server's order."""
    return [cls() for cls in BUILTIN_TOOLS]


def select_tools(names: list[str]) -> list[Tool]:
    """The tools `--tools` names (its comma-separated values; "all" is every tool), in
    llama-server's order. An unknown name is a startup error, as in llama-server."""
    tools = builtin_tools()
    known = [tool.name for tool in tools]
    for name in names:
        if name != "all" and name not in known:
            raise ValueError(f"unknown tool \"{name}\". available tools: {', '.join(known)}")
    wanted = set(names)
    return [tool for tool in tools if "all" in wanted or tool.name in wanted]
