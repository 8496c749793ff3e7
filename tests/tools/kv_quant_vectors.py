"""llama.cpp's logits with a quantised KV cache (-ctk/-ctv), for
tests/llama/models/test_kv_quant_llama_cpp.py.

Writes tiny random-weight llama files with ggmlpy.testing.models_archs.write_tiny_model
(seeded, so the same bytes every time; their sha256 goes with the vectors), evaluates PROMPT
with llama-cpp-python's `Llama(path, logits_all=True, type_k=..., type_v=...,
flash_attn=True)` over the llama.cpp that llama-cpp-python 0.3.36 vendors (a quantised V
cache needs flash attention there), and records every position's logits and the greedy
continuation of N_GREEDY tokens. Heads of 32 are not rotated; heads of 64 get llama.cpp's
Hadamard rotation of a quantised cache (llama/kv_types.py); a deepseek2 file's MLA cache (one
K row per token, read as V too) gets none. Not a test and not a dependency;
rerun it in an environment with that package when the reference or the files change:

    PEER/bin/python -m tests.tools.kv_quant_vectors > tests/llama/models/data/llama_cpp_kv_quant.json
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from ggmlpy.testing.models_archs import write_tiny_model
from ggmlpy.testing.models_deepseek2 import DEEPSEEK2_MLA, mla_keys

# ggml type ids, as llama-cpp-python's type_k/type_v take them
TYPE_IDS = {"f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20}
# the tiny files: llama with heads of 32 (no rotation) and of 64 (Hadamard-rotated K and V),
# deepseek2 with MLA (a cached row of 32 + 32 rope dims; V its first 32)
FILES = {"h32": ("llama", {"n_embd": 128, "n_head": 4, "n_head_kv": 2, "n_ff": 192}),
         "h64": ("llama", {"n_embd": 256, "n_head": 4, "n_head_kv": 2, "n_ff": 192}),
         "mla": ("deepseek2", {**DEEPSEEK2_MLA, "n_rot": 32,
                               "extra_keys": {**DEEPSEEK2_MLA["extra_keys"], **mla_keys(rope=32)}})}
# name -> (file, type_k, type_v)
VARIANTS: dict[str, tuple[str, str, str]] = {
    "h32-f16": ("h32", "f16", "f16"),
    "h32-q8_0": ("h32", "q8_0", "q8_0"),
    "h32-q4_0": ("h32", "q4_0", "q4_0"),
    "h32-q4_1": ("h32", "q4_1", "q4_1"),
    "h32-iq4_nl": ("h32", "iq4_nl", "iq4_nl"),
    "h32-q5_0": ("h32", "q5_0", "q5_0"),
    "h32-q5_1": ("h32", "q5_1", "q5_1"),
    "h32-q8_0-f16": ("h32", "q8_0", "f16"),
    "h32-f16-q4_0": ("h32", "f16", "q4_0"),
    "h64-q8_0": ("h64", "q8_0", "q8_0"),
    "h64-q4_0": ("h64", "q4_0", "q4_0"),
    "h64-iq4_nl": ("h64", "iq4_nl", "iq4_nl"),
    "mla-q8_0": ("mla", "q8_0", "q8_0"),
    "mla-q4_0": ("mla", "q4_0", "q4_0"),
}
PROMPT = [5, 17, 200, 33, 41, 9, 8, 7, 100, 64, 3, 250]
N_GREEDY = 8


def write_file(name: str, folder: Path) -> Path:
    arch, settings = FILES[name]
    return write_tiny_model(arch, folder / f"{name}.gguf", **settings)


def vectors(path: Path, type_k: str, type_v: str) -> dict:
    from llama_cpp import Llama

    llm = Llama(str(path), logits_all=True, n_ctx=64, n_batch=64, verbose=False, seed=0, flash_attn=True,
                type_k=TYPE_IDS[type_k], type_v=TYPE_IDS[type_v])
    llm.eval(PROMPT)
    logits = np.array(llm.scores[:len(PROMPT)], dtype=np.float32)
    greedy = []
    for _ in range(N_GREEDY):
        greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([greedy[-1]])
    return {"type_k": type_k, "type_v": type_v, "prompt": PROMPT,
            "logits": np.round(logits.astype(np.float64), 5).tolist(), "greedy": greedy}


def main() -> None:
    out: dict = {"files": {}, "variants": {}}
    with tempfile.TemporaryDirectory() as d:
        paths = {name: write_file(name, Path(d)) for name in FILES}
        out["files"] = {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in paths.items()}
        for name, (file, type_k, type_v) in VARIANTS.items():
            out["variants"][name] = {"file": file, **vectors(paths[file], type_k, type_v)}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
