"""Sampler picks from llama.cpp's own library, for tests/llama/sampling/test_sampling_llama_cpp.py's vectors.

Loads libllama (built from the source llama-cpp-python 0.3.36 vendors, outside the repo)
through ctypes and runs llama_sampler_init_temp + llama_sampler_init_mirostat(_v2), and
top-n-sigma / xtc in front of temp + dist, over the rows the test builds (`int_row` or
`zipf_row`, rolled by the step index so that each step sees other logits): the token ids
picked, per case. DRY: the logits it changed after a history of tokens, without breakers,
and (given SmolLM2's file, whose vocabulary llama.cpp loads) with breaker strings over a
tokenised text. Not a test and not a dependency; rerun it when the reference changes:

    python tests/tools/sampler_vectors.py /path/to/llama.cpp/build/bin/libllama.so [model.gguf]
"""
from __future__ import annotations

import ctypes
import json
import sys

import numpy as np

# (version, n_vocab, seed, tau, eta, temp, steps); then the same over zipf_row, where mirostat
# 1.0's estimate of the exponent holds and its k moves well above 1
CASES = [
    (1, 1000, 42, 5.0, 0.1, 1.0, 24),
    (1, 49152, 1234, 6.0, 0.3, 1.2, 24),
    (1, 262144, 7, 8.0, 0.1, 1.5, 8),
    (1, 50, 3, 2.0, 0.5, 1.0, 24),      # fewer candidates than m = 100
    (1, 2, 11, 0.5, 1.0, 1.0, 16),      # the smallest vocabulary that draws
    (2, 1000, 42, 5.0, 0.1, 1.0, 24),
    (2, 49152, 1234, 6.0, 0.3, 1.2, 24),
    (2, 262144, 7, 8.0, 0.1, 1.5, 8),
    (2, 50, 3, 2.0, 0.5, 1.0, 24),
    (2, 2, 11, 0.5, 1.0, 1.0, 16),
]


ZIPF_CASES = [
    (1, 49152, 99, 5.0, 0.1, 1.0, 24),
    (1, 1000, 5, 3.0, 0.2, 0.9, 24),
    (2, 49152, 99, 5.0, 0.1, 1.0, 24),
]


def int_row(n: int) -> np.ndarray:
    """tests/llama/sampling/test_sampling.py's int_row: distinct logits from integer arithmetic only."""
    i = np.arange(n, dtype=np.int64)
    return (((i * 2654435761) % 2**24 - 2**23) / 2**20).astype(np.float32)


def zipf_row(n: int) -> np.ndarray:
    """Logits -1.1 ln(rank), the ranks spread over the ids in int_row's order."""
    row = np.zeros(n, np.float32)
    row[np.argsort(int_row(n), kind="stable")[::-1]] = (-1.1 * np.log(np.arange(1, n + 1))).astype(np.float32)
    return row


class TokenData(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int32), ("logit", ctypes.c_float), ("p", ctypes.c_float)]


class TokenDataArray(ctypes.Structure):
    _fields_ = [("data", ctypes.POINTER(TokenData)), ("size", ctypes.c_size_t),
                ("selected", ctypes.c_int64), ("sorted", ctypes.c_bool)]


def run_chain(lib, chain: list, row: np.ndarray, steps: int) -> list[int]:
    """The id each step's chain picks over `row` rolled by 37 * step; frees the samplers."""
    out = []
    for step in range(steps):
        logits = np.roll(row, 37 * step)
        data = (TokenData * len(row))(*[TokenData(i, float(v), 0.0) for i, v in enumerate(logits)])
        cur = TokenDataArray(data, len(row), -1, False)
        for smpl in chain:
            lib.llama_sampler_apply(smpl, ctypes.byref(cur))
        out.append(int(cur.data[cur.selected].id))
    for smpl in chain:
        lib.llama_sampler_free(smpl)
    return out


def picks(lib, version: int, n_vocab: int, seed: int, tau: float, eta: float, temp: float,
          steps: int, make_row=int_row) -> list[int]:
    if version == 1:
        miro = lib.llama_sampler_init_mirostat(n_vocab, seed, ctypes.c_float(tau), ctypes.c_float(eta), 100)
    else:
        miro = lib.llama_sampler_init_mirostat_v2(seed, ctypes.c_float(tau), ctypes.c_float(eta))
    return run_chain(lib, [lib.llama_sampler_init_temp(ctypes.c_float(temp)), miro], make_row(n_vocab), steps)


# (sampler, n_vocab, seed, param_a, param_b, temp, steps) over zipf_row: top-n-sigma (n, -),
# xtc (probability, threshold; min_keep 1), each followed by temp and dist
FILTER_CASES = [
    ("top-n-sigma", 1000, 42, 1.0, 0.0, 1.0, 16),
    ("top-n-sigma", 49152, 9, 2.5, 0.0, 0.7, 16),
    ("xtc", 1000, 42, 0.5, 0.1, 1.0, 24),
    ("xtc", 49152, 9, 0.9, 0.05, 1.0, 24),
]


