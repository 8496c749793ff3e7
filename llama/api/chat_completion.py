"""`create_chat_completion`: messages in, OpenAI's `chat.completion` (or chunks) out.

messages -> the chat template (the file's, a named built-in, or chatml) -> prompt tokens ->
the completion loop with the constraints the request asks for:
- `response_format` `json_object` (optionally with `schema`, llama-cpp-python's form) or
  OpenAI's `json_schema` -> a JSON-schema grammar;
- `tool_choice` `required` or a named function -> a grammar that allows one call (one or
  more with `parallel_tool_calls`) in the template family's syntax, with the arguments
  checked against the tool's schema; `auto` lets the model choose and parses calls out of
  its text (streamed as llama-server streams them: a call's name, then its arguments as they
  grow), and with `parallel_tool_calls` false the reply ends where a second call begins; `none`
  keeps the text as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from llama.api import responses
from llama.api.completion import make_sequence, resolve_max_tokens, run_sequence, sampling_params
from llama.api.logprobs import chat_logprobs
from llama.api.sequence import Sequence, Step
from llama.chat import ChatTemplate, ChatTemplateError, select_template
from llama.chat.caps import object_arguments, parallel_calls, with_object_arguments
from llama.chat.call_formats import answer_markers, tool_format
from llama.chat.named_formats import FormatTemplate
from llama.api.chat_prompt import ChatPrompt, chat_prompt, normalize_messages
from llama.chat.reasoning import INLINE, Reasoning, ThinkingTags, check_format, thinking_tags
from llama.chat.thinking_forms import ThinkingForms, thinking_forms
from llama.chat.reply import ReplyReader, parse_reply
from llama.chat.tool_calls import detect_tool_format, reasoning_stops, tool_call_grammar
from llama.model import Model
from llama.sampling.reasoning_budget import ReasoningBudget

if TYPE_CHECKING:
    from llama.api.llama import Llama


class ChatSetup:
    """The model's chat template, chosen once and parsed on first use: a file whose
    template is broken or hostile loads, and fails only when chat is used."""

    def __init__(self, model: Model, *, chat_format: str | None, chat_template: str | None):
        self.model = model
        self.chat_format = chat_format
        self.chat_template = chat_template
        self._template: ChatTemplate | FormatTemplate | None = None
        self._object_arguments: bool | None = None
        self._parallel_calls: bool | None = None
        self._thinking_forms: ThinkingForms | None = None

    @classmethod
    def for_template(cls, template: ChatTemplate | FormatTemplate) -> "ChatSetup":
        """A setup with its template given (no model: it renders and reads replies, it does
        not tokenize)."""
        setup = cls(None, chat_format=None, chat_template=None)  # type: ignore[arg-type]
        setup._template = template
        return setup

    @property
    def template(self) -> ChatTemplate | FormatTemplate:
        if self._template is None:
            vocab = self.model.vocab
            bos, eos = vocab.special.bos, vocab.special.eos
            self._template = select_template(
                self.model.gguf.metadata, chat_format=self.chat_format,
                chat_template=self.chat_template,
                bos_token=vocab.tokens[bos] if bos is not None else "",
                eos_token=vocab.tokens[eos] if eos is not None else "", lenient=True)
        return self._template

    @property
    def object_arguments(self) -> bool:
        """Whether the template reads tool-call arguments as objects (llama/chat/caps.py)."""
        if self._object_arguments is None:
            template = self.template
            self._object_arguments = isinstance(template, ChatTemplate) and object_arguments(template)
        return self._object_arguments

    @property
    def parallel_calls(self) -> bool:
        """Whether the template writes several calls in one message: a request's default
        `parallel_tool_calls`, as llama-server's (llama/chat/caps.py)."""
        if self._parallel_calls is None:
            template = self.template
            self._parallel_calls = isinstance(template, ChatTemplate) and parallel_calls(template)
        return self._parallel_calls

    @property
    def tool_format(self) -> str:
        return detect_tool_format(self.template.source)

    @property
    def thinking(self) -> ThinkingTags | None:
        """The template's thinking markers (None: the model does not think)."""
        return thinking_tags(self.template.source)

    @property
    def thinking_forms(self) -> ThinkingForms | None:
        """The thinking markers as the template writes them around a reasoning, whitespace and
        all, which a continued message is written with (llama/chat/thinking_forms.py); None for
        a model that does not think. Learnt once, from probe renders of a Jinja template."""
        tags = self.thinking
        if tags is None:
            return None
        if self._thinking_forms is None:
            template = self.template
            if isinstance(template, ChatTemplate):
                def render(messages: list, add_generation_prompt: bool, enable_thinking: bool) -> str:
                    return self.render(messages, add_generation_prompt=add_generation_prompt,
                                       enable_thinking=enable_thinking)
                self._thinking_forms = thinking_forms(render, tags, template.source)
            else:
                self._thinking_forms = ThinkingForms(tags.start, tags.end)
        return self._thinking_forms

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True,
               tools: list[dict] | None = None, **kwargs: Any) -> str:
        """The template rendered as llama-server renders it: tool-call arguments as objects
        where the template reads them so, and absent tools iterated as none where a template
        loops over them unguarded (llama.cpp's engine iterates a null as empty)."""
        messages = normalize_messages(messages)
        if self.object_arguments:
            messages = with_object_arguments(messages)
        try:
            return self.template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs)
        except ChatTemplateError as first:
            if tools is not None:
                raise
            try:
                return self.template.render(messages, add_generation_prompt=add_generation_prompt, tools=[], **kwargs)
            except ChatTemplateError:
                raise first from None

    def tokens(self, text: str) -> list[int]:
        """The prompt's ids: control tokens parsed, BOS added by the vocab's rule but never
        twice (templates often write the BOS themselves, as llama.cpp's chat code handles)."""
        vocab = self.model.vocab
        bos = vocab.special.bos
        if vocab.flags.add_bos and bos is not None and text.startswith(vocab.tokens[bos]):
            text = text[len(vocab.tokens[bos]):]
        return self.model.tokenize(text, add_special=True, parse_special=True)


