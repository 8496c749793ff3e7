"""`SamplerChain` (llama_sampler_chain) and `make_sampler` (common_sampler_init's chain)."""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from .candidates import Candidates
from .dry import DRY, Breakers
from .mirostat import Mirostat, MirostatV2
from .order import parse_order
from .params import check_float, check_int, check_unit
from .pick import Dist, Greedy, check_seed
from .samplers import (LogitBias, MinP, Penalties, Sampler, Temperature, TemperatureExt, TopK,
                       TopNSigma, TopP, Typical)
from .xtc import XTC


class SamplerChain(Sampler):
    """Samplers applied in order to the candidates built from one logits row.

    `sample(logits)` returns the selected token id and does not record it: call
    `accept(token)` for every token that is actually emitted (and, to have the prompt count
    for the repetition penalties as llama.cpp's CLI does, for the prompt tokens). This is the
    `common_sampler_sample` / `common_sampler_accept` split; `sample(..., accept=True)` does
    both, like `llama_sampler_sample`. The chain keeps its own `history` of accepted tokens.

    `n_vocab` fixes the expected logits length; when omitted it is taken from a LogitBias in
    the chain, or else from the first `sample` call.
    """

    name = "chain"

    def __init__(self, samplers: Iterable[Sampler], *, n_vocab: int | None = None) -> None:
        self.samplers = list(samplers)
        for s in self.samplers:
            if not isinstance(s, Sampler):
                raise ValueError(f"SamplerChain takes Sampler objects, got {type(s).__name__}")
        bias_vocab = {s.n_vocab for s in self.samplers if isinstance(s, LogitBias)}
        if n_vocab is None and len(bias_vocab) == 1:
            n_vocab = bias_vocab.pop()
        self.n_vocab = None if n_vocab is None else check_int("n_vocab", n_vocab, 1)
        if bias_vocab - {self.n_vocab}:
            raise ValueError(f"LogitBias n_vocab {sorted(bias_vocab)} does not match the "
                             f"chain's n_vocab {self.n_vocab}")
        self.history: list[int] = []
        self.n_sample = 0
        self.last: Candidates | None = None  # the candidates after the last sample()

    def __str__(self) -> str:
        """llama.cpp's chain print: `logits -> top-k -> ... -> dist`."""
        return " -> ".join(["logits"] + [s.name for s in self.samplers])

    def apply(self, cur: Candidates) -> None:
        for s in self.samplers:
            s.apply(cur)

    def sample(self, logits: np.ndarray, *, accept: bool = False) -> int:
        """Run the chain over a float logits row and return the selected token id."""
        row = np.asarray(logits)
        if row.ndim != 1 or row.dtype.kind != "f":
            raise ValueError(f"logits must be a 1-D float array, got shape {row.shape} "
                             f"dtype {row.dtype}")
        if self.n_vocab is None:
            if len(row) == 0:
                raise ValueError("logits is empty")
            self.n_vocab = len(row)
        if len(row) != self.n_vocab:
            raise ValueError(f"logits has length {len(row)}, expected n_vocab = {self.n_vocab}")
        cur = Candidates.from_logits(row)
        top = cur.logits.max()
        if np.isnan(top) or top == np.inf:
            raise ValueError("logits contain NaN or +inf")
        self.apply(cur)
        if not 0 <= cur.selected < len(cur):
            raise ValueError(f"no sampler selected a token in chain '{self}'; "
                             "end it with Dist or Greedy")
        self.last = cur
        token = cur.selected_id
        if accept:
            self.accept(token)
        return token

    def accept(self, token: int) -> None:
        token = check_int("token", token, 0)
        if self.n_vocab is not None and token >= self.n_vocab:
            raise ValueError(f"token {token} is out of range [0, {self.n_vocab})")
        for s in self.samplers:
            s.accept(token)
        self.history.append(token)
        self.n_sample += 1

    def accept_many(self, tokens: Iterable[int]) -> None:
        """`accept` each token in order (e.g. the prompt)."""
        for token in tokens:
            self.accept(token)

    def reset(self) -> None:
        for s in self.samplers:
            s.reset()
        self.history.clear()
        self.n_sample = 0
        self.last = None


