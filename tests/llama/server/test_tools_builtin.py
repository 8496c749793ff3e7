"""llama-server's built-in tools (llama/server/tools/builtin.py), called directly: what
llama.cpp's tools/server/tests/unit/test_tools_builtin.py checks through POST /tools, and
more of the same behaviour (runtimes through a fake `docker`/`ssh`, glob and grep options)."""
from __future__ import annotations

import base64
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from llama.server.tools.base import ToolCall, ToolFailure
from llama.server.tools.builtin import BUILTIN_TOOLS, builtin_tools, check_runtime, open_runtime, select_tools
from llama.server.tools.files import glob_match, path_glob_match
from llama.server.tools.params import ParamError

TOOLS = {tool.name: tool for tool in builtin_tools()}
GREP_MARKER = "ggmlpy_test_tools_builtin_marker_grep_search"
THIS_FILE = Path(__file__).resolve()


def call(name: str, params: dict, cwd: str | None = None, runtime: str | None = None, **kw) -> dict:
    """A call that must succeed (no "error" in the result), as llama.cpp's call_tool."""
    res = TOOLS[name].invoke(params, ToolCall(cwd=cwd, runtime=runtime, **kw))
    assert "error" not in res, res
    return res


def call_error(name: str, params: dict, cwd: str | None = None, runtime: str | None = None) -> str:
    res = TOOLS[name].invoke(params, ToolCall(cwd=cwd, runtime=runtime))
    assert "error" in res, res
    return res["error"]


def glob(path: str, **params) -> dict:
    return call("file_glob_search", {"path": path, **params})


# -- the registry ------------------------------------------------------------------------------

def test_builtin_tools_in_llama_server_order():
    names = [tool.name for tool in builtin_tools()]
    assert names == ["read_file", "file_glob_search", "grep_search", "exec_shell_command",
                     "write_file", "edit_file", "get_info"]
    assert len(BUILTIN_TOOLS) == len(names)
    assert [t.name for t in select_tools(["all"])] == names
    assert [t.name for t in select_tools(["get_info", "read_file"])] == ["read_file", "get_info"]
    assert select_tools([]) == []


def test_select_tools_rejects_unknown_name():
    with pytest.raises(ValueError) as err:
        select_tools(["read_file", "web_search"])
    assert str(err.value) == ('unknown tool "web_search". available tools: read_file, file_glob_search, '
                              'grep_search, exec_shell_command, write_file, edit_file, get_info')


def test_definitions_and_listing():
    for tool in builtin_tools():
        listed = tool.to_json()
        assert listed["tool"] == tool.name and listed["type"] == "server" and listed["uses_cwd"] is True
        function = listed["definition"]["function"]
        assert listed["definition"]["type"] == "function" and function["name"] == tool.name
        assert function["parameters"]["type"] == "object"
    writes = {t.name for t in builtin_tools() if t.write}
    assert writes == {"exec_shell_command", "write_file", "edit_file"}
    assert [t.name for t in builtin_tools() if t.streams] == ["exec_shell_command"]
    assert TOOLS["edit_file"].definition()["function"]["parameters"]["required"] == ["path", "edits"]
    assert set(TOOLS["file_glob_search"].definition()["function"]["parameters"]["properties"]) == {
        "path", "include", "exclude", "type", "max_depth", "limit"}
    assert "required" not in TOOLS["get_info"].definition()["function"]["parameters"]


def test_missing_required_parameter_is_a_malformed_request():
    with pytest.raises(ParamError, match="path"):
        TOOLS["read_file"].invoke({}, ToolCall())
    with pytest.raises(ParamError):
        TOOLS["exec_shell_command"].invoke({"command": 3}, ToolCall())


# -- grep_search -------------------------------------------------------------------------------

def test_grep_search_finds_this_file():
    root = str(THIS_FILE.parent)
    text = call("grep_search", {"path": root, "pattern": GREP_MARKER,
                                "include": THIS_FILE.name})["plain_text_response"]
    assert THIS_FILE.name in text
    assert GREP_MARKER in text
    assert "Total matches: 1" in text


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "src" / "deep").mkdir(parents=True)
    (tmp_path / "src" / "a.py").write_text("import os\nvalue = 1\nValue = 2\nend\n")
    (tmp_path / "src" / "deep" / "b.py").write_text("value = 3\n")
    (tmp_path / "src" / "notes.txt").write_text("value in text\n")
    (tmp_path / "node_modules" / "pkg").mkdir(parents=True)
    (tmp_path / "node_modules" / "pkg" / "x.py").write_text("value = 4\n")
    return tmp_path


