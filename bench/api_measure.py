"""The high-level API measurements, written against llama-cpp-python's `Llama` surface only,
so the same code measures `llama.Llama` (ggmlpy) and `llama_cpp.Llama` (the peer, run in
its own virtual environment by bench_api.py). Prints one JSON object when run as a script:

    python bench/api_measure.py llama_cpp MODEL.gguf THREADS
"""
from __future__ import annotations

import json
import statistics
import sys
import time

CHAT = [{"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three rivers in Europe and one fact about each."}]
FOLLOW_UP = "Which of them is the longest?"
LONG_STRING_SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 4000}},
                      "required": ["story"]}


class StepClock:
    """A stopping criterion that never stops and notes when each token was picked: the
    time between the first and the last note is decode + sampling + API per token."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, logits) -> bool:
        self.times.append(time.perf_counter())
        return False

    def tok_s(self) -> float:
        n = len(self.times) - 1
        return n / (self.times[-1] - self.times[0]) if n > 0 else 0.0


def no_eog_bias(llm) -> dict[int, float]:
    """Ban the end-of-generation tokens so every run makes its full length."""
    ids = {llm.token_eos()}
    return {i: -1e9 for i in ids if i >= 0}


def completion_tg(llm, n: int, variants: dict[str, dict], reps: int) -> dict[str, float]:
    """Median tokens/s of create_completion over n tokens (first token excluded) for each
    variant of keyword arguments, the variants interleaved round by round so that a noisy
    neighbour hits them alike; round 0 is a warm-up."""
    rates: dict[str, list[float]] = {name: [] for name in ["decode_only", *variants]}
    for rep in range(reps + 1):
        if rep:
            rates["decode_only"].append(decode_only_tg(llm, n))
        for name, kw in variants.items():
            clock = StepClock()
            llm.reset()
            llm.create_completion("Once upon a time", max_tokens=n + 1, logit_bias=no_eog_bias(llm),
                                  stopping_criteria=criteria(llm, clock), seed=rep, **kw)
            if rep:
                rates[name].append(clock.tok_s())
    return {name: statistics.median(r) for name, r in rates.items()}


def decode_only_tg(llm, n: int) -> float:
    """Tokens/s of n one-token decodes with nothing between them (ggmlpy bench's and
    llama-bench's tg), through each library's low-level call (`eval`)."""
    llm.reset()
    llm.eval([llm.token_bos() if llm.token_bos() >= 0 else 0])
    t0 = time.perf_counter()
    for i in range(n):
        llm.eval([100 + i])
    return n / (time.perf_counter() - t0)


def criteria(llm, clock: StepClock):
    """llama-cpp-python wants a StoppingCriteriaList; ggmlpy takes any list of callables."""
    if type(llm).__module__.startswith("llama_cpp"):
        from llama_cpp import StoppingCriteriaList
        return StoppingCriteriaList([clock])
    return [clock]


def timed_chat(llm, messages, max_tokens: int) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = llm.create_chat_completion(messages, max_tokens=max_tokens, temperature=0)
    return out, (time.perf_counter() - t0) * 1000


def second_turn(llm) -> dict:
    """Prompt evaluation of a chat's second turn, against the same prompt from scratch."""
    llm.reset()
    first, first_ms = timed_chat(llm, CHAT, 24)
    turn2 = CHAT + [first["choices"][0]["message"], {"role": "user", "content": FOLLOW_UP}]
    _, second_ms = timed_chat(llm, turn2, 1)
    llm.reset()
    out, fresh_ms = timed_chat(llm, turn2, 1)
    return {"turn1_prompt_tokens": first["usage"]["prompt_tokens"],
            "turn2_prompt_tokens": out["usage"]["prompt_tokens"],
            "turn2_ms": round(second_ms, 1), "turn2_from_scratch_ms": round(fresh_ms, 1)}


def measure(llm, *, n: int = 128, reps: int = 5, schema: bool = True) -> dict:
    variants = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.8}}
    if schema:
        fmt = {"type": "json_object", "schema": LONG_STRING_SCHEMA}
        variants["json_schema"] = {"temperature": 0.8, "grammar": json_grammar(llm, fmt)}
    rates = completion_tg(llm, n, variants, reps)
    result = {f"completion_tg{n}_{name}_tok_s": round(v, 2) for name, v in rates.items()}
    result.update(second_turn(llm))
    return result


def json_grammar(llm, response_format):
    """The grammar object each library takes for a JSON schema."""
    module = type(llm).__module__
    schema = json.dumps(response_format["schema"])
    if module.startswith("llama_cpp"):
        from llama_cpp import LlamaGrammar
    else:
        from llama import LlamaGrammar
    return LlamaGrammar.from_json_schema(schema, verbose=False)


def main() -> None:
    which, model, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if which != "llama_cpp":
        raise SystemExit("run bench_api.py for ggmlpy; this entry point is for the peer")
    from llama_cpp import Llama
    llm = Llama(model_path=model, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    print(json.dumps(measure(llm)))


if __name__ == "__main__":
    main()
