"""llama-cpp-python's named chat formats (`Llama(chat_format="llama-2")`), as data.

llama-cpp-python builds these prompts in Python, not from templates: a format picks the
first system message (or a fixed text), keeps the turns whose role it has a label for, and
joins them in one of a few styles, ending with the assistant's label; some add stop strings
to the request. Each `NamedFormat` below says which; `render` joins the turns the way
llama-cpp-python 0.3.36's `llama_chat_format.py` does, quirks included (`intel` prints its
system line's placeholder as it is, `snoozy` drops its system template), so that a program
moving from `llama_cpp` gets the same prompt (tests/llama/chat/expected/_llama_cpp_python_formats.json
holds that library's own renderings).

Its handlers with tool-calling logic of their own (`functionary*`,
`chatml-function-calling`) are not formats of this kind and are refused by name.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

HANDLERS_NOT_PROVIDED = ("functionary", "functionary-v1", "functionary-v2", "chatml-function-calling")


@dataclass(frozen=True)
class NamedFormat:
    """style: how the turns are joined (`_STYLES`); roles: label per role (other roles are
    left out); system: the system part, "{}" standing for the first system message's text
    (a text without "{}" ignores the messages); default_system: that text when there is
    none; system_if_given: the system part only when a system message has text;
    stop: strings added to the request's stop list."""
    style: str
    roles: Mapping[str, str]
    sep: str = ""
    sep2: str = ""
    system: str = "{}"
    default_system: str = ""
    system_if_given: bool = False
    generation: bool = True        # the assistant's label ends the prompt
    suffix: str = ""
    stop: tuple[str, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)


def _llama2(system: str, turns: list, sep: str, sep2: str) -> str:
    seps = (sep, sep2)
    out = system + sep
    for i, (role, text) in enumerate(turns):
        if system and i == 0:
            out += (text or "") + seps[i % 2]
        elif text:
            out += role + text + " " + seps[i % 2]
        else:
            out += role + " "
    return out


def _add_colon_single(system: str, turns: list, sep: str, sep2: str, open_turn: str = ":") -> str:
    """`open_turn` follows the label of a turn without text (the reply's): ":" or ": "."""
    out = system + sep
    for role, text in turns:
        out += f"{role}: {text}{sep}" if text else role + open_turn
    return out


def _add_colon_two(system: str, turns: list, sep: str, sep2: str) -> str:
    seps = (sep, sep2)
    out = system + sep
    for i, (role, text) in enumerate(turns):
        out += f"{role}: {text}{seps[i % 2]}" if text else f"{role}:"
    return out


def _no_colon_single(system: str, turns: list, sep: str, sep2: str) -> str:
    out = system
    for role, text in turns:
        out += role + text + sep if text else role
    return out


def _add_colon_space_single(system: str, turns: list, sep: str, sep2: str) -> str:
    return _add_colon_single(system, turns, sep, sep2, open_turn=": ")


def _chatml(system: str, turns: list, sep: str, sep2: str) -> str:
    out = "" if system == "" else system + sep + "\n"
    for role, text in turns:
        out += f"{role}\n{text}{sep}\n" if text else f"{role}\n"
    return out


def _chatglm3(system: str, turns: list, sep: str, sep2: str) -> str:
    out = system
    for role, text in turns:
        out += f"{role}\n {text}" if text else role
    return out


def _saiga(system: str, turns: list, sep: str, sep2: str) -> str:
    out = "".join(f"<s>{role}\n{text}</s>" if text else f"<s>{role}\n" for role, text in turns)
    return (out + "<s>bot").strip()


_STYLES = {"llama2": _llama2, "add_colon_single": _add_colon_single, "add_colon_two": _add_colon_two,
           "no_colon_single": _no_colon_single, "add_colon_space_single": _add_colon_space_single,
           "chatml": _chatml, "chatglm3": _chatglm3, "saiga": _saiga}

_VICUNA = ("A chat between a curious user and an artificial intelligence assistant. The assistant "
           "gives helpful, detailed, and polite answers to the user's questions.")