def test_grep_search_include_exclude_and_junk(tree: Path):
    text = call("grep_search", {"path": str(tree), "pattern": "^value", "include": "*.py"})["plain_text_response"]
    assert "src/a.py:value = 1\n" in text and "src/deep/b.py:value = 3\n" in text
    assert "notes.txt" not in text and "node_modules" not in text
    assert text.endswith("\n---\nTotal matches: 2\n")
    text = call("grep_search", {"path": str(tree), "pattern": "value", "exclude": "deep/*"})["plain_text_response"]
    assert "b.py" not in text and "notes.txt:value in text" in text


def test_grep_search_options(tree: Path):
    a_py = str(tree / "src" / "a.py")
    text = call("grep_search", {"path": a_py, "pattern": "value", "ignore_case": True,
                                "return_line_numbers": True})["plain_text_response"]
    assert f"{a_py}:2:value = 1\n{a_py}:3:Value = 2\n" in text and "Total matches: 2" in text
    text = call("grep_search", {"path": "src/a.py", "pattern": "Value", "context_lines": 1},
                cwd=str(tree))["plain_text_response"]
    assert text.startswith("src/a.py-2-value = 1\nsrc/a.py:3:Value = 2\nsrc/a.py-4-end\n--\n")
    text = call("grep_search", {"path": a_py, "pattern": "v.lue", "literal": True})["plain_text_response"]
    assert "Total matches: 0" in text
    assert call_error("grep_search", {"path": a_py, "pattern": "("}).startswith("invalid regex: ")
    assert call_error("grep_search", {"path": str(tree / "nope"), "pattern": "x"}) == \
        f"path does not exist: {tree / 'nope'}"


def test_grep_search_stops_at_100_matches(tmp_path: Path):
    (tmp_path / "many.txt").write_text("hit\n" * 150)
    text = call("grep_search", {"path": str(tmp_path), "pattern": "hit"})["plain_text_response"]
    assert text.count("many.txt:hit") == 100
    assert "Total matches: 100" in text
    assert "[100 matches limit reached. Narrow the path/pattern/include to see more.]" in text


# -- read_file, write_file, edit_file ----------------------------------------------------------

def test_read_file_this_file():
    # this file is over read_file's 16 KB, so only a line range can be read
    text = call("read_file", {"path": str(THIS_FILE), "end_line": 30})["plain_text_response"]
    assert GREP_MARKER in text
    assert "def call(" in text


def test_read_file_range_loc_size_and_base64(tmp_path: Path):
    path = tmp_path / "lines.txt"
    path.write_text("one\ntwo\nthree\nfour")
    assert call("read_file", {"path": str(path), "start_line": 2, "end_line": 3,
                              "append_loc": True})["plain_text_response"] == "2\u2192two\n3\u2192three\n"
    assert call("read_file", {"path": str(path), "start_line": 4})["plain_text_response"] == "four\n"
    res = call("read_file", {"path": str(path)}, resp_type="base64")
    assert base64.b64decode(res["base64"]) == path.read_bytes() and res["size_bytes"] == path.stat().st_size

    big = tmp_path / "big.txt"
    big.write_text("x" * 100 + "\n" + ("y" * 99 + "\n") * 200)
    err = call_error("read_file", {"path": str(big)})
    assert err == f"file too large ({big.stat().st_size} bytes, max 16384). Use start_line/end_line to read a portion."
    assert call("read_file", {"path": str(big), "end_line": 1})["plain_text_response"] == "x" * 100 + "\n"
    text = call("read_file", {"path": str(big), "end_line": 1000})["plain_text_response"]
    assert text.endswith("[output truncated]") and len(text) <= 16 * 1024 + len("[output truncated]")

    assert call_error("read_file", {"path": str(tmp_path / "missing")}) == f"cannot stat file: {tmp_path / 'missing'}"
    assert call_error("read_file", {"path": str(tmp_path)}).startswith("cannot stat file")


