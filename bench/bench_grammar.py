"""Cost of JSON-schema constrained decoding per token, with and without mask prefetch; JSON.

For each model (SmolLM2, BPE 49k tokens; Gemma 3, SPM 262k tokens): the llguidance
tokenizer build time (once per vocabulary), then a greedy generation under a JSON schema
on the CPU backend, with the mask computed when the logits arrive ("first_sync" on a cold
tokenize memo, then "sync") and with it computed in a background thread while the decode
of the previous token runs ("prefetch"). Greedy decoding makes all runs produce the same
tokens.

Per token: `mask_compute_ms` is llguidance's time for one mask (on whichever thread),
`mask_wait_ms` the time the sampling thread was blocked for it (all of it when sync, only
what did not overlap the decode when prefetching), `apply_ms` the rest of the grammar
stage (masking the logits), `ms_per_token` the whole generation step, next to the same
prompt decoded without a grammar (`baseline`). The mask of a replay of the same tokens
without any decode (`isolated_mask_ms`) shows the cost free of thread contention.
Run: python bench/bench_grammar.py [--models smollm2-135m gemma3-270m] [--tokens 64]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

import llama  # noqa: E402
from llama.generate import generate  # noqa: E402
from llama.grammar import Grammar, GrammarSampler, tokenizer_for  # noqa: E402
from llama.sampling import Candidates, make_sampler  # noqa: E402

SCHEMA = {
    "type": "array", "minItems": 3, "maxItems": 6,
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 16},
                       "age": {"type": "integer", "minimum": 0, "maximum": 120},
                       "city": {"type": "string", "maxLength": 16},
                       "member": {"type": "boolean"}},
        "required": ["name", "age", "city", "member"], "additionalProperties": False,
    },
}
PROMPT = "A JSON list of people with their name, age, city and membership:\n"


class TimedGrammarSampler(GrammarSampler):
    """Times the whole grammar stage (mask wait included)."""

    apply_s = 0.0

    def apply(self, cur: Candidates) -> None:
        t0 = time.perf_counter()
        super().apply(cur)
        self.apply_s += time.perf_counter() - t0


def timed_run(ctx: llama.Context, grammar: Grammar | None, n_tokens: int,
              prefetch: bool) -> dict:
    model = ctx.model
    ctx.memory.clear()
    constraint = None if grammar is None else TimedGrammarSampler(model.vocab, grammar,
                                                                  prefetch=prefetch)
    sampler = make_sampler(n_vocab=model.n_vocab, temp=0.0, grammar=constraint)
    result = generate(ctx, PROMPT, max_tokens=n_tokens, sampler=sampler)
    steps = len(result.tokens) + (result.stop_reason == "eog")
    out = {"tokens": len(result.tokens), "stop": result.stop_reason,
           "ms_per_token": round(result.gen_ms / max(steps, 1), 3),
           "text": result.text[:80]}
    if constraint is not None:
        stats = constraint.stats
        out.update({
            "mask_compute_ms": round(stats.compute_s / stats.masks * 1e3, 4),
            "mask_wait_ms": round(stats.wait_s / steps * 1e3, 4),
            "apply_ms": round((constraint.apply_s - stats.wait_s) / steps * 1e3, 4),
            "masks": stats.masks, "prefetched": stats.prefetched,
        })
        constraint.close()
    out["token_ids"] = result.tokens
    return out


def measure(name: str, n_tokens: int) -> dict:
    model = llama.Model.load(name)
    ctx = llama.Context(model, n_ctx=512)
    t0 = time.perf_counter()
    tokenizer_for(model.vocab)
    build_s = time.perf_counter() - t0
    grammar = Grammar.from_json_schema(SCHEMA)
    baseline = timed_run(ctx, None, n_tokens, prefetch=False)  # also compiles the graphs
    # the first constrained run pays llguidance's re-tokenization of forced strings
    # (memoised per vocabulary afterwards); a Gemma tokenize call costs milliseconds
    first = timed_run(ctx, grammar, n_tokens, prefetch=False)
    sync = timed_run(ctx, grammar, n_tokens, prefetch=False)
    prefetch = timed_run(ctx, grammar, n_tokens, prefetch=True)
    assert first["token_ids"] == sync["token_ids"] == prefetch["token_ids"], "greedy runs differ"
    replay = replay_mask_ms(model.vocab, grammar, sync["token_ids"])
    for run in (baseline, first, sync, prefetch):
        del run["token_ids"]
    return {"n_vocab": model.n_vocab, "tokenizer_build_s": round(build_s, 3),
            "isolated_mask_ms": replay, "baseline": baseline, "first_sync": first,
            "sync": sync, "prefetch": prefetch}


def replay_mask_ms(vocab, grammar: Grammar, tokens: list[int]) -> float:
    """Mean mask time over the same tokens with no decode running."""
    constraint = GrammarSampler(vocab, grammar, prefetch=False)
    logits = np.zeros(vocab.n_vocab, dtype=np.float32)
    for token in tokens:
        constraint.apply(Candidates.from_logits(logits))
        constraint.accept(token)
    stats = constraint.stats
    constraint.close()
    return round(stats.compute_s / stats.masks * 1e3, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    print(json.dumps({name: measure(name, args.tokens) for name in args.models}, indent=2))


if __name__ == "__main__":
    main()
