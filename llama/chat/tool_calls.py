"""OpenAI tool calls for chat models: detect the template's call syntax, parse and stream the
calls out of the generated text, and build the grammar that forces a call.

The families are data (call_formats.py: one entry each, with its blocks, reader and grammar shape);
this module is the one scanner and the one grammar builder that read them.

Parsing and streaming are one scanner: :func:`parse_tool_calls` is a :class:`ToolCallStream` fed the whole
text at once, so a streamed reply always adds up to the parsed one. A call is emitted only once its block has
closed and its JSON parsed; until then its text is held back, so text that turns out malformed (or is cut off)
comes out as plain content instead of a call that has to be taken back.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Optional

from llama.chat.call_formats import FORMATS, Block, ToolFormat, detect_tool_format, tool_format

__all__ = ["FORMATS", "ToolCallStream", "assemble_deltas", "detect_tool_format", "generic_tools_instruction",
           "parse_tool_calls", "reasoning_stops", "tool_call_grammar", "tool_call_id"]

Call = tuple
"""A parsed call: the function name, its arguments as JSON text, and the id the model wrote, if any."""

_WS = " \t\r\n"


def reasoning_stops(fmt: Optional[str]) -> tuple[str, ...]:
    """The markers of `fmt` that end a thinking block (its calls' literal openings), as the
    templates that let a call follow unclosed reasoning have them."""
    if fmt is None or not tool_format(fmt).ends_reasoning:
        return ()
    return tuple(b.literal for b in tool_format(fmt).blocks if b.literal)


_ALNUM = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def tool_call_id(seed: str | int, index: int, fmt: str = "hermes") -> str:
    """The id of call number ``index`` of a reply: a hash of (seed, index), so a parse and a stream of the
    same reply agree, and the lead can seed it with the completion id. Mistral gets 9 alphanumerics."""
    spec = tool_format(fmt)
    n = int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest(), "big")
    chars = []
    for _ in range(spec.id_len):
        n, r = divmod(n, len(_ALNUM))
        chars.append(_ALNUM[r])
    return spec.id_prefix + "".join(chars)


# ----------------------------------------------------------------------------------------------------------
# The scanner.


_ScanState = tuple[int, int, int, bool, bool]  # (value start, next index, depth, in a string, after a backslash)


def _json_end(text: str, i: int, state: Optional[_ScanState] = None) -> tuple[Optional[int], _ScanState]:
    """Index just past the JSON object/array opening at ``text[i]``, None if it has not closed yet; and
    the scan state to resume from when more text arrives (so a long call streams in linear time).
    Only brackets outside strings count, so the end is found without parsing (a malformed value still
    ends somewhere, and is then left as content)."""
    start, j0, depth, in_str, esc = state if state is not None and state[0] == i else (i, i, 0, False, False)
    for j in range(j0, len(text)):
        c = text[j]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1, (start, j + 1, depth, in_str, esc)
    return None, (start, len(text), depth, in_str, esc)


_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _hex4(text: str, i: int) -> Optional[int]:
    digits = text[i:i + 4]
    if len(digits) == 4 and all(c in "0123456789abcdefABCDEF" for c in digits):
        return int(digits, 16)
    return None


def _decode_string(text: str, i: int, final: bool) -> tuple[str, int, bool]:
    """Decode the JSON string body from ``text[i]`` as far as is safe: (decoded, index reached, closed).

    Stops before an escape (or a surrogate pair) that is not complete yet, so decoding piece by piece gives
    the same text as decoding the whole. Unknown escapes are kept verbatim; a dangling escape at the end of
    the reply is dropped."""
    out: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            return "".join(out), i + 1, True
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= n:
            break
        e = text[i + 1]
        if e != "u":
            out.append(_ESCAPES.get(e, "\\" + e))
            i += 2
            continue
        if i + 6 > n:
            break
        code = _hex4(text, i + 2)
        if code is None:
            out.append("\\u")
            i += 2
            continue
        if 0xD800 <= code < 0xE000:  # a surrogate: pair it, or it stands for U+FFFD
            following = text[i + 6:i + 12]
            if code < 0xDC00 and len(following) < 6 and not final and "\\u".startswith(following[:2]):
                break  # its partner may still be coming
            low = _hex4(following, 2) if code < 0xDC00 and following[:2] == "\\u" else None
            if low is not None and 0xDC00 <= low < 0xE000:
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                i += 12
                continue
            code = 0xFFFD
        out.append(chr(code))
        i += 6
    return "".join(out), (n if final else i), False


class ToolCallStream:
    """Turns a reply streamed as text deltas into OpenAI ``chat.completion.chunk`` ``delta`` fragments.

    ``feed`` returns the fragments the new text settles: ``{"content": ..}`` for plain text, and per call a
    header ``{"tool_calls": [{"index", "id", "type", "function": {"name", "arguments": ""}}]}`` followed by
    ``{"tool_calls": [{"index", "function": {"arguments": ..}}]}``. Text that could still be the start of a
    call marker, or is inside an unfinished call, is held back; ``finish`` releases what is left (an
    unfinished call as content). Content is trimmed at both ends of the reply, as the parse is.
    """

    def __init__(self, fmt: str, seed: str | int = 0, tools: Optional[list[dict]] = None) -> None:
        self._fmt = tool_format(fmt)
        self._schemas = {f.get("name"): f.get("parameters") or {} for f in (_function(t) for t in tools or [])}
        self._seed = seed
        self._text = ""
        self._pos = 0  # text before this is settled
        self._string_at: Optional[int] = None  # inside a generic "response" string, decoding from here
        self._over = False  # the generic response has closed: the rest of the reply is ignored
        self._calls = 0
        self._started = False  # some content has been emitted
        self._ws = ""  # whitespace held until more content follows it
        self._finished = False
        self._json_scan: Optional[_ScanState] = None  # progress through an open JSON block

    def feed(self, delta: str) -> list[dict]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._text += delta
        return self._scan(final=False)

    def finish(self) -> list[dict]:
        if self._finished:
            return []
        self._finished = True
        return self._scan(final=True)

    # -- internals --

    def _content(self, out: list[dict], s: str) -> None:
        if not self._started:
            s = s.lstrip()
        body = s.rstrip()
        if not body:
            self._ws += s
            return
        out.append({"content": self._ws + body})
        self._ws = s[len(body):]
        self._started = True

    def _call(self, out: list[dict], call: Call) -> None:
        i = self._calls
        self._calls += 1
        name, arguments = call[0], call[1]
        call_id = call[2] if len(call) > 2 and call[2] else tool_call_id(self._seed, i, self._fmt.name)
        out.append({"tool_calls": [{"index": i, "id": call_id,
                                    "type": "function", "function": {"name": name, "arguments": ""}}]})
        out.append({"tool_calls": [{"index": i, "function": {"arguments": arguments}}]})

    def _next_open(self, final: bool) -> Optional[tuple[int, int, Optional[Block], dict]]:
        """The leftmost block opening from ``_pos``: (start, end of the open match, block, head), with
        block None when the text there could still become an opening (hold it). The head holds what
        the opening writes (its named groups: a function's ``name``, a call's ``id``). Ties go to the
        table order, but an earlier-listed block still undecided there holds the text."""
        best: Optional[tuple[int, int, Optional[Block], dict]] = None
        for block in self._fmt.blocks:
            m = block.pattern.search(self._text, self._pos, partial=not final)
            if m is None or (best is not None and m.start() >= best[0]):
                continue
            best = (m.start(), m.end(), None if m.partial else block, {} if m.partial else m.groupdict())
        return best

    def _read(self, block: Block, payload: str, head: dict) -> Optional[list[Call]]:
        """The block's calls, None if malformed; whatever the model wrote (JSON nested past the recursion
        limit included) must not raise."""
        assert block.read is not None
        try:
            return block.read(payload, self._fmt, self._schemas, head)
        except (ValueError, TypeError, RecursionError, MemoryError, IndexError, KeyError):
            return None

    def _block_end(self, block: Block, start: int, open_end: int, head: dict,
                   final: bool) -> tuple[Optional[int], Optional[list[Call]]]:
        """(end of the block, its calls or None if malformed); end None while it is still open."""
        text = self._text
        if block.kind == "rest":
            return (len(text), self._read(block, text[open_end:], head)) if final else (None, None)
        if block.kind == "closed":
            close = text.find(block.close, open_end)
            if close < 0:
                return (len(text), None) if final else (None, None)
            end = close + len(block.close)
            return end, self._read(block, text[start:end] if block.whole else text[open_end:close], head)
        i = start if block.json_at_open else open_end
        while i < len(text) and text[i] in _WS:
            i += 1
        if i == len(text) and not final:
            return None, None
        if i == len(text) or text[i] not in "{[":
            return i, None
        end, self._json_scan = _json_end(text, i, self._json_scan)
        if end is None:
            return (len(text), None) if final else (None, None)
        if block.close:   # a closing marker after the JSON, which a model may leave out
            after = text[end:]
            if not final and len(after) < len(block.close) and block.close.startswith(after):
                self._json_scan = None   # rescanned next time (the JSON has closed: the state would not say so)
                return None, None
            if after.startswith(block.close):
                return end + len(block.close), self._read(block, text[i:end], head)
        return end, self._read(block, text[i:end], head)

    def _scan(self, final: bool) -> list[dict]:
        out: list[dict] = []
        text = self._text
        while True:
            if self._over:
                self._pos = len(text)
                break
            if self._string_at is not None:
                decoded, self._string_at, closed = _decode_string(text, self._string_at, final)
                if decoded:
                    self._content(out, decoded)
                self._over = closed or final
                if not self._over:
                    break
                continue
            found = self._next_open(final)
            if found is None:
                if text[self._pos:]:
                    self._content(out, text[self._pos:])
                self._pos = len(text)
                break
            start, open_end, block, head = found
            if start > self._pos:
                self._content(out, text[self._pos:start])
                self._pos = start
            if block is None:
                break
            if block.kind == "string":
                self._string_at = open_end
                continue
            end, calls = self._block_end(block, start, open_end, head, final)
            if end is None:
                break
            if calls is None:
                self._content(out, text[start:end])
            else:
                for call in calls:
                    self._call(out, call)
            self._pos = end
        return out


def assemble_deltas(deltas: list[dict]) -> tuple[Optional[str], list[dict]]:
    """Fold stream fragments back into (content or None, OpenAI tool calls), as a client does."""
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.get("tool_calls", ()):
            call = calls.setdefault(tc["index"], {"id": None, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
            if "id" in tc:
                call["id"] = tc["id"]
            call["function"]["name"] += tc["function"].get("name", "")
            call["function"]["arguments"] += tc["function"].get("arguments", "")
    return content or None, [calls[i] for i in sorted(calls)]


def parse_tool_calls(text: str, fmt: str, seed: str | int = 0,
                     tools: Optional[list[dict]] = None) -> tuple[Optional[str], list[dict]]:
    """Split a finished reply into its content (None if empty) and OpenAI tool calls
    ``{"id", "type": "function", "function": {"name", "arguments": JSON text}}``. Never raises on model
    text: a block that is malformed or unfinished stays in the content. ``seed`` makes the call ids;
    ``tools`` type the values of formats that write them as text (XML)."""
    stream = ToolCallStream(fmt, seed, tools)
    return assemble_deltas(stream.feed(text) + stream.finish())


# ----------------------------------------------------------------------------------------------------------
# Grammars and the generic instruction.


def _function(tool: dict) -> dict:
    """The ``function`` part of an OpenAI tool."""
    if tool.get("type", "function") != "function" or not isinstance(tool.get("function"), dict):
        raise ValueError(f"not an OpenAI function tool: {tool!r}")
    return tool["function"]


def _chosen(tools: list[dict], tool_choice: Any) -> list[dict]:
    functions = [_function(t) for t in tools]
    if not functions:
        raise ValueError("no tools to call")
    if tool_choice in ("required", "auto"):
        return functions
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [f for f in functions if f.get("name") == name]
        if not chosen:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
        return chosen[:1]
    raise ValueError(f"no grammar forces a call for tool_choice={tool_choice!r}")


def _call_schema(function: dict, spec: ToolFormat) -> dict:
    params = function.get("parameters") or {"type": "object"}
    if spec.name_as_key:
        return {"type": "object", "properties": {function["name"]: params}, "required": [function["name"]],
                "additionalProperties": False}
    key = spec.arg_keys[0]
    return {
        "type": "object",
        "properties": {spec.name_key: {"const": function["name"]}, key: params, **dict(spec.grammar.call_extra)},
        "required": [spec.name_key, key],
        "additionalProperties": False,
    }


# JSON written the way the templates' ``tojson`` writes it; flexible whitespace lets a model loop on blanks.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_STYLED = {"x-guidance": _JSON_STYLE}


def tool_call_grammar(tools: list[dict], tool_choice: Any, fmt: str,
                      special_tokens: Optional[Mapping[str, int]] = None) -> str:
    """A llguidance Lark grammar for exactly one call in ``fmt``'s syntax, its arguments held to the tool's
    ``parameters`` schema: any tool for ``tool_choice="required"``, the named one for
    ``{"type": "function", "function": {"name": ..}}``. For ``generic`` only, ``"auto"`` also allows
    ``{"response": ".."}`` (as llama.cpp constrains its generic format); native formats need no grammar
    then, so ``"auto"`` and ``"none"`` raise ValueError there, as does a family with no forced form.

    ``special_tokens`` maps markers that are single special tokens in the model's vocabulary (say
    ``{"[TOOL_CALLS]": 5}``) to their ids; they are then matched as that token (``<[5]>``), not as text.
    """
    spec = tool_format(fmt)
    shape = spec.grammar
    if tool_choice == "auto" and fmt != "generic":
        raise ValueError(f"tool_choice='auto' needs no grammar in the {fmt} format")
    if shape.json is None:
        raise ValueError(f"the {fmt} tool-call format has no grammar for a forced call")
    chosen = _chosen(tools, tool_choice)
    if shape.json == "tagged":
        assert shape.syntax is not None
        return shape.syntax.grammar(chosen, "".join(shape.before), "".join(shape.after))
    tokens = special_tokens or {}

    def marker(s: str) -> str:
        return f"<[{tokens[s]}]>" if s in tokens else json.dumps(s, ensure_ascii=False)

    if shape.json == "named":
        rules = [f"f{i}_args: %json {json.dumps({**(f.get('parameters') or {'type': 'object'}), **_STYLED})}"
                 for i, f in enumerate(chosen)]
        calls = [" ".join([marker(b.format(name=f["name"])) for b in shape.before] + [f"f{i}_args"]
                          + [marker(a) for a in shape.after]) for i, f in enumerate(chosen)]
        return "start: " + " | ".join(f"({c})" for c in calls) + "\n" + "\n".join(rules) + "\n"
    calls = [_call_schema(f, spec) for f in chosen]
    call = {"anyOf": calls} if len(calls) > 1 else calls[0]
    if shape.json == "array":
        schema: dict = {"type": "array", "items": call, "minItems": 1, "maxItems": 1}
    elif shape.json == "tool_calls":
        schema = {"type": "object", "properties": {"tool_calls": {
            "type": "array", "items": call, "minItems": 1, "maxItems": 1}},
            "required": ["tool_calls"], "additionalProperties": False}
        if tool_choice == "auto":
            response = {"type": "object", "properties": {"response": {"type": "string"}},
                        "required": ["response"], "additionalProperties": False}
            schema = {"anyOf": [schema, response]}
    else:
        schema = call
    schema = {**schema, "x-guidance": _JSON_STYLE}
    parts = [marker(s) for s in shape.before] + ["call"] + [marker(s) for s in shape.after]
    return f"start: {' '.join(parts)}\ncall: %json {json.dumps(schema)}\n"


def generic_tools_instruction(tools: list[dict]) -> str:
    """System text for the generic format, for templates that do not render ``tools``: the tools, and the
    one JSON object to reply with (the shape :func:`parse_tool_calls` reads and the grammar enforces)."""
    described = [{"name": f["name"], "description": f.get("description", ""),
                  "parameters": f.get("parameters") or {"type": "object"}}
                 for f in (_function(t) for t in tools)]
    return (
        "You can call the following tools. Each is given as JSON with its name, what it does, and the JSON "
        "schema of its arguments:\n\n"
        + "\n".join(json.dumps(d, ensure_ascii=False) for d in described)
        + "\n\nRespond with a single JSON object and nothing else, in one of two forms.\n"
        'To call tools: {"tool_calls": [{"name": "<tool name>", "arguments": {<arguments, following the '
        "tool's schema>}}]}\n"
        'To answer the user directly: {"response": "<your answer>"}'
    )