def make_sampler(*, n_vocab: int, temp: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, typical_p: float = 1.0, repeat_penalty: float = 1.0,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 repeat_last_n: int = 64, logit_bias: Mapping[int, float] | None = None,
                 seed: int | None = None, grammar: Sampler | None = None, mirostat: int = 0,
                 mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, min_keep: int = 1,
                 dynatemp_range: float = 0.0, dynatemp_exponent: float = 1.0,
                 top_n_sigma: float = -1.0, xtc_probability: float = 0.0,
                 xtc_threshold: float = 0.1, dry_multiplier: float = 0.0,
                 dry_base: float = 1.75, dry_allowed_length: int = 2,
                 dry_penalty_last_n: int = 64, dry_breakers: Breakers | None = None,
                 samplers: str | Sequence[str] | None = None) -> SamplerChain:
    """The chain llama.cpp's common sampler builds (see the package docstring).

    temp > 0: [grammar] -> [logit-bias] -> the samplers of `samplers` (order.py; default
              penalties -> [dry] -> [top-n-sigma] -> top-k -> typical -> top-p -> min-p ->
              [xtc] -> temp) -> dist. Typical, top-p, min-p and xtc keep at least min_keep;
              dry when dry_multiplier != 0 (its breakers as dry.process_breakers gives
              them), top-n-sigma when top_n_sigma > 0, xtc when xtc_probability > 0 and
              xtc_threshold <= 0.5, as llama.cpp leaves them out otherwise; with
              dynatemp_range > 0 the temperature is temp-ext's dynamic one.
    mirostat 1 or 2: [grammar] -> [logit-bias] -> penalties -> [dry] -> temp -> mirostat
              (m = 100) or mirostat-v2, which replace the filters and dist.
    temp <= 0: [grammar] -> [logit-bias] -> penalties -> [dry] -> greedy.
    In the last two, penalties and dry run where and if `samplers` names them.
    `grammar` (a `llama.grammar.GrammarSampler`) comes first, as llama.cpp's grammar sampler.
    """
    n_vocab = check_int("n_vocab", n_vocab, 1)
    temp = check_float("temp", temp)
    top_k = check_int("top_k", top_k)
    for name, value in (("top_p", top_p), ("min_p", min_p), ("typical_p", typical_p)):
        check_unit(name, value)
    seed = check_seed(seed)
    mirostat = check_int("mirostat", mirostat)
    if mirostat not in (0, 1, 2):
        raise ValueError(f"mirostat must be 0 (off), 1 or 2, got {mirostat}")
    mirostat_tau = check_float("mirostat_tau", mirostat_tau)   # checked even while unused
    mirostat_eta = check_float("mirostat_eta", mirostat_eta)
    min_keep = check_int("min_keep", min_keep, 0)
    check_float("dynatemp_exponent", dynatemp_exponent)
    order = parse_order(samplers)

    def make(name: str) -> Sampler | None:
        """The sampler `name` stands for, None where llama.cpp's would be a no-op."""
        if name == "penalties":
            return Penalties(repeat_last_n, repeat_penalty, frequency_penalty, presence_penalty)
        if name == "dry":
            dry = DRY(dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n, dry_breakers)
            return dry if dry.enabled else None
        if name == "top_n_sigma":
            sigma = TopNSigma(top_n_sigma)
            return sigma if sigma.n > 0 else None
        if name == "xtc":
            xtc = XTC(xtc_probability, xtc_threshold, min_keep, seed)
            return xtc if xtc.enabled else None
        if name == "temperature":   # TemperatureExt checks both of its values
            return (TemperatureExt(temp, dynatemp_range, dynatemp_exponent) if dynatemp_range
                    else Temperature(temp))
        filters = {"top_k": lambda: TopK(top_k), "typ_p": lambda: Typical(typical_p, min_keep),
                   "top_p": lambda: TopP(top_p, min_keep), "min_p": lambda: MinP(min_p, min_keep)}
        return filters[name]()

    chain: list[Sampler] = [] if grammar is None else [grammar]
    if logit_bias is not None:
        bias = LogitBias(n_vocab, logit_bias)
        if bias.biases:
            chain.append(bias)
    built = [(name, make(name)) for name in order]   # every value checked, used or not
    if temp <= 0.0 or mirostat:
        chain += [s for name, s in built if name in ("penalties", "dry") and s is not None]
        if temp <= 0.0:
            chain.append(Greedy())
        elif mirostat == 1:
            chain += [Temperature(temp), Mirostat(n_vocab, seed, mirostat_tau, mirostat_eta, 100)]
        else:
            chain += [Temperature(temp), MirostatV2(seed, mirostat_tau, mirostat_eta)]
    else:
        chain += [s for _, s in built if s is not None]
        chain.append(Dist(seed))
    return SamplerChain(chain, n_vocab=n_vocab)