def filter_picks(lib, kind: str, n_vocab: int, seed: int, a: float, b: float, temp: float,
                 steps: int) -> list[int]:
    first = (lib.llama_sampler_init_top_n_sigma(ctypes.c_float(a)) if kind == "top-n-sigma" else
             lib.llama_sampler_init_xtc(ctypes.c_float(a), ctypes.c_float(b), 1, seed))
    chain = [first, lib.llama_sampler_init_temp(ctypes.c_float(temp)), lib.llama_sampler_init_dist(seed)]
    return run_chain(lib, chain, zipf_row(n_vocab), steps)


# DRY over int_row: (n_vocab, multiplier, base, allowed_length, penalty_last_n, history seed,
# history length, alphabet) with no breakers; then DRY_VOCAB_CASES with SmolLM2's vocabulary
# and breaker strings, over a tokenised text (needs the model file as a second argument)
DRY_CASES = [
    (1000, 0.8, 1.75, 2, 64, 1, 60, 6),
    (1000, 1.5, 2.0, 2, 32, 2, 80, 4),
    (1000, 0.8, 1.75, 2, 1000, 3, 300, 3),
    (1000, 0.8, 1.75, 2, 400, 0, 300, 3),    # one period repeated: the exponent is clamped
    (1000, 1.0, 2.0, 1, 400, 0, 200, 7),
    (1000, 0.5, 1.0, 0, 16, 4, 40, 5),       # base 1: no clamp, allowed length 0
    (1000, 0.8, 1.75, 4, 64, 5, 50, 50),     # few repeats
]
DRY_TEXT = ("User: what is the weather like today?\nBot: it is *sunny* and warm: 25 degrees.\n"
            "User: what is the weather like today?\nBot: it is *sunny* and warm: 25 degrees.\n"
            "User: what is the weather like tomorrow?\nBot: it is *sunny* and warm: 25 degrees.\n"
            "User: what is the weather like")
DRY_VOCAB_CASES = [
    (0.8, 1.75, 2, 64, ["\n", ":", "\"", "*"]),
    (0.8, 1.75, 2, 200, ["\n", ":", "\"", "*"]),
    (1.0, 1.5, 1, 200, ["User:", "weather like"]),   # breakers that span tokens
    (0.8, 1.75, 2, 200, ["is the"]),
]


def dry_history(seed: int, length: int, alphabet: int) -> list[int]:
    """Tokens in [0, alphabet) with copies of earlier stretches (the repetitions DRY sees);
    seed 0: 0, 1, ..., alphabet - 1 over and over."""
    if seed == 0:
        return [i % alphabet for i in range(length)]
    rng = np.random.default_rng(seed)
    out = [int(t) for t in rng.integers(0, alphabet, 4)]
    while len(out) < length:
        if rng.random() < 0.5:
            start = int(rng.integers(0, len(out)))
            out += out[start:start + int(rng.integers(1, 8))]
        else:
            out.append(int(rng.integers(0, alphabet)))
    return out[:length]


def dry_logits(lib, vocab, row: np.ndarray, history: list[int], mult: float, base: float,
               allowed: int, last_n: int, breakers: list[str] | None) -> list[list]:
    """[id, logit] of every candidate DRY changed, after accepting `history`."""
    arr = (ctypes.c_char_p * len(breakers))(*[b.encode() for b in breakers]) if breakers else None
    smpl = lib.llama_sampler_init_dry(vocab, ctypes.c_float(mult), ctypes.c_float(base), allowed,
                                      last_n, arr, len(breakers or []))
    for t in history:
        lib.llama_sampler_accept(smpl, t)
    data = (TokenData * len(row))(*[TokenData(i, float(v), 0.0) for i, v in enumerate(row)])
    cur = TokenDataArray(data, len(row), -1, False)
    lib.llama_sampler_apply(smpl, ctypes.byref(cur))
    lib.llama_sampler_free(smpl)
    return [[int(cur.data[i].id), float(cur.data[i].logit)] for i in range(len(row))
            if np.float32(cur.data[i].logit) != row[cur.data[i].id]]


class ModelParams(ctypes.Structure):   # include/llama.h's llama_model_params
    _fields_ = [("devices", ctypes.c_void_p), ("tensor_buft_overrides", ctypes.c_void_p),
                ("n_gpu_layers", ctypes.c_int32), ("split_mode", ctypes.c_int32),
                ("load_mode", ctypes.c_int32), ("lazy_mode", ctypes.c_int32),
                ("main_gpu", ctypes.c_int32), ("tensor_split", ctypes.c_void_p),
                ("progress_callback", ctypes.c_void_p), ("progress_callback_user_data", ctypes.c_void_p),
                ("kv_overrides", ctypes.c_void_p), ("vocab_only", ctypes.c_bool),
                ("check_tensors", ctypes.c_bool), ("use_extra_bufts", ctypes.c_bool),
                ("no_host", ctypes.c_bool), ("no_alloc", ctypes.c_bool), ("load_mtp", ctypes.c_bool)]