_OPENBUDDY = (
    "You are a helpful, respectful and honest INTP-T AI Assistant named Buddy. You are talking to a human User.\n"
    "Always answer as helpfully and logically as possible, while being safe. Your answers should not include any "
    "harmful, political, religious, unethical, racist, sexist, toxic, dangerous, or illegal content. Please ensure "
    "that your responses are socially unbiased and positive in nature.\n"
    "If a question does not make any sense, or is not factually coherent, explain why instead of answering "
    "something not correct. If you don't know the answer to a question, please don't share false information.\n"
    "You can speak fluently in many languages, for example: English, Chinese.\n"
    "You cannot access the internet, but you have vast knowledge, cutoff: 2021-09.\n"
    "You are trained by OpenBuddy team, (https://openbuddy.ai, https://github.com/OpenBuddy/OpenBuddy), you are "
    "based on LLaMA and Falcon transformers model, not related to GPT or OpenAI.\n\n")
_OPEN_ORCA = (
    "You are a helpful assistant. Please answer truthfully and write out your thinking step by step to be sure "
    "you get the right answer. If you make a mistake or encounter an error in your thinking, say so out loud and "
    "attempt to correct it. If you don't know or aren't sure about something, say so clearly. You will act as a "
    "professional logician, mathematician, and physicist. You will also act as the most appropriate type of "
    "expert to answer any particular question or solve the relevant problem; state which expert type your are, "
    "if so. Also think of any particular named expert that would be ideal to answer the relevant question or "
    "solve the relevant problem; name and act as them, if appropriate.")
_SNOOZY = ("The prompt below is a question to answer, a task to complete, or a conversation to respond to; "
           "decide which and write an appropriate response.")
_LLAMA3 = {r: f"<|start_header_id|>{r}<|end_header_id|>\n\n" for r in ("system", "user", "assistant")}