def test_write_then_edit_file(tmp_path: Path):
    log_path = str(tmp_path / "test.log")
    res = call("write_file", {"path": log_path, "content": "line1\nline2\nline3\n"})
    assert res == {"result": "file written successfully", "path": log_path, "bytes": 18}
    assert call("read_file", {"path": log_path})["plain_text_response"] == "line1\nline2\nline3\n"

    res = call("edit_file", {"path": log_path, "edits": [
        {"old_text": "line2", "new_text": "line2-edited"},
        {"old_text": "line3\n", "new_text": "line3\nline4\n"},
    ]})
    assert res["result"] == "file edited successfully"
    assert res["edits_applied"] == 2
    assert call("read_file", {"path": log_path})["plain_text_response"] == "line1\nline2-edited\nline3\nline4\n"


def test_edit_file_errors(tmp_path: Path):
    path = tmp_path / "test.log"
    path.write_text("dup\ndup\n")
    err = call_error("edit_file", {"path": str(path), "edits": [{"old_text": "dup", "new_text": "changed"}]})
    assert "unique" in err and err.startswith("found 2 occurrences of edits[0].old_text")

    path.write_text("line1\nline2\n")
    err = call_error("edit_file", {"path": str(path), "edits": [
        {"old_text": "line1\nline2", "new_text": "a"},
        {"old_text": "line2", "new_text": "b"},
    ]})
    assert "overlap" in err and err.startswith("edits[0] and edits[1] overlap")

    assert "could not find edits[0].old_text" in call_error(
        "edit_file", {"path": str(path), "edits": [{"old_text": "line9", "new_text": "x"}]})
    assert call_error("edit_file", {"path": str(path), "edits": []}) == '"edits" must be a non-empty array'
    assert call_error("edit_file", {"path": str(path), "edits": [{"old_text": "", "new_text": "x"}]}) == \
        "edits[0].old_text must not be empty"
    assert call_error("edit_file", {"path": str(path), "edits": [{"old_text": "line1", "new_text": "line1"}]}) == \
        "no changes made: the replacement(s) produced identical content"
    assert call_error("edit_file", {"path": str(tmp_path / "nope"), "edits": [{"old_text": "a", "new_text": "b"}]}) \
        .startswith("failed to open file: ")
    assert path.read_text() == "line1\nline2\n"


def test_edit_file_fuzzy_match_keeps_other_lines(tmp_path: Path):
    path = tmp_path / "quotes.py"
    original = "keep = 1   \nsay(\u201chello\u201d)  \nother = 2\t\n"
    path.write_text(original)
    res = call("edit_file", {"path": str(path), "edits": [{"old_text": 'say("hello")', "new_text": 'say("bye")'}]})
    assert res["edits_applied"] == 1
    # the edited line comes from the normalized text, the others keep their trailing blanks
    assert path.read_text() == 'keep = 1   \nsay("bye")\nother = 2\t\n'


# -- exec_shell_command ------------------------------------------------------------------------

def test_exec_shell_command(tmp_path: Path):
    res = call("exec_shell_command", {"command": "echo hello; echo oops >&2; exit 3"})
    assert res["plain_text_response"] == "hello\noops\n\n[exit code: 3]"


def test_exec_shell_command_stream():
    chunks: list[str] = []
    res = TOOLS["exec_shell_command"].invoke({"command": "echo hello"}, ToolCall(), chunks.append)
    assert res == {}
    assert len(chunks) >= 2
    joined = "".join(chunks)
    assert "hello" in joined
    assert "[exit code: 0]" in joined


def test_exec_shell_command_streams_as_output_comes():
    stamps: list[tuple[float, str]] = []
    start = time.monotonic()
    TOOLS["exec_shell_command"].invoke({"command": "echo one; sleep 0.5; echo two"}, ToolCall(),
                                       lambda chunk: stamps.append((time.monotonic() - start, chunk)))
    assert stamps[0][1] == "one\n" and stamps[0][0] < 0.4
    assert "".join(c for _, c in stamps).endswith("two\n\n[exit code: 0]")


def test_exec_shell_command_timeout_and_output_cap():
    start = time.monotonic()
    res = call("exec_shell_command", {"command": "echo started; sleep 30", "timeout": 1})
    assert time.monotonic() - start < 10
    assert res["plain_text_response"] == "started\n\n[exit code: 1] [exit due to timed out]"
    res = call("exec_shell_command", {"command": "head -c 100 /dev/zero | tr '\\0' x", "max_output_size": 10})
    assert res["plain_text_response"] == "x" * 10 + "\n[output truncated]\n[exit code: 0]"