def load_vocab(lib, path: str):
    lib.llama_model_default_params.restype = ModelParams
    lib.llama_model_load_from_file.restype = ctypes.c_void_p
    lib.llama_model_load_from_file.argtypes = [ctypes.c_char_p, ModelParams]
    lib.llama_model_get_vocab.restype = ctypes.c_void_p
    lib.llama_model_get_vocab.argtypes = [ctypes.c_void_p]
    lib.llama_vocab_n_tokens.argtypes = [ctypes.c_void_p]
    lib.llama_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                                   ctypes.POINTER(ctypes.c_int32), ctypes.c_int32, ctypes.c_bool,
                                   ctypes.c_bool]
    lib.llama_backend_init()
    params = lib.llama_model_default_params()
    params.vocab_only = True
    model = lib.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    return lib.llama_model_get_vocab(model)


def tokenize(lib, vocab, text: str) -> list[int]:
    raw = text.encode()
    out = (ctypes.c_int32 * (len(raw) + 8))()
    n = lib.llama_tokenize(vocab, raw, len(raw), out, len(out), False, False)
    return list(out[:n])


def main() -> None:
    lib = ctypes.CDLL(sys.argv[1])
    lib.llama_sampler_init_temp.restype = ctypes.c_void_p
    lib.llama_sampler_init_temp.argtypes = [ctypes.c_float]
    lib.llama_sampler_init_mirostat.restype = ctypes.c_void_p
    lib.llama_sampler_init_mirostat.argtypes = [ctypes.c_int32, ctypes.c_uint32, ctypes.c_float,
                                                ctypes.c_float, ctypes.c_int32]
    lib.llama_sampler_init_mirostat_v2.restype = ctypes.c_void_p
    lib.llama_sampler_init_mirostat_v2.argtypes = [ctypes.c_uint32, ctypes.c_float, ctypes.c_float]
    lib.llama_sampler_apply.argtypes = [ctypes.c_void_p, ctypes.POINTER(TokenDataArray)]
    lib.llama_sampler_init_top_n_sigma.restype = ctypes.c_void_p
    lib.llama_sampler_init_top_n_sigma.argtypes = [ctypes.c_float]
    lib.llama_sampler_init_xtc.restype = ctypes.c_void_p
    lib.llama_sampler_init_xtc.argtypes = [ctypes.c_float, ctypes.c_float, ctypes.c_size_t, ctypes.c_uint32]
    lib.llama_sampler_init_dist.restype = ctypes.c_void_p
    lib.llama_sampler_init_dist.argtypes = [ctypes.c_uint32]
    lib.llama_sampler_free.argtypes = [ctypes.c_void_p]
    for case in CASES:
        print(json.dumps({"case": case, "picks": picks(lib, *case)}))
    for case in ZIPF_CASES:
        print(json.dumps({"zipf_case": case, "picks": picks(lib, *case, make_row=zipf_row)}))
    for case in FILTER_CASES:
        print(json.dumps({"filter_case": case, "picks": filter_picks(lib, *case)}))
    lib.llama_sampler_init_dry.restype = ctypes.c_void_p
    lib.llama_sampler_init_dry.argtypes = [ctypes.c_void_p, ctypes.c_float, ctypes.c_float,
                                           ctypes.c_int32, ctypes.c_int32,
                                           ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]
    lib.llama_sampler_accept.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    for n_vocab, mult, base, allowed, last_n, seed, length, alphabet in DRY_CASES:
        history = dry_history(seed, length, alphabet)
        changed = dry_logits(lib, None, int_row(n_vocab), history, mult, base, allowed, last_n, None)
        print(json.dumps({"dry_case": [n_vocab, mult, base, allowed, last_n], "history": history,
                          "changed": changed}))
    if len(sys.argv) > 2:   # the vocabulary's breakers: SmolLM2's file
        vocab = load_vocab(lib, sys.argv[2])
        history = tokenize(lib, vocab, DRY_TEXT)
        row = int_row(lib.llama_vocab_n_tokens(vocab))
        for mult, base, allowed, last_n, breakers in DRY_VOCAB_CASES:
            changed = dry_logits(lib, vocab, row, history, mult, base, allowed, last_n, breakers)
            print(json.dumps({"dry_vocab_case": [mult, base, allowed, last_n, breakers],
                              "history": history, "changed": changed}))


if __name__ == "__main__":
    main()