FORMATS: dict[str, NamedFormat] = {
    "llama-2": NamedFormat("llama2", {"user": "<s>[INST]", "assistant": "[/INST]"}, " ", "</s>",
                           system="[INST] <<SYS>>\n{}\n<</SYS>>", system_if_given=True,
                           generation=False, suffix="[/INST]"),
    "llama-3": NamedFormat("no_colon_single", _LLAMA3, "<|eot_id|>", system="", stop=("<|eot_id|>",)),
    "alpaca": NamedFormat("add_colon_two", {"user": "### Instruction", "assistant": "### Response"},
                          "\n\n", "</s>", generation=False),
    "qwen": NamedFormat("chatml", {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"},
                        "<|im_end|>", system="<|im_start|>system\n{}",
                        default_system="You are a helpful assistant.", stop=("<|endoftext|>",)),
    "vicuna": NamedFormat("add_colon_two", {"user": "USER", "assistant": "ASSISTANT"}, " ", "</s>",
                          system=_VICUNA),
    "oasst_llama": NamedFormat("no_colon_single", {"user": "<|prompter|>", "assistant": "<|assistant|>"},
                               "</s>", system="[INST] <<SYS>>\n{}\n<</SYS>>\n\n"),
    "baichuan-2": NamedFormat("no_colon_single", {"user": "<reserved_106>", "assistant": "<reserved_107>"}),
    "baichuan": NamedFormat("no_colon_single", {"user": "<reserved_102>", "assistant": "<reserved_103>"}),
    "openbuddy": NamedFormat("add_colon_single", {"user": "User", "assistant": "Assistant"}, "\n",
                             system=_OPENBUDDY),
    "redpajama-incite": NamedFormat("add_colon_single", {"user": "<human>", "assistant": "<bot>"}, "\n",
                                    stop=("<human>",)),
    "snoozy": NamedFormat("add_colon_single", {"user": "### Prompt", "assistant": "### Response"}, "\n",
                          default_system=_SNOOZY, stop=("###",)),
    "phind": NamedFormat("add_colon_single", {"user": "### User Message", "assistant": "### Assistant"},
                         "\n\n", system="### System Prompt\nYou are an intelligent programming assistant."),
    "intel": NamedFormat("add_colon_single", {"user": "### User:", "assistant": "### Assistant:"}, "\n",
                         system="### System:\n{system_message}"),
    "open-orca": NamedFormat("add_colon_space_single", {"User": "User", "Assistant": "Assistant"},
                             "<|end_of_turn|>\n", system=_OPEN_ORCA, stop=("User",),
                             extra={"assistant_label": "Assistant"}),
    "mistrallite": NamedFormat("no_colon_single", {"user": "<|prompter|>", "assistant": "</s>\n<|assistant|>"},
                               " ", system="<|system|>{}</s>"),
    "zephyr": NamedFormat("chatml", {"user": "<|user|>\n", "assistant": "<|assistant|>\n"}, "</s>",
                          system="<|system|>\n{}", stop=("</s>",)),
    "pygmalion": NamedFormat("chatml", {"user": "<|user|>", "assistant": "<|model|>"}, "\n",
                             system="<|system|>{}", stop=("\n",)),
    "chatml": NamedFormat("chatml", {"user": "<|im_start|>user", "assistant": "<|im_start|>assistant"},
                          "<|im_end|>", system="<|im_start|>system\n{}", stop=("<|im_end|>",)),
    "mistral-instruct": NamedFormat("mistral_instruct", {}, stop=("</s>",)),
    "chatglm3": NamedFormat("chatglm3", {"user": "<|user|>", "assistant": "<|assistant|>"}, "</s>",
                            system="<|system|>\n{}", stop=("</s>",)),
    "openchat": NamedFormat("chatml", {"user": "GPT4 Correct User: ",
                                       "assistant": "<|end_of_turn|>GPT4 Correct Assistant: "},
                            "<|end_of_turn|>", system="{}<|end_of_turn|>", stop=("<|end_of_turn|>",)),
    "saiga": NamedFormat("saiga", {"user": "user", "bot": "bot", "system": "system"}, system="",
                         generation=False),
    "gemma": NamedFormat("no_colon_single", {"user": "<start_of_turn>user\n",
                                             "assistant": "<start_of_turn>model\n"},
                         "<end_of_turn>\n", system="", stop=("<end_of_turn>\n",)),
}


def _first_system(messages: Sequence[Mapping[str, Any]]) -> str:
    for m in messages:
        if m.get("role") == "system":
            return m.get("content") or ""
    return ""


def render(fmt: NamedFormat, messages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt llama-cpp-python's formatter of the same name makes of `messages`."""
    if fmt.style == "mistral_instruct":
        out = ""
        for m in messages:
            content = m.get("content")
            if m.get("role") == "user" and isinstance(content, str):
                out += "[INST] " + content
            elif m.get("role") == "assistant" and content is not None:
                out += " [/INST]" + content + "</s>"
        return out + " [/INST]"
    given = _first_system(messages)
    text = given or fmt.default_system
    system = "" if fmt.system_if_given and not text else fmt.system.replace("{}", text)
    turns = [(fmt.roles[m["role"]], m.get("content") if isinstance(m.get("content"), str) else None)
             for m in messages if m.get("role") in fmt.roles]
    if fmt.generation:
        turns.append((fmt.extra.get("assistant_label", fmt.roles.get("assistant", "")), None))
    return _STYLES[fmt.style](system, turns, fmt.sep, fmt.sep2) + fmt.suffix


class FormatTemplate:
    """A named format where the chat code takes a `ChatTemplate`: the same `render`,
    `source` (empty: no tool syntax of its own, so tools get the generic instruction) and
    `stop` (the strings the format adds to a request's stop list)."""

    source = ""

    def __init__(self, name: str):
        self.name = name
        self.format = FORMATS[name]
        self.stop: tuple[str, ...] = self.format.stop

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, **kwargs: Any) -> str:
        """llama-cpp-python's prompt; like its formatters, this always ends where the
        assistant's reply starts and ignores tools and template variables."""
        return render(self.format, messages)

    def __repr__(self) -> str:
        return f"FormatTemplate({self.name!r})"
