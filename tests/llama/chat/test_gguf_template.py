"""A model file carrying a hostile chat template: loading it is safe (the template is just
a string in the metadata), and the template fails only when selected and rendered."""
from __future__ import annotations

from pathlib import Path

import pytest

import llama
from ggmlpy.gguf import GGUFFile, GGUFWriter
from ggmlpy.testing.models import write_tiny_llama
from llama.chat import ChatTemplateError, builtin_template, select_template

TEMPLATES = Path(__file__).resolve().parent / "templates"


def _with_templates(tmp_path: Path, templates: dict[str, str]) -> Path:
    """The tiny llama model with extra `tokenizer.chat_template*` keys."""
    base = write_tiny_llama(tmp_path / "base.gguf", n_layer=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=32)
    with GGUFFile(base) as f:
        w = GGUFWriter.from_file(f)
    for key, source in templates.items():
        w.add_string(key, source)
    return w.write(tmp_path / "model.gguf")


def test_malicious_template_loads_and_fails_only_when_rendered(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = f"{{{{ cycler.__init__.__globals__.os.system('touch {marker}') }}}}"
    model = llama.Model.load(_with_templates(tmp_path, {"tokenizer.chat_template": evil}), vocab_only=True)
    assert model.gguf.metadata["tokenizer.chat_template"] == evil
    template = select_template(model.gguf.metadata)
    with pytest.raises(ChatTemplateError, match="^tokenizer.chat_template: refused by the sandbox"):
        template.render([{"role": "user", "content": "hi"}])
    assert not marker.exists()


def test_unparsable_template_fails_at_selection_not_at_load(tmp_path: Path) -> None:
    model = llama.Model.load(_with_templates(tmp_path, {"tokenizer.chat_template": "{% for %}"}), vocab_only=True)
    with pytest.raises(ChatTemplateError, match="^tokenizer.chat_template: does not parse"):
        select_template(model.gguf.metadata)
    # an explicit format still works for such a file
    assert select_template(model.gguf.metadata, chat_format="llama3").render([]) == \
        "<|start_header_id|>assistant<|end_header_id|>\n\n"


def test_selection_order_with_a_real_file(tmp_path: Path) -> None:
    """File template, named file template, built-in, explicit source: checked against
    transformers' rendering of the same Qwen 2.5 template (expected/*.json)."""
    import json

    qwen = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    hermes = (TEMPLATES / "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja").read_text(encoding="utf-8")
    path = _with_templates(tmp_path, {"tokenizer.chat_template": qwen, "tokenizer.chat_template.tool_use": hermes})
    metadata = llama.Model.load(path, vocab_only=True).gguf.metadata
    case = next(c for c in json.loads((TEMPLATES.parent / "expected" / "Qwen-Qwen2.5-7B-Instruct.json")
                                      .read_text(encoding="utf-8"))["cases"] if c["name"] == "multi_turn")

    chosen = select_template(metadata, eos_token="<|im_end|>")
    assert chosen.name == "tokenizer.chat_template"
    assert chosen.render(case["messages"]) == case["expected"]
    assert select_template(metadata, chat_format="tool_use").source == hermes
    assert select_template(metadata, chat_format="llama3").source == builtin_template("llama3").source
    # a name llama-cpp-python has means its format (the keyword is its), llama.cpp's otherwise
    assert repr(select_template(metadata, chat_format="gemma")) == "FormatTemplate('gemma')"
    with pytest.raises(ValueError, match="functionary-v2.*chat handler"):
        select_template(metadata, chat_format="functionary-v2")
    assert select_template(metadata, chat_template="{{ 'x' }}", chat_format="gemma").render([]) == "x"
    with pytest.raises(ValueError, match="unknown chat_format 'nope'.*chatml.*tool_use \\(from the file\\)"):
        select_template(metadata, chat_format="nope")


def test_file_without_template_gets_chatml_as_llama_cpp_does(tmp_path: Path) -> None:
    """No `tokenizer.chat_template`: llama.cpp's default, chatml, checked against its C++."""
    import json

    metadata = llama.Model.load(_with_templates(tmp_path, {}), vocab_only=True).gguf.metadata
    assert "tokenizer.chat_template" not in metadata
    data = json.loads((TEMPLATES.parent / "expected" / "_builtin_llama_cpp.json").read_text(encoding="utf-8"))
    record = next(r for r in data["formats"]["chatml"]
                  if r["conversation"] == "multi_turn" and r["add_generation_prompt"])
    messages = [{"role": role, "content": content} for role, content in data["conversations"]["multi_turn"]]
    assert select_template(metadata).render(messages) == record["expected"]
