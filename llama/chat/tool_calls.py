"""OpenAI tool calls for chat models: detect the template's call syntax, parse and stream the
calls out of the generated text, and build the grammar that forces a call.

Four families, as llama.cpp names them (``common/chat.cpp``):

- ``hermes``  — Hermes 2 Pro / Qwen 2.5 / Qwen 3: ``<tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>``
- ``llama3``  — Llama 3.1/3.2/3.3: a bare ``{"name": .., "parameters": {..}}`` (also after ``<|python_tag|>``,
  where the builtin-tool form ``brave_search.call(query="..")`` is read too)
- ``mistral`` — Mistral Nemo: ``[TOOL_CALLS][{"name": .., "arguments": {..}, "id": ..}]``
- ``qwen3_coder`` — Qwen3-Coder, Qwen3.5: ``<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n
  </function>\n</tool_call>`` (xml_calls.py)
- ``generic`` — the fallback for templates without a call syntax we read: the whole reply is one JSON object,
  ``{"tool_calls": [{"name": .., "arguments": {..}}]}`` (or ``{"tool_call": {..}}``) or ``{"response": ".."}``;
  the model learns it from :func:`generic_tools_instruction` and is held to it by :func:`tool_call_grammar`.

Parsing and streaming are one scanner: :func:`parse_tool_calls` is a :class:`ToolCallStream` fed the whole
text at once, so a streamed reply always adds up to the parsed one. A call is emitted only once its block has
closed and its JSON parsed; until then its text is held back, so text that turns out malformed (or is cut off)
comes out as plain content instead of a call that has to be taken back. This module imports nothing else
from ``llama.chat`` but xml_calls.py.
"""
from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Literal, Mapping, Optional

import regex

from llama.chat.xml_calls import read_xml_calls, xml_call_grammar

Call = tuple[str, str]
"""A parsed call: the function name and its arguments as JSON text."""
Schemas = Mapping[str, Any]
"""Each tool's `parameters` schema, by name (what types an XML call's values)."""

_WS = " \t\r\n"


# ----------------------------------------------------------------------------------------------------------
# Payload readers: the text of one closed block -> its calls, or None when it is not a well-formed call.


