"""Tokenizer vocabularies as llama.cpp builds them from GGUF metadata.

`Vocab.from_metadata(md)` picks the tokenizer model from `tokenizer.ggml.model` through the
registry in `llama.vocab.model`; importing a model module registers it (BPE: "gpt2", SPM:
"llama", WPM: "bert", UGM: "t5", SPM-style BPE: "gemma4").
"""
from llama.vocab.common import SpecialIds, TokenAttr, TokenType, VocabError, VocabFlags
from llama.vocab.model import TOKENIZER_MODELS, TokenizerModel, register_tokenizer_model
from llama.vocab.vocab import Vocab
from llama.vocab import bpe  # noqa: F401  (registers "gpt2")
from llama.vocab import spm  # noqa: F401  (registers "llama")
from llama.vocab import wpm  # noqa: F401  (registers "bert")
from llama.vocab import ugm  # noqa: F401  (registers "t5")
from llama.vocab import gemma4  # noqa: F401  (registers "gemma4")

__all__ = ["SpecialIds", "TOKENIZER_MODELS", "TokenAttr", "TokenType", "TokenizerModel", "Vocab",
           "VocabError", "VocabFlags", "register_tokenizer_model"]
