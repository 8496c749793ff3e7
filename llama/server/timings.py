"""llama-server's `timings` of a request (its nine fields), from the scheduler's clock: the
prompt from the task's start in a slot to its first token, the generation from there on;
and the `system_fingerprint` of its OpenAI answers and chunks."""
from __future__ import annotations

import time

import ggmlpy
from llama.server.scheduler import Task

# llama-server's is its build ("b<number>-<commit>"); ggmlpy's has the same form, its version
SYSTEM_FINGERPRINT = f"b{ggmlpy.__version__}-ggmlpy"


def timings(task: Task) -> dict:
    """The prompt from the task's start in a slot to its first token, the generation from
    there on (and what speculative decoding drafted, when it did). The first token comes
    from the prompt's last batch, so the generation's rates are over one step fewer than
    its tokens (0 with one token), as llama-server counts."""
    seq = task.seq
    prompt_ms = (task.t_first - task.t_start) * 1000 if task.t_first else 0.0
    predicted_ms = (time.perf_counter() - task.t_first) * 1000 if task.t_first else 0.0
    out = _timings(task.n_cached, len(seq.prompt) - task.n_cached, prompt_ms, len(seq.tokens), predicted_ms)
    if seq.n_drafted:   # llama-server adds these where speculative decoding drafted
        out["draft_n"], out["draft_n_accepted"] = seq.n_drafted, seq.n_draft_accepted
    return out


def progress_timings(info: dict) -> dict:
    """The timings of a prompt_progress chunk: the prompt so far, nothing generated."""
    prompt_n = info["processed"] - info["cache"]
    return _timings(info["cache"], prompt_n, info["time_ms"] if prompt_n else 0.0, 0, 0.0)


def _timings(cache_n: int, prompt_n: int, prompt_ms: float, predicted_n: int, predicted_ms: float) -> dict:
    steps = max(predicted_n - 1, 0)
    return {"cache_n": cache_n,
            "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
            "predicted_per_second": 1e3 / predicted_ms * steps if predicted_ms and steps else 0.0}


def verbose_answer(task: Task, prompt_text: str) -> dict:
    """llama-server's `__verbose` (asked for by `verbose`, on by default with --verbose):
    the answer as its native /completion gives it, with the prompt's text."""
    seq = task.seq
    return {"index": 0, "content": seq.completion_text(), "tokens": [], "id_slot": task.slot, "stop": True,
            "tokens_predicted": len(seq.tokens), "tokens_evaluated": len(seq.prompt), "prompt": prompt_text,
            "stop_type": "limit" if seq.finish_reason == "length" else "word" if seq.text.stopped else "eos",
            "tokens_cached": len(seq.prompt) + len(seq.tokens), "timings": timings(task)}


def with_timings(answer: dict, task: Task) -> dict:
    """An OpenAI answer (or a stream's last chunk) with llama-server's additions: `timings`,
    and the prompt tokens the cache served (`usage.prompt_tokens_details.cached_tokens`)."""
    answer["timings"] = timings(task)
    answer["system_fingerprint"] = SYSTEM_FINGERPRINT
    if answer.get("usage"):
        answer["usage"]["prompt_tokens_details"] = {"cached_tokens": task.n_cached}
    return answer


class TimedChunks:
    """A stream builder whose last chunk carries the timings (and, with include_usage, the
    usage chunk its cached tokens), as llama-server's OpenAI streams."""

    def __init__(self, chunks, task: Task):
        self.chunks, self.task = chunks, task

    def start(self) -> list[dict]:
        return _fingerprinted(self.chunks.start())

    def feed(self, step) -> list[dict]:
        return _fingerprinted(self.chunks.feed(step))

    def end(self) -> list[dict]:
        out = self.chunks.end()
        if out:
            with_timings(out[-1], self.task)
        return _fingerprinted(out)


def _fingerprinted(chunks: list[dict]) -> list[dict]:
    for chunk in chunks:
        chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
    return chunks
