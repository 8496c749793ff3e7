"""Sampler picks from llama.cpp's own library, for tests/test_sampling_llama_cpp.py's vectors.

Loads libllama (built from the source llama-cpp-python 0.3.36 vendors, outside the repo)
through ctypes and runs llama_sampler_init_temp + llama_sampler_init_mirostat(_v2), and
top-n-sigma / xtc in front of temp + dist, over the rows the test builds (`int_row` or
`zipf_row`, rolled by the step index so that each step sees other logits): the token ids
picked, per case. Not a test and not a dependency; rerun it when the reference changes:

    python tests/tools/sampler_vectors.py /path/to/llama.cpp/build/bin/libllama.so
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
    """tests/test_sampling.py's int_row: distinct logits from integer arithmetic only."""
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


if __name__ == "__main__":
    main()
