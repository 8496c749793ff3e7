"""Gemma 4's tokenizer (`tokenizer.ggml.model == "gemma4"`), as llama.cpp loads it.

llama.cpp treats the "gemma4" model as BPE with the gemma4 pre-tokenizer whatever the file's
`tokenizer.ggml.pre` says, so this is BPEModel with that name fixed: SPM-style merges over
whole lines with spaces as U+2581, `<0xXX>` byte fallback, newline runs taken whole, BOS
always added (`PreSpec.spm_style` and `.gemma4`). Its special ids all come from the file:
unlike "gpt2" there is no default of 11. End-of-generation tokens (`<eos>`, `<turn|>`,
`<|tool_response>`) and `</s>` left normal are the shared rules of `llama.vocab.special`.
"""
from __future__ import annotations

from typing import Any

from llama.vocab.bpe import BPEModel
from llama.vocab.common import SpecialIds, VocabFlags
from llama.vocab.model import register_tokenizer_model


@register_tokenizer_model("gemma4")
class Gemma4Model(BPEModel):
    """BPE with llama.cpp's gemma4 pre-tokenizer and no default special ids."""

    def pre_tokenizer_name(self, md: dict[str, Any]) -> str:
        return "gemma4"

    def defaults(self) -> tuple[VocabFlags, SpecialIds]:
        flags, _ = super().defaults()
        return flags, SpecialIds()
