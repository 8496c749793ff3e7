"""Reasoning in `Llama.create_chat_completion`, llama-server's shape: `message.reasoning_content`
and `delta.reasoning_content`, for SmolLM2 under DeepSeek R1's template (whose generation
prompt opens `<think>`), the reply scripted by a logits processor since the model cannot
think."""
from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pytest

from llama import Llama
from llama.chat import ChatTemplate, ChatTemplateError

TEMPLATES = Path(__file__).parents[1] / "chat" / "templates"
HELLO = [{"role": "user", "content": "What is today?"}]
SCRIPT = "I should greet.</think>\n\nHello there"


@pytest.fixture(scope="module")
def thinker(smollm2_path) -> Llama:
    source = (TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text()
    return Llama(str(smollm2_path), n_ctx=512, n_threads=2, verbose=False, chat_template=source)


def scripted(llm: Llama, text: str):
    """A logits processor that makes the model write `text`, then its end-of-generation token."""
    ids = llm.tokenize(text.encode(), add_bos=False, special=True) + [llm.token_eos()]
    start: list[int] = []

    def processor(input_ids, scores):
        if not start:
            start.append(len(input_ids))
        forced = np.full_like(scores, -np.inf)
        forced[ids[min(len(input_ids) - start[0], len(ids) - 1)]] = 0.0
        return forced
    return processor


def test_the_prompt_opens_the_thinking_and_off_closes_it(thinker):
    assert thinker.apply_chat_template(HELLO).endswith("<｜Assistant｜><think>\n")
    assert thinker.apply_chat_template(HELLO, reasoning="off").endswith("<think>\n</think>")
    assert thinker.apply_chat_template(HELLO, enable_thinking=False).endswith("<think>\n</think>")


def test_reasoning_content_whole_and_streamed(thinker):
    whole = thinker.create_chat_completion(HELLO, max_tokens=40, logits_processor=[scripted(thinker, SCRIPT)])
    message = whole["choices"][0]["message"]
    assert message["reasoning_content"] == "I should greet."
    assert message["content"] == "Hello there"
    chunks = list(thinker.create_chat_completion(HELLO, max_tokens=40, stream=True,
                                                 logits_processor=[scripted(thinker, SCRIPT)]))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": None}
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "I should greet."
    assert "".join(d.get("content") or "" for d in deltas) == "Hello there"
    assert all("greet" not in (d.get("content") or "") and "</think>" not in (d.get("content") or "")
               for d in deltas)


def test_reasoning_format_none_keeps_the_raw_text(thinker):
    raw = thinker.create_chat_completion(HELLO, max_tokens=40, reasoning_format="none",
                                         logits_processor=[scripted(thinker, SCRIPT)])
    message = raw["choices"][0]["message"]
    # the block the prompt opened comes back whole, the prompt's marker too (llama.cpp's parser does so)
    assert message["content"] == "<think>\n" + SCRIPT and "reasoning_content" not in message
    legacy = thinker.create_chat_completion(HELLO, max_tokens=40, reasoning_format="deepseek-legacy",
                                            logits_processor=[scripted(thinker, SCRIPT)])
    message = legacy["choices"][0]["message"]
    assert message["reasoning_content"] == "I should greet." and message["content"] == "<think>" + SCRIPT
    with pytest.raises(ValueError, match="reasoning_format 'deep' is not one of"):
        thinker.create_chat_completion(HELLO, max_tokens=1, reasoning_format="deep")


@pytest.mark.parametrize("name, fmt", [("meta-llama-Llama-3.3-70B-Instruct", "%d %b %Y"),
                                       ("fireworks-ai-llama-3-firefunction-v2", "%b %d %Y")])
def test_templates_print_today(smollm2_path, name, fmt):
    """llama.cpp's `date_string` and `datetime`; FireFunction's template also joins an
    undefined `functions` to a string, which transformers refuses and llama.cpp (and the
    chat API, leniently) reads as ""."""
    source = (TEMPLATES / f"{name}.jinja").read_text()
    llm = Llama(str(smollm2_path), n_ctx=256, n_threads=2, verbose=False, chat_template=source)
    assert date.today().strftime(fmt) in llm.apply_chat_template(HELLO)
    if "firefunction" in name:
        with pytest.raises(ChatTemplateError, match="'functions' is undefined"):
            ChatTemplate(source).render(HELLO, datetime="today")


def test_a_last_assistant_message_is_continued(thinker):
    """llama-server's prefill: the reply continues the last assistant message, whose
    reasoning goes between the markers the generation prompt opens; the answer is that
    message whole (its reasoning, then what the model wrote), as llama.cpp's parser reads it."""
    chat = HELLO + [{"role": "assistant", "content": "It is", "reasoning_content": "Look at the date."}]
    prompt = thinker.apply_chat_template(chat)
    assert prompt.endswith("<｜Assistant｜><think>Look at the date.</think>It is")
    thought_only = HELLO + [{"role": "assistant", "content": "", "reasoning_content": "Hmm"}]
    assert thinker.apply_chat_template(thought_only).endswith("<｜Assistant｜><think>Hmm")
    reply = thinker.create_chat_completion(thought_only, max_tokens=40,
                                           logits_processor=[scripted(thinker, SCRIPT)])["choices"][0]["message"]
    assert reply["reasoning_content"] == "HmmI should greet." and reply["content"] == "Hello there"
    for bad, needle in ((HELLO + [{"role": "assistant", "content": "a"}] * 2, "2 or more assistant"),
                        (chat, "Cannot set both")):
        with pytest.raises(ValueError, match=needle):
            thinker.create_chat_completion(bad, max_tokens=1, continue_final_message=True) \
                if needle == "Cannot set both" else thinker.create_chat_completion(bad, max_tokens=1)


def test_continue_final_message_names_the_part_continued(thinker):
    """llama-server's `continue_final_message` may name the part: "content" closes the
    message's reasoning even where it has no content yet, "reasoning_content" leaves the
    reasoning open and drops the content; anything else is refused by name."""
    thought_only = HELLO + [{"role": "assistant", "content": "", "reasoning_content": "Hmm"}]
    as_content = thinker.apply_chat_template(thought_only, add_generation_prompt=False,
                                             continue_final_message="content")
    assert as_content.endswith("<｜Assistant｜><think>Hmm</think>")
    reply = thinker.create_chat_completion(thought_only, max_tokens=40, add_generation_prompt=False,
                                           continue_final_message="content",
                                           logits_processor=[scripted(thinker, "Hello there")])
    message = reply["choices"][0]["message"]
    assert message["reasoning_content"] == "Hmm" and message["content"] == "Hello there"
    both = HELLO + [{"role": "assistant", "content": "It is", "reasoning_content": "Look"}]
    as_reasoning = thinker.apply_chat_template(both, add_generation_prompt=False,
                                               continue_final_message="reasoning_content")
    assert as_reasoning.endswith("<｜Assistant｜><think>Look")
    with pytest.raises(ValueError, match="continue_final_message 'yes' is not one of"):
        thinker.create_chat_completion(both, max_tokens=1, add_generation_prompt=False,
                                       continue_final_message="yes")


def test_a_reasoning_budget_forces_the_end_of_thinking(thinker):
    """llama-server's reasoning budget: after N reasoning tokens the message and the end
    marker are forced, and the model goes on with its answer (here it only ever writes
    " a")."""
    always_a = scripted(thinker, " a" * 64)
    reply = thinker.create_chat_completion(HELLO, max_tokens=12, reasoning_budget=4,
                                           reasoning_budget_message=" Enough.",
                                           logits_processor=[always_a])["choices"][0]["message"]
    assert reply["reasoning_content"] == "a a a a Enough."
    assert reply["content"].startswith("a a")
    none = thinker.create_chat_completion(HELLO, max_tokens=6, reasoning_budget=0,
                                          logits_processor=[scripted(thinker, " a" * 64)])["choices"][0]["message"]
    assert "reasoning_content" not in none and none["content"].startswith("a")
