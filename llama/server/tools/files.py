"""The built-in file tools of llama-server: read_file, file_glob_search, grep_search and
write_file (edit_file is in edit.py). Each does its I/O through the call's runtime
(runtime.py), so the same code reads this host's files or a container's."""
from __future__ import annotations

import base64
import re
from functools import lru_cache
from typing import Optional

from llama.server.tools.base import Emit, Tool, ToolCall
from llama.server.tools.params import need_str, opt_bool, opt_int, opt_str
from llama.server.tools.runtime import make_io
from llama.server.tools.toolsio import ListEntry

READ_FILE_MAX_SIZE = 16 * 1024
READ_FILE_MAX_SIZE_BASE64 = 32 * 1024 * 1024
FILE_SEARCH_MAX_RESULTS = 100
GREP_SEARCH_MAX_RESULTS = 100
SEARCH_TYPES = ("file", "dir", "all")


def function_tool(name: str, description: str, properties: dict, required: Optional[list[str]] = None) -> dict:
    """An OpenAI function-tool definition with an object of parameters."""
    parameters: dict = {"type": "object", "properties": properties}
    if required is not None:
        parameters["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def split_lines(content: str) -> list[str]:
    """Lines as C++'s getline reads them: no empty last line after a final newline."""
    lines = content.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def _class_match(c: str, body: str) -> bool:
    """Does `c` match a bracket class's body (between '[' and ']'): '!' negates, a leading
    ']' or '-' is literal, "a-z" is a range."""
    negated = body.startswith("!")
    if negated:
        body = body[1:]
    if body[:1] in ("]", "-"):
        if c == body[0]:
            return not negated
        body = body[1:]
    matched = False
    i = 0
    while i < len(body) and not matched:
        if i + 2 < len(body) and body[i + 1] == "-" and body[i + 2] != "]":
            matched = body[i] <= c <= body[i + 2]
            i += 3
        else:
            matched = body[i] == c
            i += 1
    return matched != negated


def glob_match(pattern: str, text: str) -> bool:
    """llama.cpp's glob: `*` any run of non-'/' characters, `**` anything including '/',
    `?` one non-'/' character, `[...]` a class (an unclosed '[' is literal)."""

    @lru_cache(maxsize=None)
    def match(p: int, s: int) -> bool:
        if p == len(pattern):
            return s == len(text)
        if pattern.startswith("**", p):
            return match(p + 2, s) or (s < len(text) and match(p, s + 1))
        if pattern[p] == "*":
            end = s
            while end < len(text) and text[end] != "/":
                end += 1
            return any(match(p + 1, k) for k in range(s, end + 1))
        if pattern[p] == "?" and s < len(text) and text[s] != "/":
            return match(p + 1, s + 1)
        if pattern[p] == "[":
            close = p + 1
            if pattern[close:close + 1] in ("]", "-"):
                close += 1
            close = pattern.find("]", close)
            if close < 0:
                return s < len(text) and text[s] == "[" and match(p + 1, s + 1)
            return s < len(text) and _class_match(text[s], pattern[p + 1:close]) and match(close + 1, s + 1)
        return s < len(text) and pattern[p] == text[s] and match(p + 1, s + 1)

    return match(0, 0)


def path_glob_match(pattern: str, rel_path: str) -> bool:
    """A pattern without '/' matches the basename at any depth; one with '/' the whole
    relative path, anchored with "**/" unless it already starts with "**/" or '/'."""
    if "/" not in pattern:
        return glob_match(pattern, rel_path.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith(("**/", "/")):
        return glob_match(pattern, rel_path)
    return glob_match("**/" + pattern, rel_path)


class ReadFile(Tool):
    """read_file: a file's text, optionally a line range and with line numbers; the whole
    file as base64 when the client asked for it (`x-resp-type: base64`)."""
    name = "read_file"
    display_name = "Read file"
    uses_cwd = True

    def definition(self) -> dict:
        return function_tool(self.name, (
            "Read the contents of a file. Optionally specify a 1-based line range. "
            "If append_loc is true, each line is prefixed with its line number (e.g. \"1\u2192...\")."), {
            "path": {"type": "string", "description": "Path to the file"},
            "start_line": {"type": "integer", "description": "First line to read, 1-based (default: 1)"},
            "end_line": {"type": "integer",
                         "description": "Last line to read, 1-based inclusive (default: end of file)"},
            "append_loc": {"type": "boolean", "description": "Prefix each line with its line number"},
        }, ["path"])

    def invoke(self, params: dict, call: ToolCall, emit: Optional[Emit] = None) -> dict:
        path = need_str(params, "path")
        start_line = opt_int(params, "start_line", 1)
        end_line = opt_int(params, "end_line", -1)  # -1: to the end
        append_loc = opt_bool(params, "append_loc", False)
        io = make_io(call.runtime, call.cwd)

        size = io.file_size(path)
        if size is None:
            return {"error": f"cannot stat file: {path}"}
        if call.resp_type == "base64":
            if size > READ_FILE_MAX_SIZE_BASE64:
                return {"error": f"file too large ({size} bytes, max {READ_FILE_MAX_SIZE_BASE64})"}
            content = io.read_file(path)
            if content is None:
                return {"error": f"failed to open file: {path}"}
            return {"base64": base64.b64encode(content).decode("ascii"), "size_bytes": len(content)}
        if size > READ_FILE_MAX_SIZE and end_line == -1:
            return {"error": f"file too large ({size} bytes, max {READ_FILE_MAX_SIZE}). "
                             "Use start_line/end_line to read a portion."}
        content = io.read_file(path)
        if content is None:
            return {"error": f"failed to open file: {path}"}

        # the size limit counts bytes, so the lines stay bytes until the end
        lines = content.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        result = bytearray()
        for lineno, line in enumerate(lines, start=1):
            if lineno < start_line:
                continue
            if end_line != -1 and lineno > end_line:
                break
            out_line = (f"{lineno}\u2192".encode() if append_loc else b"") + line + b"\n"
            if len(result) + len(out_line) > READ_FILE_MAX_SIZE:
                result += b"[output truncated]"
                break
            result += out_line
        return {"plain_text_response": result.decode("utf-8", errors="replace")}


class FileGlobSearch(Tool):
    """file_glob_search: the files (or directories) under a directory whose path matches a glob."""
    name = "file_glob_search"
    display_name = "File search"
    uses_cwd = True

    def definition(self) -> dict:
        limit = FILE_SEARCH_MAX_RESULTS
        return function_tool(self.name, (
            "Recursively search for files matching a glob pattern under a directory. "
            "Automatically skips files ignored by .gitignore (when the directory is inside a git repo) "
            "and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
            "A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any depth. "
            "A pattern containing '/' matches the full relative path; unless already anchored with "
            "\"**/\" or a leading '/', it is automatically prefixed with \"**/\". "
            "Use type=\"dir\" or \"all\" to also list directories; directory entries are suffixed with '/' "
            "in the output. Note: directory listings do not apply .gitignore filtering."), {
            "path": {"type": "string", "description": "Base directory to search in"},
            "include": {"type": "string", "description": "Glob pattern for files to include "
                                                         "(e.g. \"*.cpp\" or \"src/**/*.cpp\"). Default: **"},
            "exclude": {"type": "string", "description": "Glob pattern for files to exclude"},
            "type": {"type": "string",
                     "description": "Entry type to return: \"file\" (default), \"dir\" or \"all\""},
            "max_depth": {"type": "integer", "description": "Maximum depth to descend into subdirectories "
                                                            "(default: 0 = unlimited; 1 = direct children only)"},
            "limit": {"type": "integer",
                      "description": f"Maximum number of results to return, capped at {limit} (default {limit})"},
        }, ["path"])

    def invoke(self, params: dict, call: ToolCall, emit: Optional[Emit] = None) -> dict:
        io = make_io(call.runtime, call.cwd)
        path = need_str(params, "path")
        base = io.resolve(path)
        include = opt_str(params, "include", "**")
        exclude = opt_str(params, "exclude", "")
        kind = opt_str(params, "type", "file")
        max_depth = max(0, opt_int(params, "max_depth", 0))
        limit = opt_int(params, "limit", FILE_SEARCH_MAX_RESULTS)
        if limit < 1:
            return {"error": f"invalid limit: {limit} (expected 1 or more)"}
        limit = min(limit, FILE_SEARCH_MAX_RESULTS)
        if kind not in SEARCH_TYPES:
            return {"error": f"invalid type: {kind} (expected \"file\", \"dir\" or \"all\")"}

        listing = io.list_entries(base, max_depth, kind)
        if listing.err:
            return {"error": f"{listing.err}: {path}"}
        matches = [e for e in listing.entries
                   if path_glob_match(include, e.rel) and not (exclude and path_glob_match(exclude, e.rel))]
        shown = matches[:limit]
        text = "".join(e.rel + ("/" if e.is_dir else "") + "\n" for e in shown)
        text += f"\n---\nTotal matches: {len(matches)}\n"
        if len(matches) > len(shown):
            text += (f"[{len(shown)} results limit reached ({len(matches)} total matches). "
                     "Refine the glob pattern to narrow the search.]\n")
        if listing.truncated:
            text += "[results truncated: time budget or unreadable directory]\n"
        # `base` is absolute so a client (the web UI's picker) can join it with the entries
        entries = [{"path": e.rel, "type": "dir" if e.is_dir else "file"} for e in shown]
        return {"plain_text_response": text, "entries": entries, "base": base}


class GrepSearch(Tool):
    """grep_search: the lines of the files under a path that match a regular expression."""
    name = "grep_search"
    display_name = "Grep search"
    uses_cwd = True

    def definition(self) -> dict:
        return function_tool(self.name, (
            "Search for a pattern in files under a path. Returns matching lines with file paths "
            "(and, unless searching a single file, paths relative to the given directory). "
            "Automatically skips files ignored by .gitignore (when the directory is inside a git repo) "
            "and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
            "include/exclude: a pattern with no '/' matches the basename at any depth; a pattern "
            "containing '/' matches the full relative path (auto-anchored with \"**/\" unless already anchored)."), {
            "path": {"type": "string", "description": "File or directory to search in"},
            "pattern": {"type": "string",
                        "description": "Pattern to search for (regular expression unless literal is true)"},
            "include": {"type": "string", "description": "Glob pattern to filter files (default: **)"},
            "exclude": {"type": "string", "description": "Glob pattern to exclude files"},
            "return_line_numbers": {"type": "boolean", "description": "If true, include line numbers in results"},
            "literal": {"type": "boolean", "description": "Treat pattern as a literal string instead of a "
                                                          "regular expression (default: false)"},
            "ignore_case": {"type": "boolean", "description": "Case-insensitive search (default: false)"},
            "context_lines": {"type": "integer", "description": "Number of lines of context to show before "
                                                                "and after each match (default: 0)"},
        }, ["path", "pattern"])

    def invoke(self, params: dict, call: ToolCall, emit: Optional[Emit] = None) -> dict:
        path = need_str(params, "path")
        pattern_text = need_str(params, "pattern")
        include = opt_str(params, "include", "**")
        exclude = opt_str(params, "exclude", "")
        show_lineno = opt_bool(params, "return_line_numbers", False)
        literal = opt_bool(params, "literal", False)
        ignore_case = opt_bool(params, "ignore_case", False)
        ctx_lines = max(0, opt_int(params, "context_lines", 0))
        try:
            pattern = re.compile(re.escape(pattern_text) if literal else pattern_text,
                                 re.IGNORECASE if ignore_case else 0)
        except re.error as e:
            return {"error": f"invalid regex: {e}"}
        io = make_io(call.runtime, call.cwd)

        abs_path = io.resolve(path)
        files: list[tuple[str, str]] = []  # (path to read, path to show)
        if io.is_regular_file(abs_path):
            files.append((abs_path, path))
        elif io.is_directory(abs_path):
            listing = io.list_entries(abs_path, 0, "file")
            if listing.err:
                return {"error": f"{listing.err}: {path}"}
            files += [(f"{abs_path.rstrip('/')}/{e.rel}", e.rel) for e in listing.entries
                      if self._selected(e, include, exclude)]
        else:
            return {"error": f"path does not exist: {path}"}

        out: list[str] = []
        total = 0
        limit_reached = False
        show_num = show_lineno or ctx_lines > 0
        for read_path, shown_path in files:
            if limit_reached:
                break
            content = io.read_file(read_path)
            if content is None:
                continue
            lines = split_lines(content.decode("utf-8", errors="replace"))
            for i, line in enumerate(lines):
                if total >= GREP_SEARCH_MAX_RESULTS:
                    limit_reached = True
                    break
                if not pattern.search(line):
                    continue
                for j in range(max(0, i - ctx_lines), min(len(lines) - 1, i + ctx_lines) + 1):
                    sep = ":" if j == i else "-"
                    out.append(f"{shown_path}{sep}{f'{j + 1}{sep}' if show_num else ''}{lines[j]}\n")
                if ctx_lines > 0:
                    out.append("--\n")
                total += 1

        out.append(f"\n---\nTotal matches: {total}\n")
        if limit_reached:
            out.append(f"[{GREP_SEARCH_MAX_RESULTS} matches limit reached. "
                       "Narrow the path/pattern/include to see more.]\n")
        return {"plain_text_response": "".join(out)}

    @staticmethod
    def _selected(entry: ListEntry, include: str, exclude: str) -> bool:
        return path_glob_match(include, entry.rel) and not (exclude and path_glob_match(exclude, entry.rel))


class WriteFile(Tool):
    """write_file: create or overwrite a file, with its parent directories."""
    name = "write_file"
    display_name = "Write file"
    write = True
    uses_cwd = True

    def definition(self) -> dict:
        return function_tool(self.name, (
            "Write content to a file, creating it (including parent directories) if it does not exist. "
            "May use with edit_file for more complex edits."), {
            "path": {"type": "string", "description": "Path of the file to write"},
            "content": {"type": "string", "description": "Content to write"},
        }, ["path", "content"])

    def invoke(self, params: dict, call: ToolCall, emit: Optional[Emit] = None) -> dict:
        path = need_str(params, "path")
        content = need_str(params, "content")
        io = make_io(call.runtime, call.cwd)
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from a JSON escape
            return {"error": f"failed to write file: {path}"}
        if not io.write_file(path, data):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file written successfully", "path": path, "bytes": len(data)}

