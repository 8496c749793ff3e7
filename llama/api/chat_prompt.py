"""The prompt of a chat request, as llama-server makes it: the template rendered with the
variables llama.cpp gives every template (`template_variables`), the tools described in a
system message where the template cannot show them, and a last assistant message
continued rather than answered (`final_continuation`, `continue_prompt`)."""
from __future__ import annotations

from datetime import datetime
from os.path import commonprefix
from typing import TYPE_CHECKING, NamedTuple

from llama.chat.call_formats import tool_format
from llama.chat.reasoning import ThinkingTags, opens_thinking
from llama.chat.thinking_forms import ThinkingForms
from llama.chat.tool_calls import generic_tools_instruction

if TYPE_CHECKING:
    from llama.api.chat_completion import ChatSetup


class ChatPrompt(NamedTuple):
    """A rendered chat prompt. `opened`: it ends inside the model's reasoning. `prefill`: the
    part of the reply the prompt already wrote (a continued assistant message, markers and
    all), which the reply is read with, as llama-server returns it: the continued message
    whole, not only its new text."""
    text: str
    opened: bool
    prefill: str = ""


def chat_prompt(setup: "ChatSetup", messages: list, *, tools: list | None = None, generic_tools: bool = False,
                reasoning: str = "auto", reasoning_effort: str | None = None,
                chat_template_kwargs: dict | None = None, add_generation_prompt: bool = True,
                continue_final_message: bool | str | None = None) -> ChatPrompt:
    """The prompt of a chat request. `generic_tools`: the template has no tool syntax ggmlpy
    reads, so the tools are described in a first system message (`generic_tools_instruction`).
    `continue_final_message`: as llama-server's, true, "content" or "reasoning_content"."""
    mode = continuation_mode(continue_final_message)   # refuses an unknown mode first
    continuation = final_continuation(messages, add_generation_prompt, continue_final_message)
    if continuation is not None:
        messages = messages[:-1]
    msgs = normalize_messages(messages)
    if generic_tools:
        msgs = [{"role": "system", "content": generic_tools_instruction(tools or [])}] + msgs
    tags = setup.thinking
    variables = template_variables(tags, reasoning, reasoning_effort, chat_template_kwargs)
    text = setup.render(msgs, add_generation_prompt=add_generation_prompt or continuation is not None,
                        tools=tools or None, **variables)
    if continuation is None:
        return ChatPrompt(text, opens_thinking(text, tags))
    # as llama.cpp splits it: the prompt without a generation prompt, then what adding one adds
    before = setup.render(msgs, add_generation_prompt=False, tools=tools or None, **variables)
    generation = text[len(commonprefix([before, text])):]
    spec = tool_format(setup.tool_format)
    if spec.answer_opening and generation.endswith(spec.reply_opening):   # the continued answer's recipient line
        generation += spec.answer_opening
    kept, written, in_reasoning = continue_prompt(generation, continuation, setup.thinking_forms, mode)
    return ChatPrompt(before + kept + written, in_reasoning, written)


