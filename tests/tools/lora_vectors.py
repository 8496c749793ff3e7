"""llama.cpp's answers with a LoRA adapter, for tests/llama/models/test_lora.py's vectors.

Writes the test's adapter for SmolLM2 (ggmlpy.testing.lora.write_lora with ADAPTER's
settings: random, seeded), starts llama-server (built from the source llama-cpp-python
0.3.36 vendors, outside the repo) with `--lora` on it, and records for each prompt and
scale (the server's 1.0, then the request field `lora` at 0.5 and 0) the greedy tokens of
a /completion and the top-5 log-probabilities at each of them. The adapter's sha256 goes
with them, so the test can tell a changed adapter from a wrong answer. Not a test and not
a dependency; rerun it when the reference changes:

    python -m tests.tools.lora_vectors /path/to/llama.cpp/build/bin/llama-server \\
        > tests/llama/models/data/lora_llama_cpp.json
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

from ggmlpy.hub import resolve_model
from ggmlpy.ir.types import GGMLType
from ggmlpy.testing.lora import write_lora
from tests.tools.llama_server import llama_server

ADAPTER = dict(rank=8, alpha=16.0, magnitude=3.0, seed=1, dtype=GGMLType.F16)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
SCALES = [None, 0.5, 0.0]   # None: no `lora` field, the server's scale 1.0
N_PREDICT = 16


def write_adapter(directory: Path) -> Path:
    return write_lora(resolve_model("smollm2-135m"), directory / "smollm2-lora.gguf", **ADAPTER)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    server = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        adapter = write_adapter(Path(tmp))
        args = ["-m", str(resolve_model("smollm2-135m")), "--lora", str(adapter), "-t", "2",
                "-c", "1024", "-np", "1"]
        with llama_server(server, args) as call:
            cases = []
            for scale in SCALES:
                for prompt in PROMPTS:
                    tokens = call("POST", "/tokenize", {"content": prompt})[1]["tokens"]
                    body = {"prompt": tokens, "n_predict": N_PREDICT, "temperature": 0, "n_probs": 5,
                            "cache_prompt": False}
                    if scale is not None:
                        body["lora"] = [{"id": 0, "scale": scale}]
                    answer = call("POST", "/completion", body)[1]
                    probs = answer["completion_probabilities"]
                    cases.append({"prompt": tokens, "scale": 1.0 if scale is None else scale,
                                  "tokens": [p["id"] for p in probs],
                                  "top": [[[t["id"], t["logprob"]] for t in p["top_logprobs"]] for p in probs]})
            json.dump({"adapter": ADAPTER | {"dtype": ADAPTER["dtype"].name}, "sha256": sha256(adapter),
                       "cases": cases}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
