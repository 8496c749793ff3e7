"""The MCP client (llama/server/tools/mcp.py) against a small stdio MCP server
(data/mcp_echo_server.py): config, warm-up, listing, calls, concurrency, timeouts,
cancellation, crashes and respawn, servers that fail, and shutdown."""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from llama.server.tools import mcp as mcp_module
from llama.server.tools.base import Tool, ToolCall
from llama.server.tools.mcp import McpServers, load_config, parse_servers, result_to_response

SERVER = Path(__file__).parent / "data" / "mcp_echo_server.py"
MISSING = "this_executable_does_not_exist_12345"


def entry(*flags: str, **extra) -> dict:
    return {"command": sys.executable, "args": [str(SERVER), *flags], **extra}


@contextmanager
def running(servers: dict, timeout: float = 5.0):
    mcp = McpServers.from_config({"mcpServers": servers})
    mcp.start(timeout)
    try:
        yield mcp
    finally:
        mcp.close()


def tool(mcp: McpServers, name: str) -> Tool:
    return next(t for t in mcp.tools() if t.name == name)


def invoke(mcp: McpServers, name: str, params: dict | None = None, call: ToolCall | None = None) -> dict:
    return tool(mcp, name).invoke(params or {}, call or ToolCall())


def text_json(answer: dict) -> dict:
    assert "error" not in answer, answer
    return json.loads(answer["plain_text_response"])


def server_children() -> list[int]:
    """Our child processes running the test server."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
            cmdline = (d / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and SERVER.name.encode() in cmdline:
            pids.append(int(d.name))
    return pids


def gone(pid: int, wait: float = 3.0) -> bool:
    """Whether the process exited (a zombie counts: nothing reaps in some containers)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


# --- config

def test_parse_servers_fields():
    servers = parse_servers({"mcpServers": {
        "a": {"command": "x", "args": ["1"], "env": {"K": "V"}, "cwd": "/tmp", "timeout_ms": 500},
        "b": {"args": []},   # no command: skipped
        "c": {"command": "y"}}})
    assert [s.name for s in servers] == ["a", "c"]
    assert (servers[0].args, servers[0].env, servers[0].cwd, servers[0].timeout_ms) == (["1"], {"K": "V"}, "/tmp", 500)
    assert servers[1].timeout_ms == 30000
    assert parse_servers({}) == []


@pytest.mark.parametrize("config, field", [
    ({"mcpServers": []}, "mcpServers"),
    ({"mcpServers": {"a": "x"}}, "mcpServers.a"),
    ({"mcpServers": {"a": {"command": 1}}}, "mcpServers.a.command"),
    ({"mcpServers": {"a": {"command": "x", "args": "y"}}}, "mcpServers.a.args"),
    ({"mcpServers": {"a": {"command": "x", "args": [1]}}}, "mcpServers.a.args"),
    ({"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}, "mcpServers.a.env"),
    ({"mcpServers": {"a": {"command": "x", "cwd": 3}}}, "mcpServers.a.cwd"),
    ({"mcpServers": {"a": {"command": "x", "timeout_ms": "5"}}}, "mcpServers.a.timeout_ms"),
])
def test_parse_servers_names_the_bad_field(config, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        McpServers.from_config(config)


def test_load_config(tmp_path):
    assert load_config(None, None) is None
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"a": {"command": "from-file"}, "b": {"command": "b"}}}))
    inline = json.dumps({"mcpServers": {"a": {"command": "inline"}, "c": {"command": "c"}}})
    config = load_config(str(path), inline)
    assert config == {"mcpServers": {"a": {"command": "from-file"}, "b": {"command": "b"}, "c": {"command": "c"}}}
    assert load_config(None, "{}") == {"mcpServers": {}}
    with pytest.raises(ValueError, match="failed to open MCP config file: /nonexistent/path.json"):
        load_config("/nonexistent/path.json", None)
    with pytest.raises(ValueError, match="failed to parse MCP config JSON"):
        load_config(None, "not valid json")
    with pytest.raises(ValueError, match=r"mcpServers\.a\.args"):
        load_config(None, json.dumps({"mcpServers": {"a": {"command": "x", "args": "y"}}}))


def test_result_to_response():
    parts = {"content": [{"type": "text", "text": "a"}, {"type": "image", "data": "x"}, {"type": "text", "text": "b"}]}
    assert result_to_response(parts) == {"plain_text_response": "a\nb"}
    assert result_to_response({"content": [], "isError": True}) == {"error": "MCP tool returned an error"}
    assert result_to_response(None) == {"plain_text_response": ""}