def _legacy_functions(functions, function_call) -> tuple[list | None, Any]:
    """OpenAI's deprecated functions/function_call, as tools/tool_choice."""
    tools = [{"type": "function", "function": f} for f in functions] if functions else None
    choice = function_call
    if isinstance(function_call, dict) and "name" in function_call:
        choice = {"type": "function", "function": {"name": function_call["name"]}}
    return tools, choice


def response_grammar(response_format: dict | None) -> Any:
    """The grammar a response_format asks for (None for text)."""
    from llama.grammar import Grammar
    return None if response_format is None else Grammar.from_response_format(response_format)


def _tool_choice(tools: list | None, tool_choice: Any) -> Any:
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise ValueError("tool_choice needs tools")
        return "none"
    if tool_choice is None:
        return "auto"
    if tool_choice in ("none", "auto", "required"):
        return tool_choice
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name not in {t.get("function", {}).get("name") for t in tools}:
            raise ValueError(f"tool_choice names the function {name!r}, which is not among the tools")
        return tool_choice
    raise ValueError(f"tool_choice {tool_choice!r} is not none, auto, required or a named function")


@dataclass
class ChatJob:
    """A chat request made ready to run: its `Sequence` and what the response needs
    (`reader`: how its text becomes reasoning, content and tool calls)."""
    seq: Sequence
    meta: tuple  # (id, created, model)
    reader: ReplyReader
    include_usage: bool
    logprobs: bool

    def response(self) -> dict:
        """The `chat.completion` of the finished sequence."""
        seq = self.seq
        message = parse_reply(seq.completion_text(), self.reader)
        finish = "tool_calls" if message.get("tool_calls") else seq.finish_reason
        lp = chat_logprobs(seq.logprobs) if self.logprobs else None
        return responses.chat_completion(*self.meta, message, finish, lp,
                                         responses.usage(len(seq.prompt), len(seq.tokens)))

    def chunks(self) -> "ChatChunks":
        return ChatChunks(self)


class ChatChunks:
    """The streamed chunks, built step by step: a role delta, reasoning, content (or
    tool-call) deltas, a final chunk with the finish reason; with include_usage, every chunk
    has "usage": null and a last one carries the usage."""

    def __init__(self, job: ChatJob):
        self.job = job
        self.reply = job.reader.stream()
        self.saw_call = False

    def _chunk(self, delta: dict, finish: str | None = None, lp: dict | None = None) -> dict:
        return responses.chat_chunk(*self.job.meta, delta, finish, lp,
                                    with_usage_field=self.job.include_usage)

    def start(self) -> list[dict]:
        return [self._chunk({"role": "assistant", "content": None})]

    def feed(self, step: Step) -> list[dict]:
        lp = chat_logprobs(step.logprobs) if self.job.logprobs and step.logprobs else None
        deltas = self.reply.feed(step.text)
        if step.finish_reason is not None:
            deltas += self.reply.finish()
        out = []
        for i, delta in enumerate(deltas):
            self.saw_call = self.saw_call or "tool_calls" in delta
            out.append(self._chunk(delta, None, lp if i == 0 else None))
        if not deltas and lp is not None:
            out.append(self._chunk({}, None, lp))
        return out

    def end(self) -> list[dict]:
        seq = self.job.seq
        out = [self._chunk({}, "tool_calls" if self.saw_call else seq.finish_reason)]
        if self.job.include_usage:
            out.append(responses.usage_chunk(*self.job.meta,
                                                  responses.usage(len(seq.prompt), len(seq.tokens))))
        return out


