"""`create_completion`: a prompt in, OpenAI's `text_completion` out (or its chunks).

The loop is the one every front end shares: prefill through the engine (reusing the cached
prefix), then per token `Sequence.step` on the last logits and one decode of the picked
token. Streaming yields each step's final text; the chunks concatenate to the text the
non-streamed call returns, because both come from the same `TextStream`.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence as Seq

from llama.api import responses, state_cache
from llama.api.logprobs import CharOffsets, TokenLogprob, completion_logprobs, token_logprob
from llama.api.sequence import SamplingParams, Sequence, Step
from llama.api.grammar_args import make_grammar_sampler
from llama.sampling.dry import DEFAULT_BREAKERS
from llama.speculative.accept import accept, draft_budget

if TYPE_CHECKING:
    from llama.api.llama import Llama


def prompt_tokens(llm: "Llama", prompt: str | list[int]) -> list[int]:
    """Text is tokenized with the vocab's BOS and control tokens parsed (as
    llama-cpp-python); ids are taken as they are. An empty prompt starts from BOS."""
    if isinstance(prompt, str):
        ids = llm.tokenize(prompt, add_bos=True, special=True) if prompt else []
    else:
        ids = [int(t) for t in prompt]
        for t in ids:
            llm.model.vocab.check_token(t)
    if not ids:
        bos = llm.token_bos()
        if bos < 0:
            raise ValueError("the prompt is empty and the vocab has no BOS token to start from")
        ids = [bos]
    return ids


class ContextOverflowError(ValueError):
    """A prompt that leaves no room in the context (llama-cpp-python's ValueError; the
    server answers it as llama-server's exceed_context_size_error)."""

    def __init__(self, n_prompt: int, n_ctx: int):
        super().__init__(f"Requested tokens ({n_prompt}) exceed context window of {n_ctx}")
        self.n_prompt, self.n_ctx = n_prompt, n_ctx


def resolve_max_tokens(max_tokens: int | None, n_prompt: int, n_ctx: int,
                       context_shift: bool = False) -> int:
    """llama-cpp-python's rule: None or <= 0 means up to the context's end; never past it,
    unless the context shifts when full (the server's --context-shift), which lets an
    explicit max_tokens run past it."""
    if n_prompt >= n_ctx:
        raise ContextOverflowError(n_prompt, n_ctx)
    room = n_ctx - n_prompt
    if max_tokens is None or max_tokens <= 0:
        return room
    return int(max_tokens) if context_shift else min(int(max_tokens), room)


def make_sequence(llm: "Llama", ids: list[int], *, max_tokens: int, stop, logprobs: int | None,
                  params: SamplingParams, grammar: Any = None, logits_processor=None,
                  stopping_criteria=None, ends_at_eog: bool = True) -> Sequence:
    """`ends_at_eog=False`: an end-of-generation token is a token like any other
    (llama-cpp-python's `generate`, whose caller decides when to stop)."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    vocab = llm.model.vocab
    is_eog = vocab.is_eog if ends_at_eog else (lambda _: False)
    return Sequence(ids, n_vocab=llm.n_vocab(), is_eog=is_eog, piece_of=llm.piece,
                    params=params, max_tokens=max_tokens, stop=stops, logprobs=logprobs,
                    grammar=make_grammar_sampler(vocab, grammar),
                    logits_processors=list(logits_processor or []),
                    stopping_criteria=list(stopping_criteria or []))


def run_sequence(llm: "Llama", seq: Sequence, *, logits_all_prompt: bool = False,
                 use_cache: bool = True) -> Iterator[Step]:
    """Decode the sequence's prompt, then step it to the end (seq 0 of the Llama's engine).
    `use_cache`: consult and fill the Llama's state cache (`set_cache`), as
    llama-cpp-python's completions do (its `generate` does not).

    A newer call on the same Llama invalidates this one: the cache then holds another
    sequence, so a stream that is resumed afterwards raises instead of going astray."""
    if use_cache:
        state_cache.load_best(llm, seq.prompt)
    llm._generation += 1
    generation = llm._generation
    engine = llm.engine
    t0 = time.perf_counter()
    llm.scores = None  # until a decode succeeds: a failed one leaves no stale logits
    logits = engine.prefill(0, seq.prompt, logits_all=logits_all_prompt)
    if logits_all_prompt:
        seq.prompt_logits = logits
        logits = logits[-1]
    llm.scores = logits
    t1 = time.perf_counter()
    n_ctx = llm.n_ctx()
    rows, decoded = logits[None], []   # the last decode's rows and, with a draft, its tokens
    while True:
        draft = decoded[1:]
        steps, n_kept = accept(seq, rows, draft)
        if draft:
            engine.settle_draft(0, decoded, n_kept)
        llm.scores = rows[len(steps) - 1]
        seq.n_drafted += len(draft)
        seq.n_draft_accepted += len(steps) - 1
        for step in steps:
            if llm._generation != generation:
                raise RuntimeError("another call on this Llama started; this stream cannot continue")
            yield step
        if seq.finished:
            break
        if engine.n_past(0) >= n_ctx:
            yield seq.stop_for_context()
            break
        decoded = [steps[-1].token]
        n_max = draft_budget(n_ctx, n_past=engine.n_past(0), n_ctx=n_ctx,
                             n_remaining=seq.max_tokens - len(seq.tokens))
        if llm.drafter and n_max:
            decoded += llm.drafter.draft(0, seq.prompt + seq.tokens, n_max)
        llm.scores = None
        if len(decoded) > 1:
            rows = engine.decode_draft(0, decoded)
        else:
            rows = engine.decode_step([(0, decoded[0])])
    if use_cache:
        state_cache.store(llm)
    if llm.verbose:
        t2 = time.perf_counter()
        n = len(seq.tokens)
        print(f"prompt eval: {len(seq.prompt)} tokens in {(t1 - t0) * 1000:.1f} ms; "
              f"generation: {n} tokens in {(t2 - t1) * 1000:.1f} ms "
              f"({n / (t2 - t1) if t2 > t1 else 0:.1f} tok/s)", file=sys.stderr)


@dataclass
class CompletionJob:
    """A completion request made ready to run: its `Sequence` and what the response needs.
    `Llama.create_completion` runs it on sequence 0; the server runs it in a slot."""
    seq: Sequence
    meta: tuple  # (id, created, model)
    prompt_text: str
    echo: bool
    logprobs: int | None
    suffix: str | None
    piece_of: Callable[[int], bytes]
    include_usage: bool = False   # stream_options.include_usage: a last chunk with the usage
    bos: int = -1                 # the vocab's BOS, left out of echoed logprobs

    @property
    def wants_prompt_logits(self) -> bool:
        return bool(self.echo and self.logprobs is not None)

    def response(self) -> dict:
        """The `text_completion` of the finished sequence."""
        seq = self.seq
        text = seq.completion_text()
        lp = None
        if self.logprobs is not None:
            lp = completion_logprobs(seq.logprobs, CharOffsets(len(self.prompt_text)))
            if self.echo:   # the prompt's tokens first, placed in the text by their pieces
                prompt_entries = _prompt_logprobs(self.piece_of, seq, self.logprobs, self.bos)
                prompt_lp = completion_logprobs(prompt_entries, CharOffsets(0))
                prompt_lp["token_logprobs"][0] = None   # OpenAI: the first prompt token has none
                prompt_lp["top_logprobs"][0] = None
                lp = {k: prompt_lp[k] + lp[k] for k in lp}
        if self.echo:
            text = self.prompt_text + text
        if self.suffix:
            text += self.suffix
        return responses.completion(*self.meta, text, seq.finish_reason, lp,
                                    responses.usage(len(seq.prompt), len(seq.tokens)))

    def chunks(self) -> "CompletionChunks":
        return CompletionChunks(self)


class CompletionChunks:
    """The streamed `text_completion` chunks, built step by step (`start`, `feed` per
    `Step`, `end`), so a loop that is not a generator (the server's) can build them too."""

    def __init__(self, job: CompletionJob):
        self.job = job
        self.offsets = CharOffsets(len(job.prompt_text))  # from the prompt's start, as OpenAI's

    def start(self) -> list[dict]:
        job = self.job
        return [responses.completion(*job.meta, job.prompt_text, None, None, None)] if job.echo else []

    def feed(self, step: Step) -> list[dict]:
        if not (step.text or step.logprobs):
            return []
        lp = None
        if self.job.logprobs is not None:
            lp = completion_logprobs(step.logprobs, self.offsets)
        return [responses.completion(*self.job.meta, step.text, None, lp, None,
                                     with_usage_field=self.job.include_usage)]

    def end(self) -> list[dict]:
        job, seq = self.job, self.job.seq
        out = [responses.completion(*job.meta, "", seq.finish_reason, None, None,
                                    with_usage_field=job.include_usage)]
        if job.include_usage:
            out.append(responses.usage_chunk(*job.meta, responses.usage(len(seq.prompt), len(seq.tokens)),
                                             object_="text_completion"))
        return out


def sampling_params(llm: "Llama", *, seed: int | None, n_ctx: int, mirostat_mode: int = 0,
                    repeat_last_n: int = 64, dry_penalty_last_n: int = 64,
                    dry_sequence_breakers: Seq[str] = DEFAULT_BREAKERS,
                    **options: Any) -> SamplingParams:
    """The chain's settings: `SamplingParams`' fields by name (an unknown one is a TypeError).
    The seed is drawn from the Llama's generator when None; repeat_last_n and
    dry_penalty_last_n -1 are `n_ctx`, the context the sequence may fill, as llama-server's;
    DRY's breaker strings become token sequences (`Llama.dry_breakers`) when DRY is on.
    Beyond llama-cpp-python's arguments, the server passes llama-server's repeat_last_n,
    min_keep, dynatemp_*, top_n_sigma, xtc_*, dry_* and samplers through here."""
    if isinstance(mirostat_mode, bool) or mirostat_mode not in (0, 1, 2):
        raise ValueError(f"mirostat_mode must be 0 (off), 1 or 2, got {mirostat_mode!r}")
    for name, value in (("repeat_last_n", repeat_last_n), ("dry_penalty_last_n", dry_penalty_last_n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            raise ValueError(f"{name} must be an integer >= -1 (-1: the context size), got {value!r}")
    if isinstance(dry_sequence_breakers, str):
        raise ValueError("dry_sequence_breakers must be a list of strings, not one string")
    breakers = None
    if options.get("dry_multiplier", 0.0):
        breakers = llm.dry_breakers(dry_sequence_breakers)
    return SamplingParams(seed=llm.next_seed(seed), mirostat_mode=mirostat_mode,
                          repeat_last_n=n_ctx if repeat_last_n == -1 else repeat_last_n,
                          dry_penalty_last_n=n_ctx if dry_penalty_last_n == -1 else dry_penalty_last_n,
                          dry_breakers=breakers, **options)


def prepare_completion(llm: "Llama", prompt: str | list[int], *, suffix: str | None = None,
                       max_tokens: int | None = 16, temperature: float = 0.8, top_p: float = 0.95,
                       min_p: float = 0.05, typical_p: float = 1.0, logprobs: int | None = None,
                       echo: bool = False, stop: str | list[str] | None = None,
                       frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                       repeat_penalty: float = 1.0, top_k: int = 40, seed: int | None = None,
                       tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                       mirostat_eta: float = 0.1, model: str | None = None,
                       stopping_criteria=None, logits_processor=None, grammar=None,
                       logit_bias: dict[int, float] | None = None,
                       stream_options: dict | None = None,
                       n_ctx: int | None = None, context_shift: bool = False,
                       **server_sampling: Any) -> CompletionJob:
    """A request -> a `CompletionJob` (the checks, the prompt, the sampler chain). `n_ctx`:
    the context the sequence may fill (the Llama's by default; a server slot's share);
    `context_shift`: the caller shifts that context when it fills (the server's
    --context-shift), so an explicit max_tokens may go past it.
    `server_sampling`: llama-server's fields beyond llama-cpp-python's arguments
    (repeat_last_n, min_keep, dynatemp_*, top_n_sigma, xtc_*; see `sampling_params`)."""
    if logprobs is not None and (isinstance(logprobs, bool) or int(logprobs) < 0):
        raise ValueError(f"logprobs must be a non-negative integer, got {logprobs!r}")
    ids = prompt_tokens(llm, prompt)
    n_max = resolve_max_tokens(max_tokens, len(ids), n_ctx or llm.n_ctx(), context_shift)
    params = sampling_params(llm, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                             typical_p=typical_p, repeat_penalty=repeat_penalty,
                             presence_penalty=presence_penalty,
                             frequency_penalty=frequency_penalty, logit_bias=logit_bias, seed=seed,
                             mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau,
                             mirostat_eta=mirostat_eta, n_ctx=n_ctx or llm.n_ctx(), **server_sampling)
    seq = make_sequence(llm, ids, max_tokens=n_max, stop=stop, logprobs=logprobs, params=params,
                        grammar=grammar, logits_processor=logits_processor,
                        stopping_criteria=stopping_criteria)
    prompt_text = prompt if isinstance(prompt, str) else llm.detokenize(ids).decode("utf-8", "replace")
    meta = (responses.new_id("cmpl"), responses.now(), model or llm.model_path)
    return CompletionJob(seq, meta, prompt_text, bool(echo), logprobs, suffix, llm.piece,
                         bool((stream_options or {}).get("include_usage")), llm.token_bos())


def create_completion(llm: "Llama", prompt: str | list[int], *, stream: bool = False,
                      **kwargs: Any) -> dict | Iterator[dict]:
    """llama-cpp-python's create_completion (same arguments and defaults, see
    `prepare_completion`). `tfs_z` is accepted and ignored (llama.cpp removed tail-free
    sampling); `mirostat_mode` 1 or 2 samples with mirostat after the temperature
    (llama.sampling.mirostat)."""
    job = prepare_completion(llm, prompt, **kwargs)
    steps = run_sequence(llm, job.seq, logits_all_prompt=job.wants_prompt_logits)
    if stream:
        return _stream(job.chunks(), steps)
    for _ in steps:
        pass
    return job.response()


def _prompt_logprobs(piece_of: Callable[[int], bytes], seq: Sequence, n_top: int,
                     bos: int) -> list[TokenLogprob]:
    """Logprobs of the prompt's tokens, each from the previous row; a leading BOS is left
    out (its text is not in the prompt; llama-cpp-python's echo drops it too), and the first
    token has none (its placeholder is replaced by None)."""
    rows = seq.prompt_logits
    start = 1 if len(seq.prompt) > 1 and seq.prompt[0] == bos else 0
    first = TokenLogprob(seq.prompt[start], piece_of(seq.prompt[start]), 0.0, [])
    return [first] + [token_logprob(rows[i - 1], seq.prompt[i], n_top, piece_of)
                      for i in range(start + 1, len(seq.prompt))]


def _stream(chunks: CompletionChunks, steps: Iterator[Step]) -> Iterator[dict]:
    yield from chunks.start()
    for step in steps:
        yield from chunks.feed(step)
    yield from chunks.end()