def _call_from(obj: Any, spec: ToolFormat) -> Optional[Call]:
    """One ``{"name": .., <arg key>: {..}}`` object as a call. Arguments given as a JSON string of an object
    are accepted (some fine-tunes emit them so); where the format allows, a call without arguments takes
    ``{}`` (not in llama3, whose calls are bare JSON: there the argument key is what tells a call from an
    object the model wrote in its answer)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if obj.get("type", "function") != "function":
        return None
    key = next((k for k in spec.arg_keys if k in obj), None)
    if key is None and spec.args_required:
        return None
    args = {} if key is None else obj[key]
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def _calls_from(value: Any, spec: ToolFormat) -> Optional[list[Call]]:
    """A call object or a list of them (every element must be a call, else none is)."""
    items = value if isinstance(value, list) else [value]
    calls = [_call_from(item, spec) for item in items]
    return None if any(c is None for c in calls) else calls  # type: ignore[return-value]


def _loads(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text)
    except ValueError:
        return False, None


def _read_json_calls(payload: str, spec: ToolFormat, schemas: Schemas) -> Optional[list[Call]]:
    ok, value = _loads(payload.strip())
    return _calls_from(value, spec) if ok else None


def _read_generic(payload: str, spec: ToolFormat, schemas: Schemas) -> Optional[list[Call]]:
    ok, value = _loads(payload)
    if not ok or not isinstance(value, dict):
        return None
    if isinstance(value.get("tool_calls"), list):
        return _calls_from(value["tool_calls"], spec)
    if isinstance(value.get("tool_call"), dict):
        return _calls_from(value["tool_call"], spec)
    return None


def _read_python_tag(payload: str, spec: ToolFormat, schemas: Schemas) -> Optional[list[Call]]:
    """After ``<|python_tag|>``: JSON call(s), or a Llama builtin call ``name.call(key=literal, ..)``."""
    calls = _read_json_calls(payload, spec, schemas)
    if calls is not None:
        return calls
    try:
        tree = ast.parse(payload.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Attribute) and tree.func.attr == "call"
            and isinstance(tree.func.value, ast.Name) and not tree.args):
        return None
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in tree.keywords if kw.arg is not None}
        text = json.dumps(args, ensure_ascii=False)
    except (ValueError, TypeError):
        return None
    return [(tree.func.value.id, text)]


def _read_xml(payload: str, spec: ToolFormat, schemas: Schemas) -> Optional[list[Call]]:
    return read_xml_calls(payload, schemas)


# ----------------------------------------------------------------------------------------------------------
# Formats as data.

BlockKind = Literal["closed", "json", "rest", "string"]


@dataclass(frozen=True)
class Block:
    """Where a call block starts and how far it runs.

    ``open`` is a regex; while the text so far could still grow into a match it is held back.
    ``kind``: ``closed`` runs to the literal ``close``; ``json`` is one JSON object/array (starting at the
    open match itself when ``json_at_open``, else after it); ``rest`` runs to the end of the reply;
    ``string`` is a JSON string whose decoded text is content, streamed as it comes (the generic
    ``{"response": "..."}``), after which the reply is over.
    """

    open: str
    kind: BlockKind
    read: Optional[Callable[[str, ToolFormat, Schemas], Optional[list[Call]]]] = None
    close: str = ""
    json_at_open: bool = False

    @property
    def pattern(self) -> regex.Pattern:
        return regex.compile(self.open)


@dataclass(frozen=True)
class GrammarShape:
    """How a forced call is written: markers before and after the JSON, and its JSON shape (``object``:
    the call itself; ``array``: a one-element list of it; ``tool_calls``: generic's wrapper object;
    ``xml``: no JSON, Qwen3-Coder's tags, whose grammar xml_calls.py writes).
    ``call_extra`` adds optional properties after the arguments (Mistral's 9-character ``id``)."""

    before: tuple[str, ...]
    after: tuple[str, ...]
    json: Literal["object", "array", "tool_calls", "xml"]
    call_extra: tuple[tuple[str, Any], ...] = ()  # (property, schema) pairs


@dataclass(frozen=True)
class ToolFormat:
    name: str
    blocks: tuple[Block, ...]
    arg_keys: tuple[str, ...]  # the first one is what the grammar writes
    grammar: GrammarShape
    id_len: int  # characters of the random part of a call id
    id_prefix: str
    args_required: bool = False  # an object without the argument key is not a call


_HERMES_OPEN = "<tool_call>"
_LLAMA_HEADER = r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:'

FORMATS: Mapping[str, ToolFormat] = MappingProxyType({
    "hermes": ToolFormat(
        name="hermes",
        blocks=(Block(regex.escape(_HERMES_OPEN), "closed", _read_json_calls, close="</tool_call>"),),
        arg_keys=("arguments",),
        grammar=GrammarShape(before=(_HERMES_OPEN, "\n"), after=("\n", "</tool_call>"), json="object"),
        id_len=24, id_prefix="call_",
    ),
    "llama3": ToolFormat(
        name="llama3",
        blocks=(
            Block(regex.escape("<|python_tag|>"), "rest", _read_python_tag),
            Block(_LLAMA_HEADER, "json", _read_json_calls, json_at_open=True),
        ),
        arg_keys=("parameters", "arguments"),
        grammar=GrammarShape(before=(), after=(), json="object"),
        id_len=24, id_prefix="call_", args_required=True,
    ),
    "mistral": ToolFormat(
        name="mistral",
        blocks=(Block(regex.escape("[TOOL_CALLS]"), "json", _read_json_calls),),
        arg_keys=("arguments",),
        grammar=GrammarShape(before=("[TOOL_CALLS]",), after=(), json="array",
                             call_extra=(("id", {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}),)),
        id_len=9, id_prefix="",  # Mistral's template rejects tool call ids that are not 9 characters long
    ),
    "qwen3_coder": ToolFormat(
        name="qwen3_coder",
        blocks=(Block(regex.escape(_HERMES_OPEN), "closed", _read_xml, close="</tool_call>"),),
        arg_keys=("arguments",),
        grammar=GrammarShape(before=(), after=(), json="xml"),
        id_len=24, id_prefix="call_",
    ),
    "generic": ToolFormat(
        name="generic",
        blocks=(
            Block(r'\A\s*\{\s*"response"\s*:\s*"', "string"),
            Block(r"\A\s*\{", "json", _read_generic, json_at_open=True),
        ),
        arg_keys=("arguments",),
        grammar=GrammarShape(before=(), after=(), json="tool_calls"),
        id_len=24, id_prefix="call_",
    ),
})

# Template substrings -> format, first match wins (llama.cpp's order). Templates whose calls are not one of
# our JSON syntaxes (XML-style parameters, Mistral v11's ``name[ARGS]{..}``) come first and get the generic
# format: the template would teach the model a syntax we could not read back.
_DETECT: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<tool_call>", "<function=", "<parameter="), "qwen3_coder"),   # Qwen3-Coder, Qwen 3.5, Nemotron Nano 3
    (("<function=",), "generic"),        # functionary v3.1
    (("<arg_key>",), "generic"),         # GLM 4.5+
    (("<invoke name=",), "generic"),     # MiniMax
    (("[TOOL_CALLS]", "[ARGS]"), "generic"),  # Mistral Small 3.2, Devstral, Ministral 3
    (("<tool_call>",), "hermes"),
    (("<|start_header_id|>ipython<|end_header_id|>",), "llama3"),
    (("[TOOL_CALLS]",), "mistral"),
)


def detect_tool_format(template_source: Optional[str]) -> str:
    """The tool-call format a chat template teaches its model, found by its marker substrings as llama.cpp
    does; ``generic`` when it has none we read (or there is no template)."""
    src = template_source or ""
    for needles, fmt in _DETECT:
        if all(n in src for n in needles):
            return fmt
    return "generic"


def _format(fmt: str) -> ToolFormat:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown tool call format {fmt!r}; expected one of {sorted(FORMATS)}") from None


_ALNUM = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def tool_call_id(seed: str | int, index: int, fmt: str = "hermes") -> str:
    """The id of call number ``index`` of a reply: a hash of (seed, index), so a parse and a stream of the
    same reply agree, and the lead can seed it with the completion id. Mistral gets 9 alphanumerics."""
    spec = _format(fmt)
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
        self._fmt = _format(fmt)
        self._schemas = {f.get("name"): f.get("parameters") or {} for f in (_function(t) for t in tools or [])}
        self._patterns = tuple(b.pattern for b in self._fmt.blocks)
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

    def _call(self, out: list[dict], name: str, arguments: str) -> None:
        i = self._calls
        self._calls += 1
        out.append({"tool_calls": [{"index": i, "id": tool_call_id(self._seed, i, self._fmt.name),
                                    "type": "function", "function": {"name": name, "arguments": ""}}]})
        out.append({"tool_calls": [{"index": i, "function": {"arguments": arguments}}]})

    def _next_open(self, final: bool) -> Optional[tuple[int, int, Optional[Block]]]:
        """The leftmost block opening from ``_pos``: (start, end of the open match, block), with block None
        when the text there could still become an opening (hold it). Ties go to the table order, but an
        earlier-listed block still undecided there holds the text."""
        best: Optional[tuple[int, int, Optional[Block]]] = None
        for block, pat in zip(self._fmt.blocks, self._patterns):
            m = pat.search(self._text, self._pos, partial=not final)
            if m is None or (best is not None and m.start() >= best[0]):
                continue
            best = (m.start(), m.end(), None if m.partial else block)
        return best

    def _read(self, block: Block, payload: str) -> Optional[list[Call]]:
        """The block's calls, None if malformed; whatever the model wrote (JSON nested past the recursion
        limit included) must not raise."""
        assert block.read is not None
        try:
            return block.read(payload, self._fmt, self._schemas)
        except (ValueError, TypeError, RecursionError, MemoryError):
            return None

    def _block_end(self, block: Block, start: int, open_end: int, final: bool) -> tuple[Optional[int], Optional[list[Call]]]:
        """(end of the block, its calls or None if malformed); end None while it is still open."""
        text = self._text
        if block.kind == "rest":
            return (len(text), self._read(block, text[open_end:])) if final else (None, None)
        if block.kind == "closed":
            close = text.find(block.close, open_end)
            if close < 0:
                return (len(text), None) if final else (None, None)
            return close + len(block.close), self._read(block, text[open_end:close])
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
        return end, self._read(block, text[i:end])

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
            start, open_end, block = found
            if start > self._pos:
                self._content(out, text[self._pos:start])
                self._pos = start
            if block is None:
                break
            if block.kind == "string":
                self._string_at = open_end
                continue
            end, calls = self._block_end(block, start, open_end, final)
            if end is None:
                break
            if calls is None:
                self._content(out, text[start:end])
            else:
                for name, arguments in calls:
                    self._call(out, name, arguments)
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
    key = spec.arg_keys[0]
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, key: params, **dict(spec.grammar.call_extra)},
        "required": ["name", key],
        "additionalProperties": False,
    }


