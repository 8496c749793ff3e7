"""llama.cpp's answers to the sequence operations on a hybrid model's memory, for
tests/llama/models/test_hybrid_memory.py: the tiny qwen35 file of tests/tools/arch_vectors.py
in a context of 3 sequences; two sequences decoded, then OPS applied one after the other,
recording each one's return value (seq_rm's bool) and every sequence's first and last
position after it; finally one token decoded in sequence 2 (a copy of sequence 0) and its
logits. Not a test and not a dependency; rerun with llama-cpp-python 0.3.36:

    PEER/bin/python -m tests.tools.recurrent_vectors > tests/llama/models/data/llama_cpp_recurrent.json
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from ggmlpy.testing.models_archs import write_tiny_model

N_SEQ = 3
PROMPTS = {0: [5, 17, 200, 33, 41], 1: [9, 8, 7]}
# (operation, arguments): seq_rm returns a bool, the others nothing
OPS = [
    ("seq_rm", (0, 2, -1)),     # inside the state: refused
    ("seq_rm", (0, 5, -1)),     # after the last position: nothing to remove, accepted
    ("seq_rm", (0, 0, 3)),      # before the last position: accepted, nothing removed
    ("seq_rm", (0, 1, 5)),      # a range that holds the last position but starts after 0: refused
    ("seq_cp", (0, 2, -1, -1)),  # (llama.cpp's KV cache asserts on a partial copy with several streams)
    ("seq_rm", (-1, 1, 5)),     # every sequence, part of the range: refused
    ("seq_rm", (1, -1, -1)),
    ("seq_cp", (0, 1, -1, -1)),
    ("seq_keep", (2,)),
]
# seq_add and seq_div abort in llama.cpp with multi-section RoPE (n_pos_per_embd 4): not here
NEXT_TOKEN = 100


def _decode(lib, ctx, tokens: list[int], seq: int, pos0: int) -> None:
    batch = lib.llama_batch_init(len(tokens), 0, 1)
    batch.n_tokens = len(tokens)
    for i, tok in enumerate(tokens):
        batch.token[i] = tok
        batch.pos[i] = pos0 + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = i == len(tokens) - 1
    assert lib.llama_decode(ctx, batch) == 0
    lib.llama_batch_free(batch)


def main() -> None:
    import llama_cpp as lib

    with tempfile.TemporaryDirectory() as d:
        path = write_tiny_model("qwen35", Path(d) / "qwen35-f32.gguf")
        model = lib.llama_model_load_from_file(str(path).encode(), lib.llama_model_default_params())
        cp = lib.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 64, 64, 64, N_SEQ
        cp.kv_unified = True   # one KV stream for all sequences, as ggmlpy's cache
        ctx = lib.llama_init_from_model(model, cp)
        mem = lib.llama_get_memory(ctx)
        for seq, tokens in PROMPTS.items():
            _decode(lib, ctx, tokens, seq, 0)
        steps = []
        for op, args in OPS:
            ret = getattr(lib, f"llama_memory_{op}")(mem, *args)
            steps.append({"op": op, "args": list(args), "ret": bool(ret) if op == "seq_rm" else None,
                          "pos": [[lib.llama_memory_seq_pos_min(mem, s), lib.llama_memory_seq_pos_max(mem, s)]
                                  for s in range(N_SEQ)]})
        pos = lib.llama_memory_seq_pos_max(mem, 2) + 1
        _decode(lib, ctx, [NEXT_TOKEN], 2, pos)
        n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
        logits = np.ctypeslib.as_array(ctypes.cast(lib.llama_get_logits_ith(ctx, -1),
                                                   ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
        out = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "prompts": PROMPTS, "steps": steps,
               "next_token": NEXT_TOKEN, "next_pos": pos, "logits": np.round(logits, 6).tolist()}
        lib.llama_free(ctx)
        lib.llama_model_free(model)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
