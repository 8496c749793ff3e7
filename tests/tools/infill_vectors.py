"""llama-server's /infill answers on the tiny FIM model, for tests/llama/server/test_infill.py.

Writes the test's model (ggmlpy.testing.models.write_tiny_llama(fim=True), seeded), starts
llama-server (built from the source llama-cpp-python 0.3.36 vendors, outside the repo) on it
with the test's batch and context sizes, once plain and once with --spm-infill, and prints
for each case the prompt llama-server built (its `prompt`, special tokens shown), the count
of prompt tokens and the greedy tokens. Not a test and not a dependency; rerun it when the
reference changes, into the test's vectors:

    python -m tests.tools.infill_vectors /path/to/llama.cpp/build/bin/llama-server \\
        > tests/llama/server/data/infill_llama_cpp.json
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from ggmlpy.testing.models import write_tiny_llama
from tests.tools.llama_server import llama_server

N_CTX, N_BATCH, N_PREDICT = 1024, 64, 6
CASES = [
    {"input_prefix": "the then in", "input_suffix": " er the", "prompt": "he"},
    {"input_prefix": "x" * 200, "input_suffix": "y" * 100,
     "input_extra": [{"filename": "a.py", "text": "in the er"}, {"text": "the"}]},
    {"input_prefix": ["the", 5, " in"], "input_suffix": "", "prompt": ""},
]


def write_model(directory: Path) -> Path:
    return write_tiny_llama(directory / "tiny-fim.gguf", fim=True, n_ctx_train=N_CTX)


def answers(server: str, model: Path, spm: bool) -> list[dict]:
    args = ["-m", str(model), "-t", "2", "-c", str(N_CTX), "-np", "1", "-b", str(N_BATCH), "-ub",
            str(N_BATCH)] + (["--spm-infill"] if spm else [])
    with llama_server(server, args) as call:
        out = []
        for case in CASES:
            r = call("POST", "/infill", {**case, "n_predict": N_PREDICT, "temperature": 0,
                                         "return_tokens": True, "cache_prompt": False})[1]
            out.append({"prompt": r["prompt"], "tokens_evaluated": r["tokens_evaluated"],
                        "tokens": r["tokens"]})
        return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(Path(tmp))
        print(json.dumps({"psm": answers(sys.argv[1], model, False),
                          "spm": answers(sys.argv[1], model, True)}, indent=1))


if __name__ == "__main__":
    main()