def test_exec_shell_command_stops_when_client_leaves():
    chunks: list[str] = []
    gone = threading.Event()

    def emit(chunk: str) -> None:
        chunks.append(chunk)
        gone.set()

    start = time.monotonic()
    res = TOOLS["exec_shell_command"].invoke({"command": "echo start; sleep 20; echo end", "timeout": 60},
                                             ToolCall(alive=lambda: not gone.is_set()), emit)
    assert time.monotonic() - start < 10
    assert res == {} and chunks == ["start\n"]


def test_exec_shell_command_in_cwd(tmp_path: Path):
    marker = "exec_cwd_marker.txt"
    call("exec_shell_command", {"command": f"echo hello > {marker}"}, cwd=str(tmp_path))
    assert (tmp_path / marker).read_text() == "hello\n"
    res = call("exec_shell_command", {"command": "pwd"}, cwd=str(tmp_path / "missing"))
    assert res["plain_text_response"] == "failed to spawn process\n[exit code: -1]"


def test_get_info(tmp_path: Path):
    res = call("get_info", {}, cwd=str(tmp_path))
    assert res["cwd"] == str(tmp_path)
    assert res["os"] == subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout.strip()
    assert call("get_info", {})["cwd"] == os.getcwd()


# -- file_glob_search --------------------------------------------------------------------------

def test_file_glob_search_type_dir(tmp_path: Path):
    (tmp_path / "project-alpha" / "src").mkdir(parents=True)
    (tmp_path / "project-alpha" / "README.md").write_text("alpha")
    (tmp_path / "project-alpha" / "src" / "main.cpp").write_text("int main() {}")
    (tmp_path / "project-beta").mkdir()
    (tmp_path / "project-beta" / "notes.txt").write_text("beta")

    res = glob(str(tmp_path), type="dir")
    text = res["plain_text_response"]
    assert "project-alpha/\n" in text and "project-beta/\n" in text and "project-alpha/src/\n" in text
    assert "README.md" not in text
    types = {e["path"]: e["type"] for e in res["entries"]}
    assert types == {"project-alpha": "dir", "project-alpha/src": "dir", "project-beta": "dir"}
    assert res["base"] == str(tmp_path)

    paths = [e["path"] for e in glob(str(tmp_path), type="all", include="*proj*")["entries"]]
    assert "project-alpha" in paths and "project-beta" in paths


def test_file_glob_search_max_depth_and_limit(tmp_path: Path):
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "top.txt").write_text("top")
    (tmp_path / "a" / "mid.txt").write_text("mid")
    (tmp_path / "a" / "b" / "deep.txt").write_text("deep")

    text = glob(str(tmp_path), max_depth=1)["plain_text_response"]
    assert "top.txt" in text and "mid.txt" not in text
    text = glob(str(tmp_path), max_depth=2)["plain_text_response"]
    assert "mid.txt" in text and "deep.txt" not in text

    res = glob(str(tmp_path), limit=1)
    assert len(res["entries"]) == 1
    assert "Total matches: 3" in res["plain_text_response"]
    assert "[1 results limit reached (3 total matches). Refine the glob pattern to narrow the search.]" \
        in res["plain_text_response"]
    assert call_error("file_glob_search", {"path": str(tmp_path), "limit": 0}) == \
        "invalid limit: 0 (expected 1 or more)"


def test_file_glob_search_junk_dirs(tmp_path: Path):
    (tmp_path / "build" / "nested").mkdir(parents=True)
    (tmp_path / "build" / "artifact.txt").write_text("built")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.cpp").write_text("int main() {}")

    # a junk directory stays selectable as a working directory, but is never walked
    assert "build" in [e["path"] for e in glob(str(tmp_path), type="dir", max_depth=1)["entries"]]
    paths = [e["path"] for e in glob(str(tmp_path), type="all")["entries"]]
    assert "src/main.cpp" in paths
    assert "build/artifact.txt" not in paths
    assert "build/nested" not in paths


