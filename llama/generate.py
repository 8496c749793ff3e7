"""The generation loop (docs/architecture.md, steps 9-16): tokenize, decode the prompt, then sample, stop on
an end-of-generation token, turn tokens into text and feed them back.

`generate()` runs to the end and returns a `Generation`; `stream()` yields text as it is
produced (UTF-8 sequences split across tokens are held back until complete).
"""
from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from llama.batch import Batch
from llama.context import Context
from llama.sampling import SamplerChain, make_sampler


class GenerationError(RuntimeError):
    """decode failed while generating (the return code is in the message)."""


@dataclass
class Generation:
    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str = ""  # "eog", "length" (max_tokens reached) or "context" (n_ctx full)
    prompt_ms: float = 0.0
    gen_ms: float = 0.0

    @property
    def prompt_tok_s(self) -> float:
        return len(self.prompt_tokens) / self.prompt_ms * 1000 if self.prompt_ms else 0.0

    @property
    def gen_tok_s(self) -> float:
        # like llama.cpp's eval time: every decoded token after the prompt
        n = max(len(self.tokens) - 1, 0)
        return n / self.gen_ms * 1000 if self.gen_ms and n else 0.0

    def timings(self) -> dict[str, float]:
        return {"prompt_tokens": len(self.prompt_tokens), "prompt_ms": round(self.prompt_ms, 3),
                "prompt_tok_s": round(self.prompt_tok_s, 3), "gen_tokens": len(self.tokens),
                "gen_ms": round(self.gen_ms, 3), "gen_tok_s": round(self.gen_tok_s, 3)}


def stream(ctx: Context, prompt: str | list[int], *, max_tokens: int = 128,
           sampler: SamplerChain | None = None, add_special: bool = True, parse_special: bool = True,
           seq_id: int = 0, result: Generation | None = None,
           on_token: Callable[[int], None] | None = None) -> Iterator[str]:
    """Yield generated text piece by piece; `result` (if given) is filled as it goes."""
    model = ctx.model
    vocab = model.vocab
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    ids = list(prompt) if not isinstance(prompt, str) else model.tokenize(prompt, add_special, parse_special)
    if not ids:
        raise ValueError("the prompt is empty (no tokens)")
    start = ctx.memory.seq_pos_max(seq_id) + 1
    if start + len(ids) > ctx.n_ctx:
        raise ValueError(f"the prompt has {len(ids)} tokens but the context holds {ctx.n_ctx} "
                         f"({start} already used)")
    sampler = sampler or make_sampler(n_vocab=model.n_vocab)
    gen = result if result is not None else Generation(ids)
    gen.prompt_tokens = ids
    sampler.accept_many(ids)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")

    t0 = time.perf_counter()
    for i in range(0, len(ids), ctx.n_batch):
        chunk = ids[i:i + ctx.n_batch]
        _check(ctx.decode(Batch.from_tokens(chunk, seq_id=seq_id)), "prompt")
    t1 = time.perf_counter()
    gen.prompt_ms = (t1 - t0) * 1000
    n_past = start + len(ids)
    while True:
        if len(gen.tokens) >= max_tokens:
            gen.stop_reason = "length"
            break
        tok = sampler.sample(ctx.get_logits_ith(-1))
        sampler.accept(tok)
        if vocab.is_eog(tok):
            gen.stop_reason = "eog"
            break
        gen.tokens.append(tok)
        if on_token is not None:
            on_token(tok)
        piece = decoder.decode(vocab.token_to_piece(tok))
        gen.text += piece
        if piece:
            yield piece
        if n_past >= ctx.n_ctx:
            gen.stop_reason = "context"
            break
        if len(gen.tokens) >= max_tokens:
            gen.stop_reason = "length"
            break
        _check(ctx.decode(Batch.from_tokens([tok], seq_id=seq_id)), "generation")
        n_past += 1
    tail = decoder.decode(b"", final=True)
    if tail:
        gen.text += tail
        yield tail
    gen.gen_ms = (time.perf_counter() - t1) * 1000


def generate(ctx: Context, prompt: str | list[int], **kwargs) -> Generation:
    """Run `stream` to the end; the result holds the tokens, the text and timings."""
    result = Generation([])
    for _ in stream(ctx, prompt, result=result, **kwargs):
        pass
    return result


def _check(rc: int, what: str) -> None:
    if rc != 0:
        names = {1: "no KV cache slot", 2: "aborted", -1: "invalid batch"}
        raise GenerationError(f"decode of the {what} failed with {rc} ({names.get(rc, 'fatal error')})")
