"""Readers of a call block's text: the calls in it (name, arguments as JSON text, and the id
where the model writes one), or None when the text is not a well-formed call. Each takes
(payload, format, schemas, head): `head` holds what the opening of the block wrote (where
some families write the function's name and the call's id). Nothing here raises on model text."""
from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import regex

from llama.chat.tagged_calls import TagSyntax

if TYPE_CHECKING:
    from llama.chat.call_formats import ToolFormat

Call = tuple  # (name, arguments JSON text) or (name, arguments JSON text, id)
Schemas = Mapping[str, Any]
Reader = Callable[[str, "ToolFormat", Schemas, dict], Optional[list]]


def _loads(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text)
    except ValueError:
        return False, None


def _args_text(args: Any) -> Optional[str]:
    """Arguments as JSON text of an object (a JSON string of an object is accepted: some
    fine-tunes write them so)."""
    if isinstance(args, str):
        ok, args = _loads(args)
        if not ok:
            return None
    return json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else None


def call_from(obj: Any, spec: "ToolFormat") -> Optional[Call]:
    """One call object: ``{<name key>: .., <arg key>: {..}}`` (and the id under its key where
    the format has one). Where the format allows, a call without arguments takes ``{}`` (not
    in llama3, whose calls are bare JSON: there the argument key is what tells a call from an
    object the model wrote in its answer). A format whose calls are ``{name: {..}}`` reads
    that shape."""
    if not isinstance(obj, dict):
        return None
    if spec.name_as_key:
        if len(obj) != 1:
            return None
        (name, args), = obj.items()
        text = _args_text(args)
        return None if text is None or not name else (name, text)
    name = obj.get(spec.name_key)
    if not isinstance(name, str) or not name or obj.get("type", "function") != "function":
        return None
    key = next((k for k in spec.arg_keys if k in obj), None)
    if key is None and spec.args_required:
        return None
    text = _args_text({} if key is None else obj[key])
    if text is None:
        return None
    call_id = obj.get(spec.id_key) if spec.id_key else None
    return (name, text, str(call_id)) if call_id is not None else (name, text)


def calls_from(value: Any, spec: "ToolFormat") -> Optional[list[Call]]:
    """A call object or a list of them (every element must be a call, else none is)."""
    items = value if isinstance(value, list) else [value]
    calls = [call_from(item, spec) for item in items]
    return None if not calls or any(c is None for c in calls) else calls


def read_json(payload: str, spec: "ToolFormat", schemas: Schemas, head: dict) -> Optional[list[Call]]:
    ok, value = _loads(payload.strip())
    return calls_from(value, spec) if ok else None


def read_generic(payload: str, spec: "ToolFormat", schemas: Schemas, head: dict) -> Optional[list[Call]]:
    ok, value = _loads(payload)
    if not ok or not isinstance(value, dict):
        return None
    if isinstance(value.get("tool_calls"), list):
        return calls_from(value["tool_calls"], spec)
    if isinstance(value.get("tool_call"), dict):
        return calls_from(value["tool_call"], spec)
    return None


_PY_NAMES = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def _literal(node: ast.AST) -> Any:
    """A Python literal, where JSON's true/false/null are taken too (LFM2 writes both)."""
    if isinstance(node, ast.Name) and node.id in _PY_NAMES:
        return _PY_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("a ** entry is not a literal")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def _dotted(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _python_call(node: ast.AST, builtin: bool) -> Optional[Call]:
    """``name(key=literal, ..)`` (a dotted name too), or with `builtin` Llama's ``name.call(key=literal, ..)``."""
    if not isinstance(node, ast.Call) or node.args:
        return None
    func = node.func
    if builtin:
        if not (isinstance(func, ast.Attribute) and func.attr == "call" and isinstance(func.value, ast.Name)):
            return None
        name: Optional[str] = func.value.id
    else:
        name = _dotted(func)
    if name is None:
        return None
    try:
        args = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg is not None}
        return name, json.dumps(args, ensure_ascii=False)
    except (ValueError, TypeError, SyntaxError):
        return None


def _python_calls(text: str, builtin: bool = False) -> Optional[list[Call]]:
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = [_python_call(n, builtin) for n in nodes]
    return None if not calls or any(c is None for c in calls) else calls


def read_python_tag(payload: str, spec: "ToolFormat", schemas: Schemas, head: dict) -> Optional[list[Call]]:
    """After ``<|python_tag|>``: JSON call(s), or a Llama builtin call ``name.call(key=literal, ..)``."""
    calls = read_json(payload, spec, schemas, head)
    if calls is not None:
        return calls
    found = _python_calls(payload, builtin=True)
    return found if found is not None and len(found) == 1 else None


