"""One generation request as a state machine: logits in, token and final text out.

A `Sequence` knows nothing about decoding. Whoever owns the context (the `Llama` class for
one caller, the server's engine for many slots) decodes, hands each sequence its logits
row, and feeds back the token the sequence picked. That split is what lets the server run
one decode for every slot while each keeps its own sampler chain, grammar and stop strings
(docs/architecture.md, decision 11).

Per step, in llama.cpp's order: logits processors (llama-cpp-python's hook) -> the sampler
chain, whose first stage is the grammar when there is one -> accept -> end checks
(end-of-generation token, stopping criteria, the grammar finished, max_tokens, stop
strings) -> the text that became final.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence as Seq

import numpy as np

from llama.api.logprobs import TokenLogprob, sampled_logprob, token_logprob
from llama.api.text_stream import TextStream
from llama.sampling import Sampler, SamplerChain, make_sampler
from llama.sampling.dry import Breakers

LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]
StoppingCriterion = Callable[[np.ndarray, np.ndarray], bool]


@dataclass
class SamplingParams:
    """The sampling options of llama-cpp-python's create_completion (its defaults)."""
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = 64
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    mirostat_mode: int = 0        # 1 or 2: mirostat after the temperature, instead of the filters
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    min_keep: int = 1             # llama-server's fields, beyond llama-cpp-python's
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dry_multiplier: float = 0.0   # 0: DRY off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_breakers: Breakers | None = None   # dry.process_breakers' output (Llama.dry_breakers)
    samplers: str | tuple[str, ...] | None = None   # the filters' order (sampling/order.py)

    def chain(self, n_vocab: int) -> SamplerChain:
        bias = {int(k): float(v) for k, v in self.logit_bias.items()} if self.logit_bias else None
        return make_sampler(n_vocab=n_vocab, temp=self.temperature, top_k=self.top_k,
                            top_p=self.top_p, min_p=self.min_p, typical_p=self.typical_p,
                            repeat_penalty=self.repeat_penalty,
                            frequency_penalty=self.frequency_penalty,
                            presence_penalty=self.presence_penalty,
                            repeat_last_n=self.repeat_last_n, logit_bias=bias, seed=self.seed,
                            mirostat=self.mirostat_mode, mirostat_tau=self.mirostat_tau,
                            mirostat_eta=self.mirostat_eta, min_keep=self.min_keep,
                            dynatemp_range=self.dynatemp_range,
                            dynatemp_exponent=self.dynatemp_exponent,
                            top_n_sigma=self.top_n_sigma, xtc_probability=self.xtc_probability,
                            xtc_threshold=self.xtc_threshold, dry_multiplier=self.dry_multiplier,
                            dry_base=self.dry_base, dry_allowed_length=self.dry_allowed_length,
                            dry_penalty_last_n=self.dry_penalty_last_n,
                            dry_breakers=self.dry_breakers, samplers=self.samplers)


@dataclass
class Step:
    """What one token changed: the text that became final, the logprobs of the tokens that
    text completed, and the finish reason once the sequence is done."""
    token: int
    text: str
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    n_tokens: int = 0   # the sequence's generated tokens after this step (read later, elsewhere)