def test_file_glob_search_errors(tmp_path: Path):
    err = call_error("file_glob_search", {"path": str(tmp_path), "type": "bogus"})
    assert "invalid type" in err and err == 'invalid type: bogus (expected "file", "dir" or "all")'
    missing = str(tmp_path / "missing")
    assert call_error("file_glob_search", {"path": missing}) == \
        f"path does not exist or is not a directory: {missing}"


def test_file_glob_search_patterns(tmp_path: Path):
    (tmp_path / "src" / "sub").mkdir(parents=True)
    for rel in ("top.cpp", "src/a.cpp", "src/sub/b.cpp", "src/sub/c.h"):
        (tmp_path / rel).write_text("x")
    paths = lambda **kw: sorted(e["path"] for e in glob(str(tmp_path), **kw)["entries"])  # noqa: E731
    assert paths(include="*.cpp") == ["src/a.cpp", "src/sub/b.cpp", "top.cpp"]
    assert paths(include="sub/*.cpp") == ["src/sub/b.cpp"]
    assert paths(include="*.cpp", exclude="sub/*") == ["src/a.cpp", "top.cpp"]
    assert paths(include="**/*.[ch]") == ["src/sub/c.h"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_file_glob_search_uses_gitignore(tmp_path: Path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("ignored.txt\n")
    (tmp_path / "ignored.txt").write_text("x")
    (tmp_path / "kept.txt").write_text("x")
    paths = [e["path"] for e in glob(str(tmp_path))["entries"]]
    assert "kept.txt" in paths and ".gitignore" in paths and "ignored.txt" not in paths


def test_glob_match():
    assert glob_match("*.py", "a.py") and not glob_match("*.py", "d/a.py")
    assert glob_match("**", "a/b/c") and glob_match("a/**/c", "a/x/y/c")
    assert glob_match("?.txt", "a.txt") and not glob_match("?", "/")
    assert glob_match("[a-c]x", "bx") and not glob_match("[!a-c]x", "bx") and glob_match("[]]", "]")
    assert glob_match("[x", "[x")
    assert path_glob_match("b.py", "a/b.py") and path_glob_match("a/*.py", "z/a/b.py")
    assert path_glob_match("/abs/*", "/abs/x")


# -- the working directory ---------------------------------------------------------------------

def test_cwd_relative_paths(tmp_path: Path):
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    (workdir / "rel.txt").write_text("relative-content")
    cwd = str(workdir)

    assert "relative-content" in call("read_file", {"path": "rel.txt"}, cwd=cwd)["plain_text_response"]
    call("write_file", {"path": "sub/out.txt", "content": "written"}, cwd=cwd)
    assert (workdir / "sub" / "out.txt").read_text() == "written"
    res = call("file_glob_search", {"path": ".", "include": "*.txt"}, cwd=cwd)
    assert "rel.txt" in res["plain_text_response"] and res["base"] == cwd
    assert call("file_glob_search", {"path": "sub/.."}, cwd=cwd)["base"] == cwd

    other = tmp_path / "other"
    other.mkdir()
    (other / "abs.txt").write_text("absolute-content")
    res = call("read_file", {"path": str(other / "abs.txt")}, cwd=cwd)
    assert "absolute-content" in res["plain_text_response"]


def test_cwd_param_is_not_a_tool_parameter(tmp_path: Path):
    # the route puts the x-tool-cwd header in the call; a model's "cwd" parameter means nothing
    (tmp_path / "marker.txt").write_text("marker")
    res = call("read_file", {"path": "marker.txt", "cwd": "/definitely/not/a/real/path"}, cwd=str(tmp_path))
    assert "marker" in res["plain_text_response"]


def test_home_directory_expands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "h.txt").write_text("at home")
    assert call("read_file", {"path": "~/h.txt"})["plain_text_response"] == "at home\n"


# -- runtimes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("runtime, message", [
    ("fake:does-not-exist", "unknown tool runtime: fake:does-not-exist"),
    ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target: -oProxyCommand=touch /tmp/pwned"),
    ("ssh:user@host;rm", "invalid ssh target: user@host;rm"),
    ("docker-container:--privileged", "invalid container id: --privileged"),
    ("podman-container:--privileged", "invalid container id: --privileged"),
    ("docker-container:", "invalid container id: "),
    ("docker:busybox", "tool runtime must name a running container: docker:busybox"),
])
def test_runtime_validation(runtime: str, message: str):
    # a bad runtime fails the call (500), never falls back to running on this host
    for name in ("exec_shell_command", "read_file"):
        with pytest.raises(ToolFailure) as err:
            TOOLS[name].invoke({"command": "echo hi", "path": "x"}, ToolCall(runtime=runtime))
        assert str(err.value) == message