def prepare_chat(llm: "Llama", messages: list[dict], *, functions=None,
                 function_call=None, tools: list[dict] | None = None, tool_choice=None,
                 temperature: float = 0.2, top_p: float = 0.95, top_k: int = 40,
                 min_p: float = 0.05, typical_p: float = 1.0,
                 stop: str | list[str] | None = None, seed: int | None = None,
                 response_format: dict | None = None, max_tokens: int | None = None,
                 presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 repeat_penalty: float = 1.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                 mirostat_eta: float = 0.1, model: str | None = None,
                 logits_processor=None, grammar=None,
                 logit_bias: dict[int, float] | None = None,
                 logprobs: bool | None = None, top_logprobs: int | None = None,
                 stream_options: dict | None = None,
                 chat_template_kwargs: dict | None = None,
                 reasoning_format: str = "auto", reasoning: str = "auto",
                 reasoning_effort: str | None = None, reasoning_budget: int = -1,
                 reasoning_budget_message: str | None = None,
                 add_generation_prompt: bool = True, continue_final_message: bool | str | None = None,
                 n_ctx: int | None = None, context_shift: bool = False,
                 parallel_tool_calls: bool | None = None,
                 **server_sampling: Any) -> ChatJob:
    """A chat request -> a `ChatJob` (template, constraints, sampler chain); the checks
    fail here, before anything is decoded. `n_ctx`: the context the sequence may fill.
    `reasoning_format`, `reasoning` (llama-server's --reasoning on/off/auto) and
    `reasoning_effort`: how a thinking model's reasoning is asked for and split off
    (`template_variables`); `reasoning_budget` (-1: none) caps it, forcing the end marker
    after `reasoning_budget_message` (llama/sampling/reasoning_budget.py). A last assistant
    message is continued, not answered (`final_continuation`). `parallel_tool_calls`: whether
    a reply may make more than one call (None: whether the template writes several, as
    llama-server decides). `server_sampling`: llama-server's fields beyond
    llama-cpp-python's arguments (completion.sampling_params)."""
    if functions:
        tools, tool_choice = _legacy_functions(functions, function_call)
    choice = _tool_choice(tools, tool_choice)
    setup = llm._chat
    check_format(reasoning_format)
    fmt = setup.tool_format if tools else "generic"
    parallel = bool(tools) and (setup.parallel_calls if parallel_tool_calls is None else bool(parallel_tool_calls))
    prompt = chat_prompt(setup, messages, tools=tools, generic_tools=bool(tools) and choice != "none"
                               and fmt == "generic", reasoning=reasoning, reasoning_effort=reasoning_effort,
                               chat_template_kwargs=chat_template_kwargs,
                               add_generation_prompt=add_generation_prompt,
                               continue_final_message=continue_final_message)
    tags = setup.thinking
    ids = setup.tokens(prompt.text)
    if tags is not None and reasoning_budget >= 0:
        logits_processor = list(logits_processor or []) + [
            budget_processor(llm, tags, reasoning_budget, reasoning_budget_message, len(ids), prompt.opened)]
    n_max = resolve_max_tokens(max_tokens, len(ids), n_ctx or llm.n_ctx(), context_shift)

    constraint = grammar
    if choice in ("required",) or isinstance(choice, dict):
        if grammar is not None or response_format not in (None, {"type": "text"}):
            raise ValueError("tool_choice required/named cannot be combined with grammar or "
                             "response_format")
        from llama.grammar import Grammar
        constraint = Grammar.from_lark(tool_call_grammar(tools, choice, fmt, parallel=parallel))
    elif response_format is not None:
        if grammar is not None:
            raise ValueError("give either grammar or response_format, not both")
        constraint = response_grammar(response_format)
    if top_logprobs is not None and not logprobs:
        raise ValueError("top_logprobs needs logprobs=true")
    if top_logprobs is not None and not 0 <= int(top_logprobs) <= 20:
        raise ValueError(f"top_logprobs must be in [0, 20], got {top_logprobs}")
    params = sampling_params(llm, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                             typical_p=typical_p, repeat_penalty=repeat_penalty,
                             presence_penalty=presence_penalty,
                             frequency_penalty=frequency_penalty, logit_bias=logit_bias, seed=seed,
                             mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                             mirostat_eta=mirostat_eta, n_ctx=n_ctx or llm.n_ctx(), **server_sampling)
    if setup.template.stop:   # a named format's own (llama-cpp-python adds them to the request's)
        stop = ([stop] if isinstance(stop, str) else list(stop or [])) + list(setup.template.stop)
    seq = make_sequence(llm, ids, max_tokens=n_max, stop=stop,
                        logprobs=int(top_logprobs or 0) if logprobs else None, params=params,
                        grammar=constraint, logits_processor=logits_processor)
    meta = (responses.new_id("chatcmpl"), responses.now(), model or llm.model_path)
    include_usage = bool((stream_options or {}).get("include_usage"))
    json_answer = isinstance(response_format, dict) and response_format.get("type") in ("json_object", "json_schema")
    reader = reply_reader(setup, prompt, tools, choice, reasoning_format, parallel, json_answer)
    if choice == "auto" and not parallel:
        seq.complete = _complete_at_first_call(reader)
    return ChatJob(seq, meta, reader, include_usage, bool(logprobs))