def read_pythonic(payload: str, spec: "ToolFormat", schemas: Schemas, head: dict) -> Optional[list[Call]]:
    """LFM2's ``[name(key=value, ..), ..]``: Python literals (True, None, strings, lists), or
    JSON call objects, which LFM2 also writes."""
    text = payload.strip()
    found = _python_calls(text) if text.startswith("[") else None
    return found if found is not None else read_json(payload, spec, schemas, head)


@dataclass(frozen=True)
class CallList:
    """A block holding calls one after another, each matched by `call`, a regex with the groups
    ``name`` and ``args`` (the arguments' JSON) and optionally ``id`` (the id the model wrote)
    and ``json`` (the arguments inside a fenced block); whitespace may separate them."""
    call: str

    @cached_property
    def pattern(self) -> regex.Pattern:
        return regex.compile(r"\s*" + self.call + r"\s*", regex.S)

    def __call__(self, payload: str, spec: "ToolFormat", schemas: Schemas, head: dict) -> Optional[list[Call]]:
        calls, pos = [], 0
        while payload[pos:].strip():
            m = self.pattern.match(payload, pos)
            text = _args_text(m.group("args").strip()) if m else None
            if m is None or text is None:
                return None
            call_id = m.groupdict().get("id")
            calls.append((m.group("name"), text, call_id) if call_id else (m.group("name"), text))
            pos = m.end()
        return calls or None


# Kimi K2: the id is ``functions.NAME:INDEX`` as written.
read_kimi = CallList(r"<\|tool_call_begin\|>\s*(?P<id>(?:functions\.)?(?P<name>[\w.\-]+?)(?::\d+)?)\s*"
                     r"<\|tool_call_argument_begin\|>(?P<args>.*?)<\|tool_call_end\|>")
# DeepSeek V3.1: NAME<｜tool▁sep｜>{json}; R1: function<｜tool▁sep｜>NAME then a fenced JSON block.
read_deepseek = CallList(r"<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>(?P<name>[^\n<]+)\n```(?:json)?\n"
                         r"(?P<args>.*?)\n?```|(?P<name>[^<]+)<｜tool▁sep｜>(?P<args>.*?))<｜tool▁call▁end｜>")


def read_named_json(payload: str, spec: "ToolFormat", schemas: Schemas, head: dict) -> Optional[list[Call]]:
    """The function's name in the opening (Mistral v11's ``[TOOL_CALLS]NAME[ARGS]``, Functionary
    v3.1's ``<function=NAME>``), then the arguments' JSON."""
    text = _args_text(payload.strip())
    name, call_id = head.get("name"), head.get("id")
    if text is None or not name:
        return None
    return [(name, text, call_id) if call_id else (name, text)]


_GEMMA_STRING = regex.compile(r'<\|"\|>(.*?)<\|"\|>', regex.S)
_GEMMA_KEY = regex.compile(r'([{,]\s*)([A-Za-z_][\w\-]*)\s*:')
_GEMMA_CALL = regex.compile(r"\s*call:(?P<name>[\w.\-]+)(?P<args>\{.*\})\s*\Z", regex.S)


def gemma_value(text: str) -> Any:
    """Gemma 4's argument syntax as a value: strings between ``<|"|>`` marks, bare keys."""
    strings: list[str] = []

    def keep(m: regex.Match) -> str:
        strings.append(m.group(1))
        return f'"\ue000{len(strings) - 1}\ue000"'

    text = _GEMMA_STRING.sub(keep, text)
    text = _GEMMA_KEY.sub(lambda m: f'{m.group(1)}"{m.group(2)}":', text)
    value = json.loads(text)

    def restore(v: Any) -> Any:
        if isinstance(v, str) and len(v) > 2 and v[0] == v[-1] == "\ue000":
            return strings[int(v[1:-1])]
        if isinstance(v, dict):
            return {restore(k): restore(x) for k, x in v.items()}
        if isinstance(v, list):
            return [restore(x) for x in v]
        return v

    return restore(value)


def read_gemma(payload: str, spec: "ToolFormat", schemas: Schemas, head: dict) -> Optional[list[Call]]:
    """Gemma 4's ``call:NAME{key:<|"|>text<|"|>,n:1}``."""
    m = _GEMMA_CALL.match(payload)
    if m is None:
        return None
    try:
        args = gemma_value(m.group("args"))
    except ValueError:
        return None
    return [(m.group("name"), json.dumps(args, ensure_ascii=False))] if isinstance(args, dict) else None


def tagged(syntax: TagSyntax) -> Reader:
    """The reader of a block whose calls are written in `syntax` (tagged_calls.py)."""
    def read(payload: str, spec: "ToolFormat", schemas: Schemas, head: dict) -> Optional[list[Call]]:
        return syntax.read(payload, schemas)
    return read
