"""Every tool-call syntax ggmlpy reads, as data: where a family's call blocks start and end,
which reader (call_readers.py) takes a block apart and which streams its calls as they come
(call_streams.py), how a forced call is written (its grammar shape), and which template text
says a template teaches it (`DETECT`). The scanner (tool_calls.py) and the grammar builder
(call_grammar.py) read these entries; adding a family is adding one.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal, Mapping, Optional

import regex

from llama.chat import call_readers as read
from llama.chat.call_readers import Reader
from llama.chat.call_streams import StreamFactory, call_list, generic_calls, json_calls, named_args
from llama.chat.gemma_stream import gemma_calls
from llama.chat.pythonic_stream import pythonic_calls
from llama.chat.tagged_calls import (ARG_KEY, DSML, INVOKE, KIMI_K3, MINICPM, MINIMAX_M3, MINIMAX_NS, QWEN3_CODER,
                                     SEED_OSS, TagSyntax)
from llama.chat.tagged_stream import tagged_calls

BlockKind = Literal["closed", "json", "rest", "string"]


@dataclass(frozen=True)
class Block:
    """Where a call block starts and how far it runs.

    ``open`` is a regex (its named groups, a function's ``name`` and a call's ``id``, are handed
    to the reader as its head); while the text so far could still grow into a match it is held
    back. ``kind``: ``closed`` runs to the literal ``close`` (``whole``: the reader gets the
    markers too); ``json`` is one JSON object/array (starting at the open match itself when
    ``json_at_open``, else after it), then ``close`` if the model wrote it; ``rest`` runs to the
    end of the reply; ``string`` is a JSON string whose decoded text is content, streamed as it
    comes (the generic ``{"response": "..."}``), after which the reply is over. ``literal``: the
    opening as plain text, where it is one (what ends an unclosed thinking block). ``stream``:
    the reader that gives the block's calls out as they come (call_streams.py); without one a
    call is given out once its block has ended.
    """

    open: str
    kind: BlockKind
    read: Optional[Reader] = None
    close: str = ""
    json_at_open: bool = False
    whole: bool = False
    literal: str = ""
    stream: Optional[StreamFactory] = None
    keeps_open: bool = False   # closed: the opening is the call's own, and the reader's text starts at it

    @cached_property
    def pattern(self) -> regex.Pattern:
        return regex.compile(self.open)


def closed(open_: str, close: str, reader: Reader, stream: Optional[StreamFactory] = None, *,
           whole: bool = False) -> Block:
    """A block between two literal markers."""
    return Block(regex.escape(open_), "closed", reader, close=close, whole=whole, literal=open_, stream=stream)


@dataclass(frozen=True)
class GrammarShape:
    """How a forced call is written: markers before and after it, and its shape — ``object``:
    the call's JSON object; ``array``: a one-element list of it; ``tool_calls``: generic's
    wrapper object; ``named``: the markers name the function (``{name}`` in ``before``) and
    the arguments' JSON follows; ``tagged``: `syntax`'s tags (tagged_calls.py); ``gemma``:
    Gemma 4's ``call:NAME{..}`` (gemma_grammar.py); None: the family has no forced form. ``call_extra`` adds optional
    properties after the arguments (Mistral's 9-character ``id``).

    With ``parallel_tool_calls``, how more calls follow the first (as llama.cpp's grammars
    allow them): ``repeat`` ``block``: the whole block again; ``call``: another call inside
    the block (an array's next item, or between the ``section`` markers, which then wrap the
    calls while ``before``/``after`` are each call's); None: the family writes one call.
    ``{index}`` in a marker is the call's number (Kimi's ids). ``between``: the marker before each call or block
    after the first (Functionary v3.2's ``>>>``, which the prompt writes before the first; Muse Glimmer's
    ``<|eom|><|start|>assistant``, a message's end and the next one's opening), else an optional newline."""

    json: Optional[Literal["object", "array", "tool_calls", "named", "tagged", "gemma"]]
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    call_extra: tuple[tuple[str, Any], ...] = ()  # (property, schema) pairs
    syntax: Optional[TagSyntax] = None
    repeat: Optional[Literal["block", "call"]] = None
    section: tuple[str, str] = ("", "")
    between: str = ""


@dataclass(frozen=True)
class ToolFormat:
    """One family's calls. ``arg_keys``: where a JSON call keeps its arguments (the first is
    what the grammar writes); ``name_key``/``id_key``: its name and id; ``name_as_key``: a
    call is ``{name: {..}}``; ``args_required``: an object without the argument key is not a
    call; ``ends_reasoning``: a call's opening marker also ends an unclosed thinking block;
    ``id_len``/``id_prefix``: the ids ggmlpy makes where the model writes none.

    ``reply_opening``: what the generation prompt writes of the reply, where the template's prompt ends inside
    the reply's first message (Functionary v3.2's ``>>>``, which opens each message, its recipient following):
    the reply is read with it before, and a forced call's grammar starts after it. ``answer_opening``: the
    recipient line of the answer after it (``all\\n``), left out of the content and written before a continued
    answer."""
    name: str
    blocks: tuple[Block, ...]
    grammar: GrammarShape
    arg_keys: tuple[str, ...] = ("arguments",)
    name_key: str = "name"
    id_key: Optional[str] = None
    name_as_key: bool = False
    args_required: bool = False
    ends_reasoning: bool = False
    id_len: int = 24
    id_prefix: str = "call_"
    reply_opening: str = ""
    answer_opening: str = ""


_LLAMA_HEADER = r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:'
_KIMI_CALL = (r"<\|tool_call_begin\|>\s*(?P<id>(?:functions\.)?(?P<name>[\w.\-]+?)(?::\d+)?)\s*"
              r"<\|tool_call_argument_begin\|>")


def _tagged(open_: str, close: str, syntax: TagSyntax, repeat: str = "call", bare: bool = False, **kw: Any) -> dict:
    """The entry of a family whose block holds tagged calls. `bare`: a call may also come
    without the block's opening, its own opening tag starting the block (which still ends at
    `close`), as llama.cpp's Qwen3-Coder parser takes it."""
    blocks = [closed(open_, close, read.tagged(syntax), tagged_calls(syntax))]
    if bare:
        call_open = syntax.call_open[:syntax.call_open.index("{")]
        blocks.append(Block(regex.escape(call_open), "closed", read.tagged(syntax), close=close,
                            stream=tagged_calls(syntax), keeps_open=True))
    return dict(blocks=tuple(blocks),
                grammar=GrammarShape("tagged", (open_ + ("\n" if syntax.newlines else ""),), (close,),
                                     syntax=syntax, repeat=repeat), **kw)  # type: ignore[arg-type]


