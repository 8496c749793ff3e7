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
    seq = task.seq
    prompt_n = len(seq.prompt) - task.n_cached
    prompt_ms = (task.t_first - task.t_start) * 1000 if task.t_first else 0.0
    predicted_n = len(seq.tokens)
    predicted_ms = (time.perf_counter() - task.t_first) * 1000 if task.t_first else 0.0
    return {"cache_n": task.n_cached,
            "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": predicted_n / predicted_ms * 1000 if predicted_ms else 0.0}


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
