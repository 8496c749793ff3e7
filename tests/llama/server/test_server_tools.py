"""Tools for agents over HTTP, as llama.cpp's server suite drives them (test_tools_builtin,
test_mcp_servers, test_proxy, test_security): `GET/POST /tools` with built-in tools and an
MCP server (tests/llama/server/data/mcp_echo_server.py), the `x-tool-*` headers, streamed
shell output, `/cors-proxy`'s header rules, and 403s where the flags are off."""
from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from ggmlpy.cli import build_parser
from ggmlpy.cli.serve_cmd import config_from_args
from tests.llama.server.conftest import API_KEY, running

ECHO_SERVER = Path(__file__).parent / "data" / "mcp_echo_server.py"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def agent(smollm2_path):
    mcp = {"mcpServers": {"echo": {"command": sys.executable, "args": [str(ECHO_SERVER)]},
                          "broken": {"command": "/nonexistent/mcp-server"}}}
    with running(smollm2_path, ctx_size=512, api_keys=[API_KEY], tools=["all"], mcp_servers=mcp,
                 ui_mcp_proxy=True, cors_origins="localhost") as s:
        yield s


def call(server, tool: str, params: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(server.url + "/tools", json={"tool": tool, "params": params},
                      headers={**AUTH, **(headers or {})}, timeout=60)


def test_the_listing(agent):
    tools = httpx.get(agent.url + "/tools", headers=AUTH).json()
    names = [t["tool"] for t in tools]
    assert names[:6] == ["read_file", "file_glob_search", "grep_search", "exec_shell_command",
                         "write_file", "edit_file"]
    assert {"echo_echo", "echo_add"} <= set(names) and not any(n.startswith("broken_") for n in names)
    echo = next(t for t in tools if t["tool"] == "echo_echo")
    assert echo["type"] == "mcp" and echo["definition"]["function"]["name"] == "echo_echo"
    write = next(t for t in tools if t["tool"] == "write_file")
    assert write["permissions"] == {"write": True} and write["type"] == "server"


def test_file_tools_against_the_header_cwd(agent, tmp_path):
    cwd = {"x-tool-cwd": str(tmp_path)}
    r = call(agent, "write_file", {"path": "sub/notes.txt", "content": "line1\nline2\n", "cwd": "/nowhere"}, cwd)
    assert r.json()["result"] == "file written successfully"
    assert (tmp_path / "sub" / "notes.txt").read_text() == "line1\nline2\n"
    r = call(agent, "edit_file", {"path": "sub/notes.txt", "edits": [{"old_text": "line2", "new_text": "two"}]}, cwd)
    assert r.json()["result"] == "file edited successfully" and r.json()["edits_applied"] == 1
    assert call(agent, "read_file", {"path": "sub/notes.txt"}, cwd).json()["plain_text_response"] == "line1\ntwo\n"
    dup = call(agent, "edit_file", {"path": str(tmp_path / "sub/notes.txt"),
                                    "edits": [{"old_text": "line", "new_text": "x"}, {"old_text": "line", "new_text": "y"}]})
    assert dup.status_code == 200 and "error" in dup.json()
    found = call(agent, "file_glob_search", {"path": ".", "include": "*.txt"}, cwd).json()
    assert "notes.txt" in found["plain_text_response"]


def test_streamed_shell_output(agent, tmp_path):
    with httpx.stream("POST", agent.url + "/tools", headers={**AUTH, "x-tool-cwd": str(tmp_path)}, timeout=60,
                      json={"tool": "exec_shell_command", "params": {"command": "echo hello; pwd"},
                            "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == {"done": True}
    text = "".join(e["chunk"] for e in events[:-1])
    assert "hello" in text and str(tmp_path) in text and "[exit code: 0]" in text


@pytest.mark.parametrize("runtime, needle", [("fake:does-not-exist", "unknown tool runtime"),
                                             ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target"),
                                             ("docker-container:--privileged", "invalid container id")])
def test_bad_runtimes_are_refused(agent, runtime, needle):
    r = call(agent, "exec_shell_command", {"command": "echo hi"}, {"x-tool-runtime": runtime})
    assert r.status_code == 500 and needle in r.json()["error"]["message"]


def test_unknown_tools_and_missing_parameters(agent):
    assert call(agent, "no_such_tool", {}).status_code == 404
    assert call(agent, "read_file", {}).status_code == 400


def test_mcp_tools(agent):
    r = call(agent, "echo_echo", {"message": "hello world"})
    assert r.status_code == 200 and "hello world" in r.json()["plain_text_response"]
    assert call(agent, "echo_add", {"a": 3, "b": 5}).json()["plain_text_response"].strip() in ("8", "8.0")


class Capture(BaseHTTPRequestHandler):
    """A target that records the headers it got; POST answers 204 No Content."""
    seen: list[dict] = []

    def do_GET(self):
        Capture.seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"ok")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        """Quiet: the test reads what was posted, not the request log."""


def test_cors_proxy_forwards_only_the_headers_it_is_told(agent):
    target = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    try:
        url = f"/cors-proxy?url=http://127.0.0.1:{target.server_port}/capture"
        r = httpx.get(agent.url + url, timeout=30, headers={
            **AUTH, "Proxy-Authorization": "Basic secret", "X-Api-Key": API_KEY, "Cookie": "session=secret",
            "x-llama-server-proxy-header-accept": "application/json",
            "x-llama-server-proxy-header-authorization": "Bearer explicit"})
        assert r.status_code == 200 and r.text == "ok"
        seen = Capture.seen[-1]
        assert seen["accept"] == "application/json" and seen["authorization"] == "Bearer explicit"
        assert not {"proxy-authorization", "x-api-key", "cookie"} & set(seen)
        empty = httpx.post(agent.url + f"/cors-proxy?url=http://127.0.0.1:{target.server_port}/", json={},
                           headers=AUTH, timeout=30)
        assert empty.status_code == 204 and empty.content == b""
        bad = httpx.get(agent.url + "/cors-proxy?url=ftp://example.com/x", headers=AUTH, timeout=30)
        assert bad.status_code == 500 and "unsupported URL scheme" in bad.json()["error"]["message"]
    finally:
        target.shutdown()
        target.server_close()


def test_features_off_answer_403(server):
    for method, path in (("GET", "/tools"), ("POST", "/tools"), ("GET", "/cors-proxy")):
        r = httpx.request(method, server.url + path, headers=AUTH, json={} if method == "POST" else None)
        assert r.status_code == 403 and r.json()["error"]["type"] == "feature_disabled"


def test_tools_narrow_cors_to_localhost():
    parse = build_parser().parse_args
    assert config_from_args(parse(["serve", "-m", "m", "--tools", "all"])).cors_origins == "localhost"
    assert config_from_args(parse(["serve", "-m", "m", "--tools", "all", "--cors-origins", "*"])).cors_origins == "*"
    assert config_from_args(parse(["serve", "-m", "m"])).cors_origins == "*"
    with pytest.raises(ValueError, match="unknown tool"):
        from llama.server.tools.toolbox import Toolbox
        Toolbox(config_from_args(parse(["serve", "-m", "m", "--tools", "read_file,rm_rf"])))