def _complete_at_first_call(reader: ReplyReader) -> Callable[[str], bool]:
    """A reply read as it comes, complete once a second call begins: with parallel_tool_calls
    false llama.cpp's grammar would not have let the model write it."""
    stream = reader.stream()

    def complete(text: str) -> bool:
        stream.feed(text)
        return stream.done
    return complete


def reply_reader(setup: "ChatSetup", prompt: ChatPrompt, tools: list | None, choice: Any,
                 reasoning_format: str, parallel: bool = True, json_answer: bool = False) -> ReplyReader:
    """How the reply to `prompt` is read: the template's thinking markers split off the
    reasoning (unless `reasoning_format` is "none": then a thinking block the prompt opened
    is given back in the content, marker and all, as llama-server gives it, or for Ling its
    text without the markers), its tool-call
    syntax reads the calls (unless there are no tools or `tool_choice` is "none"; only the
    first without `parallel`); with `json_answer` (a schema's response format) a ```json
    fence around the answer is left out. What the prompt wrote of the reply is read with it:
    a continued message, the reasoning's lead after the opened block's marker (Apriel 1.6),
    the opening of the reply's first message (Functionary v3.2's `>>>`)."""
    tags = setup.thinking
    spec = tool_format(setup.tool_format)
    fmt = spec.name if tools and choice != "none" else None
    prefill = prompt.prefill
    opened = ""   # the thinking block the prompt opened, marker and all
    if tags is not None and prompt.opened and not prefill:
        opened = prompt.text[prompt.text.rfind(tags.start):]
    split = None
    if tags is not None and (reasoning_format != "none" or tags.inline_when_none):
        if opened[len(tags.start):].strip():   # the prompt wrote the reasoning's lead: read from the marker
            prefill, opened = opened, ""
        split_format = {"auto": "deepseek", "none": INLINE}.get(reasoning_format, reasoning_format)
        split = Reasoning(tags, split_format, bool(opened), reasoning_stops(fmt))
    elif opened:
        prefill = opened
    if spec.reply_opening and prompt.text[:len(prompt.text) - len(prompt.prefill)].endswith(spec.reply_opening):
        prefill = spec.reply_opening + prefill
    return ReplyReader(split, fmt, tools, prefill=prefill, family=spec.name,
                       answer_markers=answer_markers(setup.template.source), parallel=parallel,
                       json_fence=json_answer)


def budget_processor(llm: "Llama", tags: ThinkingTags, budget: int, message: str | None,
                     n_prompt: int, opened: bool) -> ReasoningBudget:
    """The reasoning budget for this model's markers: the message, then the end marker, forced."""
    forced = llm.model.vocab.tokenize((message or "") + tags.end, add_special=False, parse_special=True)
    return ReasoningBudget(tags.start, tags.end, forced, budget, llm.piece, n_prompt=n_prompt, opened=opened)


def create_chat_completion(llm: "Llama", messages: list[dict], *, stream: bool = False,
                           **kwargs: Any) -> dict | Iterator[dict]:
    """llama-cpp-python's create_chat_completion (same arguments and defaults, see
    `prepare_chat`), plus OpenAI's `json_schema` response format, `tool_choice="auto"`,
    `stream_options` and the template's extra variables (`chat_template_kwargs`, e.g.
    enable_thinking)."""
    job = prepare_chat(llm, messages, **kwargs)
    steps = run_sequence(llm, job.seq)
    if stream:
        return _stream(job.chunks(), steps)
    for _ in steps:
        pass
    return job.response()


def _stream(chunks: ChatChunks, steps: Iterator[Step]) -> Iterator[dict]:
    yield from chunks.start()
    for step in steps:
        yield from chunks.feed(step)
    yield from chunks.end()
