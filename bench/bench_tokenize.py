"""Tokenization throughput on SmolLM2's (BPE) and Gemma 3's (SPM) vocabularies; one JSON object.

The golden perplexity text repeated to about 1 MB, tokenized with a fresh word cache
("cold": every distinct word merged once) and again with the cache warm. The target is at
least 1 MB/s for each vocabulary. The top-level keys are for --model (SmolLM2 by default);
the same keys for the second vocabulary (--also, Gemma 3 by default) are under its name.
Run: python bench/bench_tokenize.py [--model PATH] [--also NAME|none] [--mb 1.0]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ggmlpy.hub import resolve_model  # noqa: E402
from llama.vocab import Vocab  # noqa: E402


def load_metadata(path: Path) -> dict:
    """GGUF metadata as plain Python values: ggmlpy's reader, else the `gguf` package."""
    try:
        from ggmlpy.gguf import GGUFFile
    except ImportError:
        GGUFFile = None
    if GGUFFile is not None:
        return dict(GGUFFile(path).metadata)
    import numpy as np
    from gguf import GGUFReader, GGUFValueType
    md = {}
    for key, field in GGUFReader(path).fields.items():
        value = field.contents()
        if field.types[0] == GGUFValueType.ARRAY and field.types[-1] != GGUFValueType.STRING:
            value = np.asarray(value)
        md[key] = value
    return md


def measure(model: str, text: str) -> dict:
    """Vocabulary load time and cold / warm tokenization speed of `text` for one model."""
    n_bytes = len(text.encode("utf-8"))
    t0 = time.perf_counter()
    vocab = Vocab.from_metadata(load_metadata(resolve_model(model)))
    load_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    ids = vocab.tokenize(text, add_special=False)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ids2 = vocab.tokenize(text, add_special=False)
    warm_s = time.perf_counter() - t0
    assert ids == ids2

    return {
        "bytes_per_s": round(n_bytes / cold_s),
        "warm_bytes_per_s": round(n_bytes / warm_s),
        "bytes": n_bytes,
        "tokens": len(ids),
        "tokens_per_s": round(len(ids) / cold_s),
        "cold_s": round(cold_s, 4),
        "warm_s": round(warm_s, 4),
        "vocab_load_s": round(load_s, 3),
        "distinct_words_cached": len(vocab.model._cache),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--also", default="gemma3-270m", help="a second model, or 'none'")
    ap.add_argument("--mb", type=float, default=1.0)
    args = ap.parse_args()

    text_path = REPO / "tests" / "golden" / "smollm2-135m-q4_1" / "ppl_text.txt"
    base = text_path.read_text(encoding="utf-8")
    target = int(args.mb * 1_000_000)
    text = base * max(1, -(-target // len(base.encode("utf-8"))))

    result = measure(args.model, text)
    if args.also and args.also != "none":
        result[args.also] = measure(args.also, text)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