def test_long_lines_are_dropped(monkeypatch):
    monkeypatch.setattr(mcp_module, "MAX_LINE", 10)
    lines = mcp_module._Lines()
    assert lines.feed(b'{"a":1}\r\n\n{"b"') == [b'{"a":1}']
    assert lines.feed(b':2}\n' + b"x" * 11) == [b'{"b":2}']
    assert lines.feed(b"yyy") == []
    assert lines.feed(b"zz\nok\n") == [b"ok"]


# --- listing and calls

def test_tools_are_listed_as_server_tool():
    with running({"echo": entry(), "echo2": entry("--paged")}) as mcp:
        names = [t.name for t in mcp.tools()]
        assert {"echo_echo", "echo_add", "echo_fail_once", "echo2_echo", "echo2_add", "echo2_state"} <= set(names)
        assert len(names) == 22   # echo2 lists its tools in two pages
        echo = tool(mcp, "echo_echo")
        listed = echo.to_json()
        assert (listed["tool"], listed["display_name"], listed["type"]) == ("echo_echo", "echo_echo", "mcp")
        assert listed["permissions"] == {"write": False}
        fn = listed["definition"]["function"]
        assert listed["definition"]["type"] == "function"
        assert (fn["name"], fn["description"]) == ("echo_echo", "Echo back the message")
        assert fn["parameters"]["type"] == "object" and "message" in fn["parameters"]["properties"]
        assert tool(mcp, "echo_fail_once").definition()["function"]["parameters"] == {}


def test_calls_answer_as_llama_server():
    with running({"echo": entry()}) as mcp:
        assert invoke(mcp, "echo_echo", {"message": "hello world"}) == {"plain_text_response": "echo: hello world"}
        assert invoke(mcp, "echo_add", {"a": 3, "b": 5}) == {"plain_text_response": "8"}
        assert invoke(mcp, "echo_is_error") == {"error": "it went wrong"}
        assert mcp.call("echo", "nope", {}) == {"error": "Unknown tool: nope"}
        assert text_json(invoke(mcp, "echo_state")) == {"initialized": True, "cancelled": []}
        for i in range(20):   # ids advance, replies match
            assert invoke(mcp, "echo_echo", {"message": f"m{i}"}) == {"plain_text_response": f"echo: m{i}"}


def test_warmup_stops_servers_and_a_call_spawns_one():
    with running({"echo": entry()}) as mcp:
        assert server_children() == []
        assert invoke(mcp, "echo_fail_once") == {"error": "transient error"}   # a fresh process fails once
        assert invoke(mcp, "echo_fail_once") == {"plain_text_response": "ok"}
        assert len(server_children()) == 1
    assert server_children() == []


def test_env_and_cwd(tmp_path):
    with running({"e": entry(env={"MCP_TEST_VAR": "42"}, cwd=str(tmp_path))}) as mcp:
        assert text_json(invoke(mcp, "e_env", {"name": "MCP_TEST_VAR"})) == {"value": "42", "cwd": str(tmp_path)}
        assert text_json(invoke(mcp, "e_env", {"name": "PATH"}))["value"] == os.environ["PATH"]


def test_notifications_and_server_requests_during_a_call():
    with running({"n": entry()}) as mcp:
        assert invoke(mcp, "n_notify", {"message": "hi"}) == {"plain_text_response": "echo: hi"}
        assert invoke(mcp, "n_ping_client") == {"plain_text_response": "pong"}


# --- concurrency, timeouts, cancellation

