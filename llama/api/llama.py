"""`Llama`: llama-cpp-python's high-level class over ggmlpy's Model, Context and Engine.

A program written for `llama_cpp.Llama` runs after changing its import to
`from llama import Llama`: the constructor takes the same keywords (for what ggmlpy has),
`create_completion`/`__call__`, `create_chat_completion`, `create_embedding`/`embed`,
`tokenize`/`detokenize`, `save_state`/`load_state`, `reset` and the small accessors behave
the same, and results have OpenAI's shapes. Where this class differs it says so:

- `logprobs` work without `logits_all=True` (each step's logits are at hand anyway); only
  `echo=True` with logprobs decodes the prompt with every row's logits.
- `response_format` also takes OpenAI's `json_schema`; integer bounds and every other
  constraint llguidance enforces are kept; `tool_choice="auto"` parses the model's calls;
  `stream_options={"include_usage": True}` adds OpenAI's usage chunk.
- The KV cache is always the prompt cache: a call whose prompt shares a prefix with what
  the cache holds decodes only the rest (llama-cpp-python needs a `LlamaCache` for part of
  this); `Llama.engine.n_prompt_decoded` counts what was decoded.
"""
from __future__ import annotations

import logging
import os
import random
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Sequence as Seq

import numpy as np

from llama.api import chat_completion as chat_api
from llama.api import compat, state_cache
from llama.api import completion as completion_api
from llama.api import embedding as embedding_api
from llama.api.chat_prompt import chat_prompt
from llama.api.engine import Engine
from llama.api.progress import LoadProgress
from llama.chat.select import DEFAULT_FORMAT, TEMPLATE_KEY
from llama.context import Context
from llama.kv_types import kv_type
from llama.model import Model
from llama.placement import with_cpu_moe
from llama.sampling.dry import Breakers, VocabText, model_breakers, vocab_text
from llama.sampling.pick import LLAMA_DEFAULT_SEED
from llama.speculative import Drafter, as_drafter

log = logging.getLogger("llama.api")

DRY_BREAKER_LISTS = 16  # breaker lists whose token sequences a Llama keeps

# llama-cpp-python keywords ggmlpy has no counterpart for: accepted at their defaults only,
# so a program that passes them explicitly still runs, and one that relies on them is told
_UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "split_mode": 1, "main_gpu": 0, "rpc_servers": None, "numa": False, "lora_base": None,
    "rope_scaling_type": -1, "yarn_ext_factor": -1.0,
    "yarn_attn_factor": 1.0, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0,
    "yarn_orig_ctx": 0, "offload_kqv": True, "op_offload": None,
    "no_perf": False, "last_n_tokens_size": 64, "chat_handler": None,
    "tokenizer": None, "spm_infill": False, "clip_model_path": None,
    "embd_normalize": None, "mul_mat_q": True, "attention_type": -1,
}


def default_threads() -> int:
    """The CPUs this process may run on, as llama.cpp's own default (llama-cpp-python
    halves os.cpu_count(), which on a 2-core machine leaves one core idle)."""
    return max(len(os.sched_getaffinity(0)), 1)