def test_check_runtime():
    for spec in ("", "local", "ssh:user@example.com", "docker-container:abc123", "podman-container:a.b_c-d",
                 "docker:busybox", "podman:alpine:3"):
        check_runtime(spec)
    for spec, message in (("fake:x", "unknown tool runtime"), ("ssh:-x", "invalid ssh target"),
                          ("docker-container:-x", "invalid container id"), ("docker:", "requires an image name")):
        with pytest.raises(ToolFailure, match=message):
            check_runtime(spec)


FAKE_DOCKER = """#!/bin/sh
# `docker run --rm -i --cidfile <file> <image> sh`: a shell that lives as long as its stdin
if [ "$1" = run ]; then
    echo fakecid > "$5"
    exec sh
fi
# `docker exec [-i] <id> cmd...`, run on this host
[ "$1" = exec ] || exit 2
shift
[ "$1" = -i ] && shift
echo "$1" >> "$(dirname "$0")/ids"
shift
exec "$@"
"""

FAKE_SSH = """#!/bin/sh
# `ssh <options> <target> <command>`: the command, one shell-quoted word, run on this host
while [ $# -gt 1 ]; do shift; done
exec sh -c "$1"
"""


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in (("docker", FAKE_DOCKER), ("ssh", FAKE_SSH)):
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


@pytest.mark.parametrize("runtime", ["docker-container:abc123", "ssh:me@example.com"])
def test_isolate_runtime(runtime: str, tmp_path: Path, fake_bin: Path):
    work = tmp_path / "work"
    work.mkdir()
    cwd = str(work)
    assert call("write_file", {"path": "d/test.log", "content": "hello 'container'\n"},
                cwd=cwd, runtime=runtime)["result"] == "file written successfully"
    assert (work / "d" / "test.log").read_text() == "hello 'container'\n"
    assert call("read_file", {"path": "d/test.log"}, cwd=cwd, runtime=runtime)["plain_text_response"] == \
        "hello 'container'\n"
    res = call("exec_shell_command", {"command": "cat d/test.log; pwd"}, cwd=cwd, runtime=runtime)
    assert res["plain_text_response"] == f"hello 'container'\n{cwd}\n\n[exit code: 0]"
    chunks: list[str] = []
    TOOLS["exec_shell_command"].invoke({"command": "echo hi"}, ToolCall(cwd=cwd, runtime=runtime), chunks.append)
    assert "".join(chunks) == "hi\n\n[exit code: 0]"

    call("edit_file", {"path": "d/test.log", "edits": [{"old_text": "hello", "new_text": "bye"}]},
         cwd=cwd, runtime=runtime)
    assert (work / "d" / "test.log").read_text() == "bye 'container'\n"
    (work / "build").mkdir()
    (work / "build" / "junk.txt").write_text("x")
    res = call("file_glob_search", {"path": ".", "type": "all"}, cwd=cwd, runtime=runtime)
    assert sorted(e["path"] for e in res["entries"]) == ["build", "d", "d/test.log"]
    text = call("grep_search", {"path": ".", "pattern": "bye"}, cwd=cwd, runtime=runtime)["plain_text_response"]
    assert "d/test.log:bye 'container'" in text and "Total matches: 1" in text
    assert call("get_info", {}, runtime=runtime)["cwd"] == os.getcwd()
    if runtime.startswith("docker"):
        assert set((fake_bin / "ids").read_text().split()) == {"abc123"}


def test_open_runtime(tmp_path: Path, fake_bin: Path):
    static = open_runtime("docker-container:abc123")
    assert static.spec() == "docker-container:abc123"
    static.close()
    spawned = open_runtime("docker:busybox")
    try:
        assert spawned.spec() == "docker-container:fakecid"
        res = call("exec_shell_command", {"command": "echo inside"}, runtime=spawned.spec())
        assert res["plain_text_response"] == "inside\n\n[exit code: 0]"
    finally:
        spawned.close()