def normalize_messages(messages: list[dict]) -> list[dict]:
    """Check the roles and flatten OpenAI's content parts: text parts are joined (as
    llama.cpp does for templates that take a string); other part types are refused."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise ValueError(f"messages[{i}] must be an object with a 'role'")
        if msg["role"] not in ("system", "developer", "user", "assistant", "tool", "function"):
            raise ValueError(f"messages[{i}].role {msg['role']!r} is not one of system, user, "
                             "assistant, tool")
        if "content" not in msg and msg["role"] != "assistant":   # llama-server's rule
            raise ValueError(f"messages[{i}] ({msg['role']}) has no 'content': all non-assistant "
                             "messages must contain 'content'")
        content = msg.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ValueError(f"messages[{i}].content[{j}]: content part type {kind!r} is "
                                     "not supported (only 'text')")
                texts.append(str(part.get("text", "")))
            msg = {**msg, "content": "".join(texts)}
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of parts")
        out.append(msg)
    return out


def continuation_mode(continue_final_message: bool | str | None) -> str:
    """Which part of a continued message the reply goes on with, as llama-server reads
    `continue_final_message`: "content", "reasoning_content", or "auto" (true, or a last
    assistant message without the field: its reasoning where it has reasoning and no content,
    else its content)."""
    if continue_final_message is None or isinstance(continue_final_message, bool):
        return "auto"
    if continue_final_message not in ("content", "reasoning_content"):
        raise ValueError(f"continue_final_message {continue_final_message!r} is not one of true, false, "
                         "'content', 'reasoning_content'")
    return continue_final_message


def final_continuation(messages: list, add_generation_prompt: bool,
                       continue_final_message: bool | str | None) -> dict | None:
    """The assistant message the reply continues, or None, by llama-server's rules: a chat
    that ends with an assistant message is continued from it (prefill), as it is with
    `continue_final_message` (vLLM's and transformers' name for it); asking for that and for
    `add_generation_prompt` at once, two assistant messages at the end, or continuing a
    message with tool calls is an error."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return None
    last = messages[-1]
    explicit = continue_final_message is not None and continue_final_message is not False
    if explicit and add_generation_prompt:
        raise ValueError("Cannot set both add_generation_prompt and continue_final_message to true.")
    if continue_final_message is False or last.get("role") != "assistant":
        if explicit:
            raise ValueError("continue_final_message needs a last assistant message to continue")
        return None
    if not explicit and len(messages) >= 2 and isinstance(messages[-2], dict) \
            and messages[-2].get("role") == "assistant":
        raise ValueError("Cannot have 2 or more assistant messages at the end of the list.")
    if last.get("tool_calls"):
        raise ValueError("Cannot continue an assistant message that contains tool calls.")
    return last


def continue_prompt(generation: str, message: dict, forms: ThinkingForms | None,
                    mode: str = "auto") -> tuple[str, str, bool]:
    """How the generation prompt is continued by `message`, as llama.cpp writes it: (the part of
    the generation prompt kept, the message as written after it, whether that ends inside the
    reasoning). For a thinking model the generation prompt is cut where the start marker (`forms`,
    with its whitespace) is in it, and the message's reasoning follows the start marker, left open
    when the reply continues the reasoning (`mode` "reasoning_content", or "auto" and the message
    has reasoning and no content; its content is then left out), else closed by the end marker
    and followed by the content, whose text parts are joined by a blank line. A model that does
    not think continues the content only."""
    content = message.get("content") or ""
    if isinstance(content, list):
        content = "\n\n".join(str(p.get("text", "")) for p in content
                               if isinstance(p, dict) and p.get("type") == "text")
    thought = message.get("reasoning_content") or ""
    in_reasoning = mode == "reasoning_content" or (mode == "auto" and bool(thought) and not content)
    answer = "" if in_reasoning else content
    if forms is None:
        return generation, answer, False
    if forms.opening is not None:
        kept = forms.opening
    else:
        cut = generation.find(forms.start)
        kept = generation[:cut] if cut >= 0 else generation
    if forms.closes_empty and not thought:
        return kept, forms.end + answer, False
    if in_reasoning:
        return kept, forms.start + thought, True
    return kept, forms.start + thought + forms.end + content, False


def template_variables(tags: ThinkingTags | None, reasoning: str = "auto", reasoning_effort: str | None = None,
                       chat_template_kwargs: dict | None = None) -> dict:
    """The variables llama.cpp gives every chat template besides the messages:
    `enable_thinking` (true where the model thinks, unless `reasoning` is "off"; "on"
    asks for it even where the template shows no thinking), today's `date_string` and
    `datetime` (Llama 3.x and FireFunction print them), `reasoning_effort` ("none" turns
    thinking off), then the request's own `chat_template_kwargs`, which win."""
    if reasoning not in ("on", "off", "auto"):
        raise ValueError(f"reasoning {reasoning!r} is not one of on, off, auto")
    today = datetime.now()
    variables: dict = {"enable_thinking": reasoning == "on" or (reasoning == "auto" and tags is not None),
                       "date_string": today.strftime("%d %b %Y"), "datetime": today.strftime("%b %d %Y")}
    if reasoning_effort == "none":
        variables["enable_thinking"] = False
    elif reasoning_effort:
        variables["reasoning_effort"] = reasoning_effort
    kwargs = dict(chat_template_kwargs or {})
    if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
        raise ValueError("invalid type for \"enable_thinking\" (expected boolean, got "
                         f"{type(kwargs['enable_thinking']).__name__})")
    return {**variables, **kwargs}