def _changed(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The options that differ from their defaults: only those are passed down, so the
    lower layers keep one place for each default."""
    return {k: v for k, v in values.items() if v != defaults[k]}


@dataclass
class LlamaState:
    """What `save_state` captures: the cached tokens, the last logits and the KV cache."""
    tokens: list[int]
    logits: np.ndarray | None
    arrays: dict[str, np.ndarray]
    cells: Any
    n_ctx: int
    type_k: str = "f16"   # the KV cache's types (llama.cpp's names): the arrays hold their bytes
    type_v: str = "f16"

    @property
    def llama_state_size(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    @property
    def input_ids(self) -> np.ndarray:   # llama-cpp-python's name for the tokens
        return np.array(self.tokens, dtype=np.intc)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


class Llama:
    """See the module docstring. `model_path` may be a file or a known model name
    (`smollm2-135m`, `gemma3-270m`)."""

    def __init__(self, model_path: str, *, n_gpu_layers: int = 0,
                 tensor_split: list[float] | None = None, devices: list[str] | None = None,
                 override_tensor: list[str] | None = None, cpu_moe: bool = False, n_cpu_moe: int = 0,
                 vocab_only: bool = False, use_mmap: bool = True, use_mlock: bool = False, repack: bool = True,
                 kv_overrides: dict[str, bool | int | float | str] | None = None,
                 check_tensors: bool = False, seed: int = LLAMA_DEFAULT_SEED, n_ctx: int = 512,
                 n_batch: int = 512, n_ubatch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None, rope_freq_base: float = 0.0,
                 rope_freq_scale: float = 0.0, flash_attn: bool | None = None,
                 embedding: bool = False, pooling_type: int | str = -1, logits_all: bool = False,
                 chat_format: str | None = None, chat_template: str | None = None,
                 n_seq_max: int = 1, backend: str | None = None, verbose: bool = True,
                 type_k: int | str | None = None, type_v: int | str | None = None,
                 swa_full: bool | None = None, lora_path: str | None = None,
                 lora_scale: float = 1.0, draft_model: Any = None, **kwargs: Any):
        # the constructor's arguments, which are what a pickled Llama carries (__getstate__)
        self._init_args = {**{k: v for k, v in locals().items() if k not in ("self", "kwargs")}, **kwargs}
        for name, value in kwargs.items():
            if name not in _UNSUPPORTED_DEFAULTS:
                raise TypeError(f"Llama() got an unexpected keyword argument {name!r}")
            if value != _UNSUPPORTED_DEFAULTS[name] and value is not None:
                raise ValueError(f"Llama({name}={value!r}) is not supported by ggmlpy")
        self.verbose = verbose
        self.model_path = str(model_path)
        self._seed = seed
        self._rng = random.Random(None if seed in (None, -1, LLAMA_DEFAULT_SEED) else seed)
        progress = LoadProgress(enabled=verbose)
        load_options = _changed({"use_mmap": use_mmap, "use_mlock": use_mlock,
                                 "kv_overrides": kv_overrides, "check_tensors": check_tensors, "repack": repack},
                                {"use_mmap": True, "use_mlock": False, "kv_overrides": None,
                                 "check_tensors": False, "repack": True})
        self._model = Model.load(model_path, n_gpu_layers=n_gpu_layers, vocab_only=vocab_only,
                                 devices=devices, tensor_split=tensor_split,
                                 override_tensor=with_cpu_moe(override_tensor, cpu_moe, n_cpu_moe),
                                 progress=progress.loading, **load_options)
        progress.close()
        self.logits_all = logits_all
        self.embedding = embedding
        # the format in use, named as llama-cpp-python names it: the one asked for, else its
        # name for the file's own template, else the fallback (chatml here, llama-2 there)
        has_template = isinstance(self._model.gguf.metadata.get(TEMPLATE_KEY), str)
        self.chat_format = chat_format or (None if chat_template is not None else
                                           "chat_template.default" if has_template else DEFAULT_FORMAT)
        self._chat = chat_api.ChatSetup(self._model, chat_format=chat_format,
                                        chat_template=chat_template)
        self._ctx: Context | None = None
        self.draft_model: Any = None
        self.drafter: Drafter | None = None   # speculative decoding (llama/speculative)
        self.engine: Engine | None = None
        self.scores: np.ndarray | None = None  # the last decode's logits (llama-cpp-python's _scores[-1])
        self.cache: state_cache.LlamaRAMCache | None = None   # set_cache's
        self._generation = 0
        self._dry_text: VocabText | None = None
        self._dry_breakers: dict[tuple[str, ...], Breakers] = {}
        if vocab_only:
            return
        threads = n_threads or default_threads()
        ctx_options = _changed({"rope_freq_base": rope_freq_base, "rope_freq_scale": rope_freq_scale,
                                "flash_attn": flash_attn},
                               {"rope_freq_base": 0.0, "rope_freq_scale": 0.0, "flash_attn": None})
        # llama-cpp-python's type_k/type_v are ggml type ids (GGML_TYPE_Q8_0 = 8 ...); llama.cpp's
        # names (-ctk q8_0) are taken too (llama/kv_types.py)
        for name, value in (("type_k", type_k), ("type_v", type_v)):
            if value is not None:
                ctx_options[name] = kv_type(value, f"Llama({name}=...) cache type")
        if swa_full:
            ctx_options["swa_full"] = True
        if embedding:
            ctx_options["embeddings"] = True
            ctx_options["pooling_type"] = None if pooling_type in (-1, None) else pooling_type
            n_seq_max = max(n_seq_max, embedding_api.EMBED_SEQS)
        with progress.stage("compiling graphs"):
            self._ctx = Context(self._model, n_ctx=n_ctx, n_batch=n_batch,
                                n_ubatch=min(n_ubatch, n_batch), n_seq_max=n_seq_max,
                                n_threads=threads, n_threads_batch=n_threads_batch or threads,
                                backend=backend, **ctx_options)
        if lora_path:
            with progress.stage("loading the LoRA adapter"):
                # as llama-cpp-python: the adapter applies to everything this Llama decodes
                self._ctx.set_adapter_lora(self._model.load_lora(lora_path), lora_scale)
                self._ctx.reserve_lora_graphs()
        self.lora_path, self.lora_scale = lora_path, lora_scale
        self.engine = Engine(self._ctx)
        if draft_model is not None:
            self.draft_model, self.drafter = draft_model, as_drafter(draft_model, self.engine)
        with progress.stage("warming up"):
            self.engine.warmup()  # as llama.cpp's common init: weights repacked now, not on the first call
        if verbose:
            print(f"{self._model} on {self._ctx.backend_name}: n_ctx {self._ctx.n_ctx}, "
                  f"{threads} threads, graphs compiled in {self._ctx.compile_ms:.0f} ms",
                  file=sys.stderr)

    # accessors ---------------------------------------------------------------------------------
    @property
    def model(self) -> Model:
        return self._model

    @property
    def ctx(self) -> Context:
        if self._ctx is None:
            raise RuntimeError("this Llama was created with vocab_only=True: it has no context")
        return self._ctx

    @property
    def metadata(self) -> dict[str, str]:
        """The file's scalar metadata as strings (llama-cpp-python's `metadata`); arrays
        such as the token list are left out."""
        return {k: str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in self._model.gguf.metadata.items()
                if isinstance(v, (str, int, float, bool))}

    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    def n_vocab(self) -> int:
        return self._model.n_vocab

    def n_embd(self) -> int:
        return self._model.hparams.n_embd

    def token_bos(self) -> int:
        bos = self._model.vocab.special.bos
        return -1 if bos is None else bos

    def token_eos(self) -> int:
        eos = self._model.vocab.special.eos
        return -1 if eos is None else eos

    def token_nl(self) -> int:
        nl = self._model.vocab.linefeed_id
        return -1 if nl is None else nl

    def tokenizer(self) -> compat.LlamaTokenizer:
        return compat.LlamaTokenizer(self)

    def pooling_type(self) -> int:
        """The context's pooling as llama.cpp's enum value (0 none, 1 mean, 2 cls, 3 last,
        4 rank)."""
        return int(self.ctx.pooling_type)

    logits_to_logprobs = staticmethod(compat.logits_to_logprobs)
    longest_token_prefix = staticmethod(compat.longest_token_prefix)

    @property
    def n_tokens(self) -> int:
        return self.engine.n_past(0) if self.engine else 0

    @n_tokens.setter
    def n_tokens(self, n: int) -> None:
        """Rewind to the first `n` cached tokens (llama-cpp-python's `llm.n_tokens = n`
        before an `eval`): the cells past them are dropped."""
        if not 0 <= n <= self.n_tokens:
            raise ValueError(f"n_tokens can rewind to 0..{self.n_tokens}, not {n}")
        self._generation += 1
        self.engine.forget(0, n)

    @property
    def input_ids(self) -> np.ndarray:
        return np.array(self.engine.cached[0] if self.engine else [], dtype=np.intc)

    # tokens ------------------------------------------------------------------------------------
    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of UTF-8 `text`; add_bos adds the vocab's special tokens (BOS) as the
        file asks; special parses control tokens written in the text."""
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        return self._model.tokenize(text, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: Seq[int], prev_tokens: Seq[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes of `tokens` (control tokens only with `special`)."""
        return self._model.vocab.detokenize_bytes(list(tokens), unparse_special=special)

    def piece(self, token: int) -> bytes:
        return self._model.vocab.token_to_piece(token, special=False)

    def dry_breakers(self, breakers: Seq[str]) -> Breakers:
        """DRY's sequence breakers as token sequences (sampling/dry.py), kept per list of
        strings (the last DRY_BREAKER_LISTS lists). The first call indexes every token's text
        (about 0.25 s for SmolLM2's 49,152 tokens); a list then takes milliseconds."""
        key = tuple(breakers)
        if key not in self._dry_breakers:
            if self._dry_text is None:
                self._dry_text = vocab_text(self._model.vocab)
            if len(self._dry_breakers) >= DRY_BREAKER_LISTS:
                self._dry_breakers.pop(next(iter(self._dry_breakers)))
            self._dry_breakers[key] = model_breakers(self._model, key, self._dry_text)
        return self._dry_breakers[key]

    # low-level evaluation (llama-cpp-python's eval) -------------------------------------------
    def eval(self, tokens: Seq[int]) -> None:
        """Append `tokens` to the cached sequence and decode them; `scores` is then the
        logits of the last one (None after a decode that failed, never the previous ones)."""
        self._generation += 1
        tokens = list(tokens)
        self.scores = None
        if len(tokens) == 1 and self.engine.n_past(0) > 0:  # a generation step: the fast path
            self.scores = self.engine.decode_step([(0, tokens[0])])[0]
        else:
            self.scores = self.engine.prefill(0, self.engine.cached[0] + tokens)

    def reset(self) -> None:
        """Forget the cached tokens (the next prompt is decoded from the start)."""
        self._generation += 1
        self.engine.forget(0)

    def set_cache(self, cache: state_cache.LlamaRAMCache | None) -> None:
        """Keep completions' states in `cache` (llama-cpp-python's; `llama.api.state_cache`)."""
        self.cache = cache

    def set_seed(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def next_seed(self, seed: int | None) -> int:
        """The seed of a call: the caller's, or one drawn from this object's generator
        (seeded by the constructor's `seed`, random by default)."""
        return int(seed) if seed is not None and seed >= 0 else self._rng.randrange(2**32 - 1)

    def generate(self, tokens: Seq[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0,
                 reset: bool = True, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                 mirostat_eta: float = 0.1, penalize_nl: bool = True, logits_processor=None,
                 stopping_criteria=None, grammar=None, seed: int | None = None) -> Iterator[int]:
        """llama-cpp-python's token generator: every token picked, end-of-generation ones
        included (the caller decides when to stop, as its create_completion does), until a
        stopping criterion says stop or the context is full. `reset=True` decodes `tokens`
        from the start (reusing the cached prefix); False appends them to what the cache
        holds. `tfs_z` and `penalize_nl` are accepted and ignored (llama.cpp dropped both);
        tokens sent into the generator are not supported."""
        prompt = list(tokens) if reset else self.engine.cached[0] + list(tokens)
        room = self.n_ctx() - len(prompt)
        if not prompt or room <= 0:
            raise ValueError(f"generate() needs between 1 and {self.n_ctx() - 1} tokens to start "
                             f"from, got {len(prompt)}")
        params = completion_api.sampling_params(
            self, temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
            repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, seed=seed, mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, n_ctx=self.n_ctx())
        seq = completion_api.make_sequence(self, prompt, max_tokens=room, stop=None, logprobs=None,
                                           params=params, grammar=grammar,
                                           logits_processor=logits_processor,
                                           stopping_criteria=stopping_criteria, ends_at_eog=False)
        n_yielded = 0
        for step in completion_api.run_sequence(self, seq, use_cache=False):
            if step.n_tokens > n_yielded:   # the step kept its token (a stopping criterion drops it)
                n_yielded = step.n_tokens
                sent = yield step.token
                if sent is not None:
                    raise NotImplementedError("generate() does not take tokens sent into it")

    # the three front ends -----------------------------------------------------------------------
    def create_completion(self, prompt: str | list[int], *args: Any, **kwargs: Any) -> dict | Iterator[dict]:
        """OpenAI's `text_completion` (or an iterator of chunks with stream=True); see
        `llama.api.completion.create_completion` for the arguments, which may also come in
        llama-cpp-python's positional order (`compat.COMPLETION_ARGS`)."""
        kwargs = compat.by_name("create_completion", compat.COMPLETION_ARGS, args, kwargs)
        return completion_api.create_completion(self, prompt, **kwargs)

    def __call__(self, prompt: str | list[int], *args: Any, **kwargs: Any) -> dict | Iterator[dict]:
        return self.create_completion(prompt, *args, **kwargs)

    def create_chat_completion(self, messages: list[dict], *args: Any, **kwargs: Any) -> dict | Iterator[dict]:
        """OpenAI's `chat.completion` (or `chat.completion.chunk`s with stream=True); see
        `llama.api.chat_completion.create_chat_completion` (positional arguments in
        llama-cpp-python's order, `compat.CHAT_ARGS`)."""
        kwargs = compat.by_name("create_chat_completion", compat.CHAT_ARGS, args, kwargs)
        return chat_api.create_chat_completion(self, messages, **kwargs)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, reasoning: str = "auto",
                            reasoning_effort: str | None = None, continue_final_message: bool | str | None = None,
                            **kwargs: Any) -> str:
        """The prompt text a chat completion makes of `messages` (`chat_prompt.chat_prompt`:
        the variables llama.cpp gives templates, a last assistant message continued);
        `kwargs` are more template variables, which win."""
        return chat_prompt(self._chat, messages, tools=tools, reasoning=reasoning,
                           reasoning_effort=reasoning_effort, chat_template_kwargs=kwargs,
                           add_generation_prompt=add_generation_prompt,
                           continue_final_message=continue_final_message)[0]

    def create_embedding(self, input: str | list, model: str | None = None) -> dict:
        return embedding_api.create_embedding(self, input, model=model)

    def embed(self, input: str | list, normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        return embedding_api.embed(self, input, normalize=normalize, truncate=truncate,
                                   return_count=return_count)

    # state ---------------------------------------------------------------------------------------
    def save_state(self) -> LlamaState:
        mem = self.ctx.memory
        return LlamaState(list(self.engine.cached[0]),
                          None if self.scores is None else self.scores.copy(),
                          {k: a.copy() for k, a in mem.bindings().items()}, mem.snapshot(),
                          self.ctx.n_ctx, self.ctx.type_k, self.ctx.type_v)

    def load_state(self, state: LlamaState) -> None:
        """A state saved with other KV cache types (-ctk/-ctv) is refused: its arrays hold
        another type's bytes (llama.cpp refuses it too, by the rows' sizes)."""
        mem = self.ctx.memory
        if (state.type_k, state.type_v) != (self.ctx.type_k, self.ctx.type_v):
            raise ValueError(f"the state was saved with KV cache types K {state.type_k}, V {state.type_v}; "
                             f"this context's are K {self.ctx.type_k}, V {self.ctx.type_v}")
        if state.n_ctx != self.ctx.n_ctx or state.arrays.keys() != mem.bindings().keys():
            raise ValueError("the state was saved from a context of another size or model")
        self._generation += 1
        for k, a in mem.bindings().items():
            np.copyto(a, state.arrays[k])
        mem.restore(state.cells)
        self.engine.cached[0] = list(state.tokens)
        self.scores = None if state.logits is None else state.logits.copy()

    def close(self) -> None:
        self._model.close()

    def __getstate__(self) -> dict:
        """llama-cpp-python's pickling: the constructor's arguments, so the model is loaded
        again where the object is unpickled (its KV cache and state cache do not travel)."""
        return dict(self._init_args)

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Hugging Face hub ---------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str, *, local_dir: str | None = None,
                        cache_dir: str | None = None, revision: str | None = None,
                        **kwargs: Any) -> "Llama":
        """Download (or find in the local hub cache) `filename` of `repo_id` and load it.
        Needs the optional extra `ggmlpy[hub]` (huggingface_hub); `filename` may be a glob
        such as "*Q4_1.gguf". With HF_HUB_OFFLINE=1 only the local cache is used."""
        from llama.api.hub import download
        path = download(repo_id, filename, local_dir=local_dir, cache_dir=cache_dir,
                        revision=revision, verbose=kwargs.get("verbose", True))
        return cls(path, **kwargs)