def test_concurrent_calls_from_threads():
    with running({"echo": entry()}) as mcp:
        results: dict[int, dict] = {}
        slow = threading.Thread(target=lambda: results.update({-1: invoke(mcp, "echo_slow", {"seconds": 0.8})}))
        t0 = time.monotonic()
        slow.start()
        threads = [threading.Thread(target=lambda i=i: results.update(
            {i: invoke(mcp, "echo_echo", {"message": str(i)})})) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert time.monotonic() - t0 < 0.7, "fast calls waited for the slow one"
        assert -1 not in results
        assert all(results[i] == {"plain_text_response": f"echo: {i}"} for i in range(16))
        slow.join()
        assert results[-1] == {"plain_text_response": "slept 0.8"}
        assert len(server_children()) == 1


def test_timeout_answers_an_error_and_the_server_goes_on():
    with running({"slow": entry(timeout_ms=300)}) as mcp:
        pid = text_json(invoke(mcp, "slow_pid"))["pid"]
        t0 = time.monotonic()
        assert invoke(mcp, "slow_slow", {"seconds": 5}) == {"error": "request timed out"}
        assert 0.25 < time.monotonic() - t0 < 1.5
        assert invoke(mcp, "slow_echo", {"message": "after"}) == {"plain_text_response": "echo: after"}
        assert text_json(invoke(mcp, "slow_pid"))["pid"] == pid
        assert len(text_json(invoke(mcp, "slow_state"))["cancelled"]) == 1   # the server was told


def test_a_client_that_leaves_cancels_the_call():
    with running({"echo": entry()}) as mcp:
        t0 = time.monotonic()
        call = ToolCall(alive=lambda: time.monotonic() < t0 + 0.3)
        assert invoke(mcp, "echo_slow", {"seconds": 5}, call) == {"error": "cancelled"}
        assert time.monotonic() - t0 < 1.0


def test_close_cancels_calls_in_flight_and_kills_the_servers():
    mcp = McpServers.from_config({"mcpServers": {"echo": entry()}})
    mcp.start(5.0)
    pid = text_json(invoke(mcp, "echo_pid"))["pid"]
    result: dict = {}
    caller = threading.Thread(target=lambda: result.update(invoke(mcp, "echo_slow", {"seconds": 10})))
    caller.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    mcp.close()
    caller.join(2.0)
    assert time.monotonic() - t0 < 2.0
    assert result == {"error": "cancelled"}
    assert gone(pid)
    assert invoke(mcp, "echo_echo", {"message": "x"}) == {"error": "MCP server unavailable: echo"}
    mcp.close()   # idempotent


# --- failures

def test_crashed_server_is_respawned(caplog):
    with running({"c": entry("--stderr", "last words")}) as mcp:
        pid = text_json(invoke(mcp, "c_pid"))["pid"]
        assert invoke(mcp, "c_crash") == {"error": "transport closed"}
        with caplog.at_level(logging.WARNING, logger="llama.server"):
            assert invoke(mcp, "c_echo", {"message": "again"}) == {"plain_text_response": "echo: again"}
        assert text_json(invoke(mcp, "c_pid"))["pid"] != pid
        assert "last words" in caplog.text


def test_bad_command_is_skipped_and_does_not_break_the_others():
    t0 = time.monotonic()
    with running({"good": entry(), "bad": {"command": MISSING, "args": []}}) as mcp:
        assert time.monotonic() - t0 < 3.0
        names = [t.name for t in mcp.tools()]
        assert "good_echo" in names and not any(n.startswith("bad_") for n in names)
        assert mcp.call("bad", "echo", {}) == {"error": "MCP server unavailable: bad"}
        assert mcp.call("nobody", "echo", {}) == {"error": "MCP server unavailable: nobody"}
        assert invoke(mcp, "good_echo", {"message": "ok"}) == {"plain_text_response": "echo: ok"}


def test_a_server_that_does_not_answer_its_warmup_is_skipped():
    t0 = time.monotonic()
    with running({"hang": entry("--hang-init"), "good": entry()}, timeout=0.5) as mcp:
        assert time.monotonic() - t0 < 2.5
        names = [t.name for t in mcp.tools()]
        assert "good_add" in names and not any(n.startswith("hang_") for n in names)
    assert server_children() == []


def test_spawn_errors_are_skipped(tmp_path):
    with running({"nocwd": entry(cwd=str(tmp_path / "missing")), "nul": entry("a\0b"), "good": entry()}) as mcp:
        assert {t.name.split("_")[0] for t in mcp.tools()} == {"good"}
        assert mcp.call("nocwd", "echo", {}) == {"error": "MCP server unavailable: nocwd"}


def test_a_server_that_ignores_eof_and_sigterm_is_killed():
    mcp = McpServers.from_config({"mcpServers": {"s": entry("--stubborn")}})
    mcp.start(5.0)
    pid = text_json(invoke(mcp, "s_pid"))["pid"]
    t0 = time.monotonic()
    mcp.close()
    assert time.monotonic() - t0 < 2.5
    assert gone(pid)


def test_grandchild_holding_the_pipes_does_not_hang_start_or_close():
    t0 = time.monotonic()
    mcp = McpServers.from_config({"mcpServers": {"gc": entry("--grandchild")}})
    mcp.start(5.0)
    assert time.monotonic() - t0 < 3.0
    pids = text_json(invoke(mcp, "gc_pid"))
    assert invoke(mcp, "gc_echo", {"message": "hello"}) == {"plain_text_response": "echo: hello"}
    t0 = time.monotonic()
    mcp.close()
    assert time.monotonic() - t0 < 3.0
    assert gone(pids["pid"]) and gone(pids["grandchild"])