class Sequence:
    """The state of one request between decodes (see the module docstring).

    prompt: the prompt's token ids (the penalties see them, as in llama.cpp's CLI and
    llama-cpp-python; the grammar does not). max_tokens: the most tokens to generate.
    stop: strings that end the text (never included, never streamed). logprobs: None, or
    how many top alternatives to record per token (0 = only the chosen token's logprob).
    grammar: a sampler that masks the logits (llama.grammar.GrammarSampler), the chain's
    first stage."""

    def __init__(self, prompt: Seq[int], *, n_vocab: int, is_eog: Callable[[int], bool],
                 piece_of: Callable[[int], bytes], params: SamplingParams | None = None,
                 max_tokens: int, stop: list[str] | None = None, logprobs: int | None = None,
                 grammar: Sampler | None = None,
                 logits_processors: list[LogitsProcessor] | None = None,
                 stopping_criteria: list[StoppingCriterion] | None = None):
        self.prompt = list(prompt)
        self.n_vocab = n_vocab
        self.max_tokens = max_tokens
        self.is_eog = is_eog
        self.piece_of = piece_of
        self.n_logprobs = logprobs
        self.logits_processors = list(logits_processors or [])
        self.stopping_criteria = list(stopping_criteria or [])
        base = (params or SamplingParams()).chain(n_vocab)
        base.accept_many(self.prompt)  # the penalties' history starts with the prompt
        self.grammar = grammar
        self.sampler = SamplerChain([grammar, *base.samplers], n_vocab=n_vocab) if grammar else base
        self.tokens: list[int] = []
        self.text = TextStream(stop)
        self.logprobs: list[TokenLogprob] = []
        self._released_lp = 0
        self.finish_reason: str | None = None
        self.prompt_logits: np.ndarray | None = None  # every prompt row, when asked (echo logprobs)
        self.n_drafted = 0          # speculative draft tokens decoded, and those accepted
        self.n_draft_accepted = 0   # (llama-server's timings.draft_n, draft_n_accepted)
        # llama-server's t_max_predict_ms: past this long since the first token, the next
        # token holding a newline ends the sequence ("length"); 0 = no limit
        self.t_max_predict_ms = 0.0
        self._t_first: float | None = None
        # llama-server's post_sampling_probs: logprobs from the chain's final candidates
        # (what it sampled from) instead of the model's whole distribution
        self.post_sampling_probs = False
        # told each piece of final text; True ends the sequence ("stop"): a reply read as it
        # comes that is complete (with parallel_tool_calls false, a chat reply where a second
        # tool call begins)
        self.complete: Callable[[str], bool] | None = None
        if max_tokens <= 0:
            self.finish_reason = "length"

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def n_indent(self) -> int:
        """llama-server's n_indent: the text ends at a line (after the first) indented by
        fewer spaces or tabs (TextStream); 0 = off."""
        return self.text.n_indent

    @n_indent.setter
    def n_indent(self, value: int) -> None:
        self.text.n_indent = value

    def input_ids(self) -> np.ndarray:
        return np.array(self.prompt + self.tokens, dtype=np.intc)

    def step(self, logits: np.ndarray) -> Step:
        """Pick the next token from this step's logits row and account for it."""
        if self.finished:
            raise RuntimeError("step() on a finished sequence")
        row = logits
        if self.logits_processors:
            ids = self.input_ids()
            row = np.array(logits, dtype=np.float32)
            for proc in self.logits_processors:
                row = np.asarray(proc(ids, row), dtype=np.float32)
        if self._t_first is None:
            self._t_first = time.perf_counter()
        token = self.sampler.sample(row)
        self.sampler.accept(token)
        if self.is_eog(token):
            return self._finish(token, "stop")
        if self.stopping_criteria:
            # llama-cpp-python's generate: the criteria see the ids before this token (the
            # prompt alone at first) and the logits it was picked from; when one says stop,
            # the new token is dropped
            if any(crit(self.input_ids(), logits) for crit in self.stopping_criteria):
                return self._finish(token, "stop")
        self.tokens.append(token)
        if self.n_logprobs is not None:
            if self.post_sampling_probs:
                cur = self.sampler.last
                entry = sampled_logprob(cur.probs, cur.ids, cur.selected, self.n_logprobs, self.piece_of)
            else:
                entry = token_logprob(logits, token, self.n_logprobs, self.piece_of)
            self.logprobs.append(entry)
        piece = self.piece_of(token)
        text = self.text.push(piece)
        reason = None
        if self.text.stopped:   # a stop string, or llama-server's n_indent (a limit)
            reason = "length" if self.text.cut_by_indent else "stop"
        elif self.grammar is not None and self.grammar.is_finished():
            reason = "stop"
        elif self.complete is not None and text and self.complete(text):
            reason = "stop"
        elif len(self.tokens) >= self.max_tokens or self._past_time_limit(piece):
            reason = "length"
        if reason is not None:
            return self._finish(token, reason, text)
        return Step(token, text, self._release_logprobs(), n_tokens=len(self.tokens))

    def _past_time_limit(self, piece: bytes) -> bool:
        return (self.t_max_predict_ms > 0 and b"\n" in piece
                and (time.perf_counter() - self._t_first) * 1000 > self.t_max_predict_ms)

    def stop_for_context(self) -> Step:
        """The context is full: end as llama.cpp does when n_ctx runs out ("length")."""
        return self._finish(-1, "length")

    def _finish(self, token: int, reason: str, text: str = "") -> Step:
        self.finish_reason = reason
        text += self.text.finish()
        return Step(token, text, self._release_logprobs(finished=True), reason, len(self.tokens))

    def _release_logprobs(self, finished: bool = False) -> list[TokenLogprob]:
        """The logprobs of the tokens the released text has now reached (TextStream)."""
        if self.n_logprobs is None:
            return []
        n = min(self.text.tokens_reached(finished), len(self.logprobs))
        out = self.logprobs[self._released_lp:n]
        self._released_lp = n
        return out

    def completion_text(self) -> str:
        return self.text.text()
