"""Token sampling: llama.cpp's sampler chain over numpy (`src/llama-sampling.cpp`).

A chain turns one logits row into a token id. `SamplerChain.sample` builds the candidate
list (`Candidates`, llama_token_data_array), runs every sampler's `apply` in order, and
returns the id at `selected`; `accept(token)` then feeds the emitted token to every sampler
(the penalties keep a ring buffer of the last `repeat_last_n`) and to the chain's `history`.

Order and defaults of `make_sampler`
------------------------------------
llama.cpp's CLI (`common/sampling.cpp`, `common_sampler_init`) builds::

    logit-bias -> penalties -> dry -> top-n-sigma -> top-k -> typical -> top-p -> min-p
               -> xtc -> temp-ext -> dist

The logit bias comes first, before the penalties (it is added ahead of the configurable
list), and llama-cpp-python (`Llama._init_sampler`) does the same: logits processors (its
logit_bias) -> penalties -> top-k -> typical -> top-p -> min-p -> temp -> dist, with greedy
instead of the filters when temp == 0. `make_sampler` builds exactly that common part
(dry, top-n-sigma and xtc are off by default in llama.cpp, and are added at their places
when asked for: `dry_multiplier != 0`, `top_n_sigma > 0`, `xtc_probability > 0`):

    temp > 0:  [logit-bias] -> penalties -> top-k -> typical -> top-p -> min-p -> temp -> dist
    temp <= 0: [logit-bias] -> penalties -> greedy

`samplers` (`order.py`, llama-server's field of that name) reorders or drops the part
between the logit bias and dist, as llama.cpp's `--samplers` does.

Mirostat (`mirostat=1` or `2`, `mirostat.py`) replaces the filters and dist, after the
temperature as llama.cpp's `common_sampler_init` (llama-server, the CLI) puts it:
`[logit-bias] -> penalties -> temp -> mirostat` (m = 100) or `mirostat-v2`. llama.cpp drops
the penalties there and llama-cpp-python the temperature; both are neutral by default, and
here a request's penalties and temperature apply in either case.

Defaults, identical in llama.cpp's `common_params_sampling` and llama-cpp-python: temp 0.8,
top_k 40, top_p 0.95, min_p 0.05, typical_p 1.0 (off), repeat_penalty 1.0 (off),
frequency_penalty 0.0, presence_penalty 0.0, repeat_last_n 64, min_keep 1 (llama.cpp's 0
behaves the same for these samplers), seed random. temp < 0 is treated like 0 (llama.cpp's
temperature keeps only the max logit for any t <= 0; llama-cpp-python would instead sample
the unfiltered softmax). temp-ext with no dynatemp range is plain temperature, so `Temperature`
is used (`TemperatureExt` is available for dynamic temperature).

Conventions
-----------
* Disabled values follow llama.cpp: top_k <= 0, top_p >= 1, min_p <= 0, typical_p >= 1,
  repeat_penalty 1 with frequency/presence 0, repeat_last_n 0.
* Errors are `ValueError` naming the parameter: p-values outside [0, 1], NaN or infinite
  numbers (a logit bias may be -inf to ban a token), non-integer top_k/min_keep/ids,
  repeat_penalty <= 0, repeat_last_n < 0 (llama.cpp's -1 = "context size" must be resolved
  by the caller), seeds outside 32 bits, logit_bias ids outside [0, n_vocab), logits that
  are not a 1-D float row of length n_vocab or that contain NaN/+inf, accepting an id
  outside the vocabulary, a chain that selects nothing, and a draw over all -inf logits.
* `sample()` does not accept the token (common_sampler style); pass `accept=True` for the
  llama_sampler_sample behaviour.
* `Dist(seed)` reproduces llama.cpp's picks for the same seed and logits (std::mt19937 and
  libstdc++'s uniform_real_distribution<double>, see `mt19937.py`). Equal logits are
  ordered by candidate position, where llama.cpp's order is unspecified.

Speed: the candidates are numpy arrays; top-k uses argpartition and top-p ranks 256 at a
time as llama.cpp does, so the default chain costs a few passes over the vocabulary.
"""
from .candidates import Candidates
from .chain import SamplerChain, make_sampler
from .dry import DRY
from .mirostat import Mirostat, MirostatV2
from .pick import LLAMA_DEFAULT_SEED, Dist, Greedy
from .samplers import (LogitBias, MinP, Penalties, Sampler, Temperature, TemperatureExt, TopK,
                       TopNSigma, TopP, Typical)
from .xtc import XTC

__all__ = [
    "Candidates", "DRY", "Dist", "Greedy", "LLAMA_DEFAULT_SEED", "LogitBias", "MinP", "Mirostat",
    "MirostatV2", "Penalties",
    "Sampler", "SamplerChain", "Temperature", "TemperatureExt", "TopK", "TopNSigma", "TopP",
    "Typical", "XTC",
    "make_sampler",
]
