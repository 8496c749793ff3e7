"""The thinking markers with their whitespace, learnt from a template as llama.cpp's template
analysis learns them (llama/chat/thinking_forms.py), and a continued message written with them
(`continue_prompt`)."""
from __future__ import annotations

from llama.api.chat_prompt import continue_prompt
from llama.chat import ChatTemplate
from llama.chat.reasoning import ThinkingTags
from llama.chat.thinking_forms import ThinkingForms, thinking_forms

THINK = ThinkingTags("<think>", "</think>")
TURNS = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
# a past message's reasoning, whitespace and all, and a generation prompt that opens the block
WRAPPED = ("{% for m in messages %}<|{{ m.role }}|>{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}"
           "\n</think>\n\n{% endif %}{{ m.content }}{% endfor %}"
           "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking %}<think>\n"
           "{% else %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def forms_of(source: str, tags: ThinkingTags = THINK) -> ThinkingForms:
    template = ChatTemplate(source, lenient=True)

    def render(messages: list, add_generation_prompt: bool, enable_thinking: bool) -> str:
        return template.render(messages, add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking)
    return thinking_forms(render, tags, source)


def test_the_markers_around_a_past_reasoning_keep_their_whitespace():
    assert forms_of(WRAPPED) == ThinkingForms("<think>\n", "\n</think>\n\n")


def test_without_a_start_marker_before_the_reasoning_the_generation_prompt_gives_it():
    """The reasoning ends at the end marker alone (its whitespace after only); what thinking on
    adds to the generation prompt is the start marker."""
    source = ("{% for m in messages %}<|{{ m.role }}|>{% if m.reasoning_content %}{{ m.reasoning_content }}"
              " </think>\n{% endif %}{{ m.content }}{% endfor %}"
              "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking %}<think>\n{% endif %}{% endif %}")
    assert forms_of(source) == ThinkingForms("<think>\n", "</think>\n")


def test_what_thinking_off_adds_is_the_end_marker():
    source = TURNS + ("{% if add_generation_prompt %}<|assistant|><think>"
                      "{% if not enable_thinking %}{{ '\\n</think>' }}{% endif %}{% endif %}")
    assert forms_of(source) == ThinkingForms("<think>", "\n</think>")


def test_a_template_that_shows_nothing_or_fails_has_the_bare_markers():
    assert forms_of(TURNS) == ThinkingForms("<think>", "</think>")
    assert forms_of("{{ raise_exception('no') }}") == ThinkingForms("<think>", "</think>")


def test_llama_cpps_workarounds_and_parsers_are_kept_as_data():
    """Nemotron Nano v2's workaround; Qwen3-Coder's parser, which writes its markers whatever
    the template shows; Laguna's workaround, the bare markers."""
    nemotron = TURNS + "{# <SPECIAL_10><SPECIAL_11><SPECIAL_12><TOOL_RESPONSE> #}"
    assert forms_of(nemotron) == ThinkingForms("<think>\n", "</think>")
    qwen = TURNS + "{# <tool_call><function=<parameter=<think> #}"
    assert forms_of(qwen) == ThinkingForms("<think>\n", "\n</think>\n\n", opening="<|im_start|>assistant\n")
    assert forms_of(WRAPPED + "{# laguna_glm_thinking #}") == ThinkingForms("<think>", "</think>")


def test_a_continued_message_replaces_the_generation_prompts_block():
    """The generation prompt is cut where the start marker is in it (an open block, or one that
    thinking off closed), and the message follows with the markers as the template writes them."""
    forms = ThinkingForms("<think>\n", "\n</think>\n\n")
    message = {"role": "assistant", "content": "Hello", "reasoning_content": "Hmm"}
    for generation in ("<|assistant|><think>\n", "<|assistant|><think>\n\n</think>\n\n"):
        assert continue_prompt(generation, message, forms) == (
            "<|assistant|>", "<think>\nHmm\n</think>\n\nHello", False)
    assert continue_prompt("<|assistant|>", message, forms, "reasoning_content") == (
        "<|assistant|>", "<think>\nHmm", True)
    assert continue_prompt("<|assistant|>", message, None) == ("<|assistant|>", "Hello", False)
    assert continue_prompt("<|assistant|>", message, None, "reasoning_content") == ("<|assistant|>", "", False)


def test_a_parsers_own_generation_prompt_and_deepseek_v4s_turn_without_thinking():
    v4 = ThinkingForms("<think>", "</think>", opening="<｜Assistant｜>", closes_empty=True)
    plain = {"role": "assistant", "content": "Hello"}
    assert continue_prompt("<｜Assistant｜></think>", plain, v4) == ("<｜Assistant｜>", "</think>Hello", False)
    thought = {"role": "assistant", "content": "", "reasoning_content": "Hmm"}
    assert continue_prompt("<｜Assistant｜></think>", thought, v4) == ("<｜Assistant｜>", "<think>Hmm", True)