# JSON written the way the templates' ``tojson`` writes it; flexible whitespace lets a model loop on blanks.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def tool_call_grammar(tools: list[dict], tool_choice: Any, fmt: str,
                      special_tokens: Optional[Mapping[str, int]] = None) -> str:
    """A llguidance Lark grammar for exactly one call in ``fmt``'s syntax, its arguments held to the tool's
    ``parameters`` schema: any tool for ``tool_choice="required"``, the named one for
    ``{"type": "function", "function": {"name": ..}}``. For ``generic`` only, ``"auto"`` also allows
    ``{"response": ".."}`` (as llama.cpp constrains its generic format); native formats need no grammar
    then, so ``"auto"`` and ``"none"`` raise ValueError there.

    ``special_tokens`` maps markers that are single special tokens in the model's vocabulary (say
    ``{"[TOOL_CALLS]": 5}``) to their ids; they are then matched as that token (``<[5]>``), not as text.
    """
    spec = _format(fmt)
    if tool_choice == "auto" and fmt != "generic":
        raise ValueError(f"tool_choice='auto' needs no grammar in the {fmt} format")
    if spec.grammar.json == "xml":
        return xml_call_grammar(_chosen(tools, tool_choice))
    calls = [_call_schema(f, spec) for f in _chosen(tools, tool_choice)]
    call = {"anyOf": calls} if len(calls) > 1 else calls[0]
    if spec.grammar.json == "array":
        schema: dict = {"type": "array", "items": call, "minItems": 1, "maxItems": 1}
    elif spec.grammar.json == "tool_calls":
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
    tokens = special_tokens or {}

    def marker(s: str) -> str:
        return f"<[{tokens[s]}]>" if s in tokens else json.dumps(s)

    parts = [marker(s) for s in spec.grammar.before] + ["call"] + [marker(s) for s in spec.grammar.after]
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
