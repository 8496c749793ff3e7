"""llama-server's edit_file tool: exact text replacements, several per call, each matched
against the file as it was (not one after the other).

A model often gets whitespace at line ends or typographic quotes and dashes wrong, so when
some `old_text` is not in the file exactly, every match is made on a normalized copy (trailing
blanks dropped, smart quotes, dashes and special spaces made ASCII), and the lines no edit
touches are then copied from the original, so the rest of the file keeps its bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from llama.server.tools.base import Emit, Tool, ToolCall
from llama.server.tools.files import function_tool
from llama.server.tools.params import ParamError, need, need_str
from llama.server.tools.runtime import make_io

# files need not be UTF-8: undecodable bytes round-trip through surrogateescape
_ENCODING = "utf-8"
_ERRORS = "surrogateescape"

_FUZZY = str.maketrans({
    **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
    **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
    **dict.fromkeys("\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000", " "),
})


def normalize_for_fuzzy_match(content: str) -> str:
    """Each line without trailing blanks, its smart quotes, dashes and special spaces as
    ASCII; the line count stays the same."""
    return "\n".join(line.rstrip(" \t\r").translate(_FUZZY) for line in content.split("\n"))


def count_occurrences(content: str, needle: str) -> int:
    """Non-overlapping occurrences; none for an empty needle."""
    return content.count(needle) if needle else 0


@dataclass
class MatchedEdit:
    edit_index: int
    match_index: int     # offset in the content the edits were matched against
    match_length: int
    new_text: str


def apply_replacements(content: str, edits: list[MatchedEdit], offset: int = 0) -> str:
    """`content` (which starts at `offset`) with the edits, sorted and disjoint, applied."""
    for edit in reversed(edits):
        start = edit.match_index - offset
        content = content[:start] + edit.new_text + content[start + edit.match_length:]
    return content


def _lines_with_ends(content: str) -> list[str]:
    """Lines split at newlines only (not at a lone CR), each with its newline."""
    lines = content.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _line_spans(content: str) -> list[tuple[int, int]]:
    """(start, end) of each line, its newline included."""
    spans = []
    start = 0
    for line in _lines_with_ends(content):
        spans.append((start, start + len(line)))
        start += len(line)
    return spans


def _line_range(spans: list[tuple[int, int]], edit: MatchedEdit) -> Optional[tuple[int, int]]:
    """The lines (first, last + 1) an edit's match touches."""
    start, end = edit.match_index, edit.match_index + edit.match_length
    first = next((i for i, (s, e) in enumerate(spans) if s <= start < e), None)
    if first is None:
        return None
    last = first
    while last < len(spans) and spans[last][1] < end:
        last += 1
    return (first, last + 1) if last < len(spans) else None


def apply_preserving_unchanged_lines(original: str, base: str, edits: list[MatchedEdit]) -> str:
    """Apply edits matched against `base` (the normalized `original`): the touched lines come
    from `base` with the edits in, every other line from `original` as it was."""
    original_lines = _lines_with_ends(original)
    spans = _line_spans(base)
    groups: list[tuple[int, int, list[MatchedEdit]]] = []
    for edit in edits:
        found = _line_range(spans, edit)
        if found is None:  # an empty match at the very end: no line to keep apart
            return apply_replacements(base, edits)
        first, end = found
        if groups and first < groups[-1][1]:
            groups[-1] = (groups[-1][0], max(groups[-1][1], end), groups[-1][2] + [edit])
        else:
            groups.append((first, end, [edit]))

    out: list[str] = []
    next_line = 0
    for first, end, group_edits in groups:
        out += original_lines[next_line:first]
        start_offset, end_offset = spans[first][0], spans[end - 1][1]
        out.append(apply_replacements(base[start_offset:end_offset], group_edits, start_offset))
        next_line = end
    out += original_lines[next_line:]
    return "".join(out)


class EditFile(Tool):
    """edit_file: exact text replacements; each `old_text` must be unique in the file and the
    edits must not overlap (the model merges nearby changes into one edit)."""
    name = "edit_file"
    display_name = "Edit file"
    write = True
    uses_cwd = True

    def definition(self) -> dict:
        edit_item = {
            "type": "object",
            "properties": {
                "old_text": {"type": "string", "description": "Exact text to find; must be unique in the file "
                                                              "and must not overlap with other edits"},
                "new_text": {"type": "string", "description": "Text to replace old_text with"},
            },
            "required": ["old_text", "new_text"],
        }
        return function_tool(self.name, (
            "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file "
            "and is matched against the original content, not incrementally. Merge nearby changes into "
            "one edit instead of overlapping edits. Use write_file to replace the whole file."), {
            "path": {"type": "string", "description": "Path to the file to edit"},
            "edits": {"type": "array", "description": "One or more exact text replacements to apply",
                      "items": edit_item},
        }, ["path", "edits"])

    def invoke(self, params: dict, call: ToolCall, emit: Optional[Emit] = None) -> dict:
        path = need_str(params, "path")
        edits_json = need(params, "edits")
        if not isinstance(edits_json, list) or not edits_json:
            return {"error": "\"edits\" must be a non-empty array"}
        edits: list[tuple[str, str]] = []
        for i, item in enumerate(edits_json):
            if not isinstance(item, dict):
                raise ParamError(f"edits[{i}] must be an object")
            old_text, new_text = need_str(item, "old_text"), need_str(item, "new_text")
            if not old_text:
                return {"error": f"edits[{i}].old_text must not be empty"}
            edits.append((old_text, new_text))

        io = make_io(call.runtime, call.cwd)
        data = io.read_file(path)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        original = data.decode(_ENCODING, _ERRORS)

        fuzzy_original = normalize_for_fuzzy_match(original)
        any_fuzzy = False
        for i, (old_text, _) in enumerate(edits):
            if old_text in original:
                continue
            if normalize_for_fuzzy_match(old_text) not in fuzzy_original:
                return {"error": f"could not find edits[{i}].old_text in {path}, "
                                 "it must match the file's current content exactly"}
            any_fuzzy = True
        base = fuzzy_original if any_fuzzy else original

        matched: list[MatchedEdit] = []
        for i, (old_text, new_text) in enumerate(edits):
            fuzzy_old = normalize_for_fuzzy_match(old_text)
            # counted on the normalized text, so a duplicate that differs in blanks counts too
            occurrences = count_occurrences(fuzzy_original, fuzzy_old)
            if occurrences > 1:
                return {"error": f"found {occurrences} occurrences of edits[{i}].old_text in {path}, "
                                 "it must be unique"}
            needle = fuzzy_old if any_fuzzy else old_text
            matched.append(MatchedEdit(i, base.find(needle), len(needle), new_text))

        matched.sort(key=lambda m: m.match_index)
        for prev, cur in zip(matched, matched[1:]):
            if prev.match_index + prev.match_length > cur.match_index:
                return {"error": f"edits[{prev.edit_index}] and edits[{cur.edit_index}] overlap in {path}; "
                                 "merge them into one edit or target disjoint regions"}

        if any_fuzzy:
            new_content = apply_preserving_unchanged_lines(original, base, matched)
        else:
            new_content = apply_replacements(base, matched)
        if new_content == original:
            return {"error": "no changes made: the replacement(s) produced identical content"}
        try:
            new_data = new_content.encode(_ENCODING, _ERRORS)
        except UnicodeEncodeError:  # a lone surrogate in new_text, from a JSON escape
            return {"error": f"failed to write file: {path}"}
        if not io.write_file(path, new_data):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file edited successfully", "path": path, "edits_applied": len(matched)}
