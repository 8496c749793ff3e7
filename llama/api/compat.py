"""The parts of llama-cpp-python's surface that are plain Python: its list types for logits
processors and stopping criteria, its tokenizer wrapper, two static helpers of its `Llama`,
and the positional order of its front ends' arguments. Programs import these names from
`llama_cpp`; here they come from `llama` (`from llama import LogitsProcessorList`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from llama.api.engine import common_prefix

if TYPE_CHECKING:
    from llama.api.llama import Llama

# llama-cpp-python 0.3.36's parameters after the first, in order: a positional call such as
# `llm(prompt, 16)` means what it means there
COMPLETION_ARGS = ("suffix", "max_tokens", "temperature", "top_p", "min_p", "typical_p", "logprobs",
                   "echo", "stop", "frequency_penalty", "presence_penalty", "repeat_penalty", "top_k",
                   "stream", "seed", "tfs_z", "mirostat_mode", "mirostat_tau", "mirostat_eta", "model",
                   "stopping_criteria", "logits_processor", "grammar", "logit_bias")
CHAT_ARGS = ("functions", "function_call", "tools", "tool_choice", "temperature", "top_p", "top_k",
             "min_p", "typical_p", "stream", "stop", "seed", "response_format", "max_tokens",
             "presence_penalty", "frequency_penalty", "repeat_penalty", "tfs_z", "mirostat_mode",
             "mirostat_tau", "mirostat_eta", "model", "logits_processor", "grammar", "logit_bias",
             "logprobs", "top_logprobs")


def by_name(method: str, order: Sequence[str], args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Positional arguments given the names `order` gives them; the same errors Python raises
    for a function with those parameters."""
    if len(args) > len(order):
        raise TypeError(f"{method}() takes at most {len(order) + 1} positional arguments after self "
                        f"({len(args) + 1} given)")
    for name, value in zip(order, args):
        if name in kwargs:
            raise TypeError(f"{method}() got multiple values for argument {name!r}")
        kwargs[name] = value
    return kwargs


class LogitsProcessorList(list):
    """Processors applied in turn, each to the previous one's scores."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list):
    """Stop when any criterion says so."""

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        return any([criterion(input_ids, logits) for criterion in self])


class MinTokensLogitsProcessor:
    """Forbids `token_eos` until `min_tokens` tokens follow the prompt (the length of the
    first `input_ids` it sees)."""

    def __init__(self, min_tokens: int, token_eos: int):
        self.min_tokens = min_tokens
        self.token_eos = token_eos
        self.prompt_tokens: int | None = None

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        if len(input_ids) - self.prompt_tokens < self.min_tokens:
            scores[self.token_eos] = -np.inf
        return scores


class LlamaTokenizer:
    """llama-cpp-python's tokenizer object (`Llama.tokenizer()`), over a Llama's vocab."""

    def __init__(self, llama: "Llama"):
        self.llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None,
                   special: bool = False) -> bytes:
        return self.llama.detokenize(tokens, prev_tokens=prev_tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos, special=special)

    def decode(self, tokens: list[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")

    @classmethod
    def from_ggml_file(cls, path: str) -> "LlamaTokenizer":
        from llama.api.llama import Llama
        return cls(Llama(path, vocab_only=True, verbose=False))


def logits_to_logprobs(logits, axis: int = -1) -> np.ndarray:
    """log_softmax in float32 along `axis`, a row of -inf staying -inf (llama-cpp-python's
    `Llama.logits_to_logprobs`)."""
    maxs = np.amax(logits, axis=axis, keepdims=True)
    maxs = np.where(np.isfinite(maxs), maxs, 0)
    shifted = np.subtract(logits, maxs, dtype=np.single)
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share (the engine's common_prefix)."""
    return common_prefix(a, b)