def _json_block(open_: str, close: str, **kw: Any) -> dict:
    """The entry of a family whose block holds an array of JSON call objects."""
    return dict(blocks=(closed(open_, close, read.read_json, json_calls),),
                grammar=GrammarShape("array", (open_,), (close,), repeat="call"), **kw)


_DEEPSEEK_R1 = r"<｜tool▁call▁begin｜>function<｜tool▁sep｜>(?P<name>[^\n<]+)\n```(?:json)?\n"
_DEEPSEEK_V3 = r"<｜tool▁call▁begin｜>(?P<name>[^<]+)<｜tool▁sep｜>"
_ACTION = "Action:\n```json\n"
# Muse Glimmer's calls (ATEM), each in its own message: <atem:function_calls>, one invoke, </atem:function_calls>
ATEM = TagSyntax('<atem:invoke name="{name}">', "</atem:invoke>", '<atem:parameter name="{key}">', "</atem:parameter>")

FORMATS: Mapping[str, ToolFormat] = MappingProxyType({f.name: f for f in (
    ToolFormat("hermes", blocks=(closed("<tool_call>", "</tool_call>", read.read_json, json_calls),),
               grammar=GrammarShape("object", ("<tool_call>", "\n"), ("\n", "</tool_call>"), repeat="block")),
    ToolFormat("llama3", blocks=(Block(regex.escape("<|python_tag|>"), "rest", read.read_python_tag, stream=json_calls),
                                 Block(_LLAMA_HEADER, "json", read.read_json, json_at_open=True, stream=json_calls)),
               grammar=GrammarShape("object"), arg_keys=("parameters", "arguments"), args_required=True),
    ToolFormat("mistral", blocks=(Block(regex.escape("[TOOL_CALLS]"), "json", read.read_json, stream=json_calls),),
               grammar=GrammarShape("array", ("[TOOL_CALLS]",), repeat="call",
                                    call_extra=(("id", {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}),)),
               id_key="id", id_len=9, id_prefix=""),  # Mistral's template wants 9-character ids
    ToolFormat("mistral_args", blocks=(
        Block(r"\[TOOL_CALLS\](?P<name>[^\[\]\s]+)(?:\[CALL_ID\](?P<id>\w+))?\[ARGS\]", "json",
              read.read_named_json, stream=named_args),),
        grammar=GrammarShape("named", ("[TOOL_CALLS]{name}[ARGS]",), repeat="block"), id_len=9, id_prefix=""),
    # a message to a function: ``>>>NAME\n`` and the arguments' JSON (``>>>all\n`` opens the answer)
    ToolFormat("functionary_v3_2", blocks=(
        Block(r">>>(?!all\n)(?P<name>[\w.\-]+)\n", "json", read.read_named_json, stream=named_args),),
        grammar=GrammarShape("named", ("{name}\n",), repeat="block", between=">>>"),
        reply_opening=">>>", answer_opening="all\n"),
    ToolFormat("functionary_v3_1", blocks=(
        Block(r"<function=(?P<name>[^>\s]+)>", "closed", read.read_named_json, close="</function>",
              stream=named_args),),
        grammar=GrammarShape("named", ("<function={name}>",), ("</function>",), repeat="block")),
    ToolFormat("qwen3_coder", **_tagged("<tool_call>", "</tool_call>", QWEN3_CODER, "block", bare=True,
                                        ends_reasoning=True)),
    ToolFormat("seed_oss", **_tagged("<seed:tool_call>", "</seed:tool_call>", SEED_OSS, "block")),
    ToolFormat("minimax_m2", **_tagged("<minimax:tool_call>", "</minimax:tool_call>", INVOKE)),
    ToolFormat("minimax_m3", **_tagged(MINIMAX_NS + "<tool_call>", MINIMAX_NS + "</tool_call>", MINIMAX_M3)),
    ToolFormat("dsml", blocks=(closed("<｜DSML｜function_calls>", "</｜DSML｜function_calls>", read.tagged(DSML),
                                      tagged_calls(DSML)),
                               closed("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", read.tagged(DSML),
                                      tagged_calls(DSML))),
               grammar=GrammarShape("tagged", ("<｜DSML｜tool_calls>\n",), ("</｜DSML｜tool_calls>",), syntax=DSML,
                                    repeat="call"),
               ends_reasoning=True),
    ToolFormat("glm", **_tagged("<tool_call>", "</tool_call>", ARG_KEY, "block", ends_reasoning=True)),
    ToolFormat("kimi_k3", **_tagged("<|open|>tools<|sep|>", "<|close|>tools<|sep|>", KIMI_K3, ends_reasoning=True)),
    ToolFormat("minicpm5", blocks=(closed('<function name="', "</function>", read.tagged(MINICPM),
                                          tagged_calls(MINICPM), whole=True),),
               grammar=GrammarShape("tagged", syntax=MINICPM, repeat="call")),
    ToolFormat("kimi_k2", blocks=(closed("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", read.read_kimi,
                                         call_list((_KIMI_CALL, "<|tool_call_end|>"))),
                                  Block(_KIMI_CALL, "json", read.read_named_json, close="<|tool_call_end|>",
                                        literal="<|tool_call_begin|>", stream=named_args)),
               ends_reasoning=True,
               grammar=GrammarShape("named", ("<|tool_call_begin|>functions.{name}:{index}"
                                              "<|tool_call_argument_begin|>",), ("<|tool_call_end|>",), repeat="call",
                                    section=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"))),
    ToolFormat("lfm2", blocks=(closed("<|tool_call_start|>", "<|tool_call_end|>", read.read_pythonic, pythonic_calls),),
               grammar=GrammarShape("array", ("<|tool_call_start|>",), ("<|tool_call_end|>",), repeat="call")),
    ToolFormat("gemma4", blocks=(closed("<|tool_call>", "<tool_call|>", read.read_gemma, gemma_calls),),
               grammar=GrammarShape("gemma", repeat="block")),
    ToolFormat("deepseek", blocks=(closed("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", read.read_deepseek,
                                          call_list((_DEEPSEEK_R1, "```<｜tool▁call▁end｜>"),
                                                    (_DEEPSEEK_V3, "<｜tool▁call▁end｜>"))),),
               grammar=GrammarShape("named", ("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>",), ("<｜tool▁call▁end｜>",),
                                    repeat="call", section=("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"))),
    ToolFormat("gigachat3", blocks=(Block(regex.escape("<|message_sep|>\n\nfunction call<|role_sep|>"), "json",
                                          read.read_json, stream=json_calls),),
               grammar=GrammarShape("object", ("<|message_sep|>\n\nfunction call<|role_sep|>\n",))),
    ToolFormat("gigachat3_1", blocks=(Block(regex.escape("<|function_call|>"), "json", read.read_json,
                                            stream=json_calls),),
               grammar=GrammarShape("object", ("<|function_call|>",))),
    ToolFormat("firefunction_v2", blocks=(Block(r"\s?functools", "json", read.read_json, stream=json_calls),),
               grammar=GrammarShape("array", (" functools",), repeat="call")),
    ToolFormat("nemotron_v2", **_json_block("<TOOLCALL>", "</TOOLCALL>")),
    ToolFormat("apriel", **_json_block("<tool_calls>", "</tool_calls>")),
    ToolFormat("apertus", **_json_block("<|tools_prefix|>", "<|tools_suffix|>"), name_as_key=True),
    ToolFormat("command_r7b", **_json_block("<|START_ACTION|>", "<|END_ACTION|>"), name_key="tool_name",
               arg_keys=("parameters",), id_key="tool_call_id"),
    # Command R+: ``Action:`` and a fenced JSON list of calls (the fence closed after it, if the model writes it)
    ToolFormat("command_r_plus", blocks=(Block(regex.escape(_ACTION), "json", read.read_json, close="```",
                                               literal=_ACTION, stream=json_calls),),
               grammar=GrammarShape("array", (_ACTION,), ("\n```",), repeat="call"), name_key="tool_name",
               arg_keys=("parameters",)),
    ToolFormat("harmony", blocks=(),   # read by harmony.py, not by the scanner
               grammar=GrammarShape("named",
                                    ("<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>",),
                                    ("<|call|>",))),
    # read by muse_glimmer.py; a forced call is a message to any recipient (llama.cpp's), its ATEM markup; with
    # parallel calls more messages follow, each after the one before has ended and the next has opened
    ToolFormat("muse_glimmer", blocks=(),
               grammar=GrammarShape("tagged", (" to={attrs}<|message|><atem:function_calls>\n",),
                                    ("</atem:function_calls>",), syntax=ATEM, repeat="block",
                                    between="<|eom|><|start|>assistant")),
    ToolFormat("generic", blocks=(Block(r'\A\s*\{\s*"response"\s*:\s*"', "string"),
                                  Block(r"\A\s*\{", "json", read.read_generic, json_at_open=True,
                                        stream=generic_calls)),
               grammar=GrammarShape("tool_calls", repeat="call")),
)})

# Template text -> the format it teaches, first match wins (llama.cpp's order: the more
# specific markers first). A template none of these match gets the generic format.
DETECT: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|open|>", "<|close|>", "<|end_of_msg|>"), "kimi_k3"),   # its markers are unique to it
    (("<|channel|>", "<|message|>", "functions."), "harmony"),   # gpt-oss
    (("<atem:function_calls>", "<|eom|>"), "muse_glimmer"),
    ((">>>all", ">>>${recipient}"), "functionary_v3_2"),
    (("<seed:tool_call>",), "seed_oss"),
    (("｜DSML｜",), "dsml"),
    (("<minimax:tool_call>",), "minimax_m2"),
    ((MINIMAX_NS,), "minimax_m3"),
    (("<tool_call>", "<function=", "<parameter="), "qwen3_coder"),   # Qwen3-Coder, Qwen 3.5, Nemotron Nano 3
    (("<function=",), "functionary_v3_1"),
    (("<arg_key>",), "glm"),                     # GLM 4.5+, Ling, Spark
    (("[TOOL_CALLS]", "[ARGS]"), "mistral_args"),  # Mistral Small 3.2, Devstral, Ministral 3
    (("<|tool_calls_section_begin|>",), "kimi_k2"),
    (("<｜tool▁calls▁begin｜>",), "deepseek"),         # DeepSeek R1 and V3.1
    (("<|function_call|>",), "gigachat3_1"),
    (("function call", "<|role_sep|>"), "gigachat3"),
    (("functools",), "firefunction_v2"),
    (("<|tool_call_start|>",), "lfm2"),
    (("<|tool_list_start|>",), "lfm2"),
    (("List of tools: [",), "lfm2"),               # LFM2.5 Instruct
    (("<|tool_call>",), "gemma4"),
    (("<TOOLCALL>",), "nemotron_v2"),
    (("<tool_calls>",), "apriel"),
    (("<|tools_prefix|>",), "apertus"),
    (("<|START_ACTION|>",), "command_r7b"),
    (("<|CHATBOT_TOKEN|>", "Action:"), "command_r_plus"),
    (('<function name="',), "minicpm5"),
    (("<tool_call>",), "hermes"),
    (("<|start_header_id|>ipython<|end_header_id|>",), "llama3"),
    (("[TOOL_CALLS]",), "mistral"),
)

# Template text -> markers around the answer that are not part of it (removed from content).
ANSWER_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("<|START_RESPONSE|>", ("<|START_RESPONSE|>", "<|END_RESPONSE|>")),   # Command R7B
    ("<|START_TEXT|>", ("<|START_TEXT|>", "<|END_TEXT|>")),               # Cohere 2 MoE
    # Kimi K3: the response section, the message's closer and end token; and the thinking
    # section's markers, which llama.cpp leaves out of the content when it does not split it
    ("<|end_of_msg|>", ("<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>",
                        "<|end_of_msg|>", "<|open|>think<|sep|>", "<|close|>think<|sep|>")),
    # Command R+ (and the Cohere templates without the markers above): llama.cpp reads the
    # answer as wrapped in its turn's markers
    ("<|END_OF_TURN_TOKEN|>", ("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>")),
    # Ling 3: its end-of-turn marker, which a model may write as text (llama.cpp's extra stop)
    ("<|role_end|>", ("<|role_end|>",)),
)


def detect_tool_format(template_source: Optional[str]) -> str:
    """The tool-call format a chat template teaches its model, found by its marker substrings
    as llama.cpp does; ``generic`` when it has none we read (or there is no template)."""
    src = template_source or ""
    return next((fmt for needles, fmt in DETECT if all(n in src for n in needles)), "generic")


def answer_markers(template_source: Optional[str]) -> tuple[str, ...]:
    """The markers a template writes around the answer itself, which the content leaves out (with
    the recipient line of a format whose messages name one, Functionary v3.2's ``>>>all\\n``)."""
    src = template_source or ""
    spec = FORMATS[detect_tool_format(src)]
    recipient = (spec.reply_opening + spec.answer_opening,) if spec.answer_opening else ()
    return next((markers for needle, markers in ANSWER_MARKERS if needle in src), ()) + recipient


def tool_format(fmt: str) -> ToolFormat:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown tool call format {fmt!r}; expected one of {sorted(FORMATS)}") from None
