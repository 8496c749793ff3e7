"""llama.cpp's multi-token-prediction drafts for Gemma 4, for ggmlpy's MTP drafter tests:
tests/llama/speculative/data/mtp_gemma4_tiny.json.

Writes the tiny gemma4 target (`write_tiny_model("gemma4", ...)`, TARGET's settings) and
a tiny "gemma4-assistant" for it (`write_tiny_gemma4_assistant`, ASSISTANT's settings),
starts llama-server (built from the source llama-cpp-python 0.3.36 vendors, outside the
repo) with `-md assistant --spec-type draft-mtp` at debug verbosity, asks a greedy
/completion for each of PROMPTS (a fresh server each) and reads the log back: for every
target decode after the prompt, the pending token (the last sampled one) and its position,
the tokens the assistant drafted with its top-3 candidates at each draft step (p: softmax
over the drafter's 10 best logits, its top-k 10 sampler) and how many of them the target
accepted. Also the final tokens, the server's draft_n / draft_n_accepted, and the same
completion from a server without a drafter (greedy speculation must not change the
tokens). Both files' sha256 go with them, so the test can tell a changed writer from a
wrong answer. The assistant's seed is one whose drafts the target sometimes accepts (a
random drafter rarely agrees: one token in a few hundred drafts, never two in a row), and
each prompt has one such acceptance. Not a test and not a dependency; rerun it when the
reference changes:

    PEER/bin/python -m tests.tools.mtp_vectors /path/to/llama.cpp/build/bin/llama-server \\
        > tests/llama/speculative/data/mtp_gemma4_tiny.json

(PEER: a venv with llama-cpp-python 0.3.36 over that build's libllama, for the replay of
each case's first draft that records the assistant's logits.)
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from ggmlpy.testing.models_archs import write_tiny_model
from ggmlpy.testing.models_gemma4 import write_tiny_gemma4_assistant
from tests.tools.llama_server import llama_server

TARGET: dict[str, Any] = {}   # write_tiny_model("gemma4", path, **TARGET): GEMMA4_DENSE
ASSISTANT: dict[str, Any] = dict(n_layer=2, n_embd=32, n_head=4, n_ff=64, seed=4)
PROMPTS = [[5, 17, 200, 33, 41, 99, 7], [218, 190, 18], [71, 82, 59, 107, 57, 111, 260, 144, 295, 144, 89]]
N_PREDICT = 32
N_MAX = 3
SERVER_ARGS = ["-c", "256", "-np", "1", "-t", "2", "--spec-draft-n-max", str(N_MAX)]

_CANDIDATE = re.compile(rb"draft candidate +(\d+), pos +(\d+): +(-?\d+) \( *([-\d.]+)\)")
_DRAFT = re.compile(rb"generate_draft: id=(\d+), #tokens=(\d+), #draft=(\d+), pos_next=(\d+)")
_PLAIN = re.compile(rb"slot decode token, id=(\d+), n_ctx = \d+, n_tokens = (\d+)")
_MAX = re.compile(rb"max possible draft: (-?\d+)")
_ACCEPTED = re.compile(rb"accepted +(\d+)/ *(\d+) draft tokens, new n_tokens")


def write_files(directory: Path, target: dict[str, Any] | None = None,
                assistant: dict[str, Any] | None = None) -> tuple[Path, Path]:
    t = write_tiny_model("gemma4", directory / "target.gguf", **(TARGET if target is None else target))
    a = write_tiny_gemma4_assistant(directory / "assistant.gguf", t, **(ASSISTANT if assistant is None else assistant))
    return t, a


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_log(log: bytes) -> list[dict[str, Any]]:
    """One entry per target decode after the prompt, in order (the token pieces in the log
    are raw bytes: only the numbers are read)."""
    steps: list[dict[str, Any]] = []
    n_max, cands = None, []
    for line in log.splitlines():
        if m := _MAX.search(line):
            n_max, cands = int(m[1]), []
        elif m := _CANDIDATE.search(line):
            k, i = int(m[1]), int(m[2])
            if k == 0:
                cands.append([])
            assert len(cands) == i + 1, line
            cands[i].append([int(m[3]), float(m[4])])
        elif m := _DRAFT.search(line):
            n_draft = int(m[3])
            steps.append({"pending": int(m[1]), "pos": int(m[4]), "n_draft_max": n_max,
                          "drafted": [c[0][0] for c in cands[:n_draft]], "accepted": None, "candidates": cands})
            assert len(steps[-1]["drafted"]) == n_draft
            n_max, cands = None, []
        elif m := _PLAIN.search(line):
            steps.append({"pending": int(m[1]), "pos": int(m[2]), "n_draft_max": n_max, "drafted": [],
                          "accepted": 0, "candidates": cands})
            n_max, cands = None, []
        elif m := _ACCEPTED.search(line):
            assert steps[-1]["accepted"] is None and int(m[2]) == len(steps[-1]["drafted"]), line
            steps[-1]["accepted"] = int(m[1])
    return steps


def run_mtp(server: str, target: Path, assistant: Path, prompt: list[int], n_predict: int,
            log_path: Path) -> dict[str, Any]:
    args = ["-m", str(target), "-md", str(assistant), "--spec-type", "draft-mtp", "-lv", "5", *SERVER_ARGS]
    with open(log_path, "wb") as log, llama_server(server, args, stderr=log) as call:
        answer = _complete(call, prompt, n_predict)
    steps, tokens = parse_log(log_path.read_bytes()), answer["tokens"]
    for step in steps:   # the drafts the tokens confirm; the log's count where it has one
        i = step["pos"] - len(prompt)   # the pending token's index in tokens
        assert tokens[i] == step["pending"]
        n = next((k for k, d in enumerate(step["drafted"]) if tokens[i + 1 + k] != d), len(step["drafted"]))
        # the server stops before logging the count when the step ends the completion
        assert step["accepted"] in (n, None), step
        step["accepted"] = n
    assert steps[-1]["pos"] + steps[-1]["accepted"] + 2 == len(prompt) + len(tokens)   # + the last sampled
    return {"steps": steps, "tokens": tokens, "draft_n": answer["timings"]["draft_n"],
            "draft_n_accepted": answer["timings"]["draft_n_accepted"]}


def run_plain(server: str, target: Path, prompts: list[list[int]], n_predict: int) -> list[list[int]]:
    with llama_server(server, ["-m", str(target), "-c", "256", "-np", "1", "-t", "2"]) as call:
        return [_complete(call, prompt, n_predict)["tokens"] for prompt in prompts]


def replay_first_draft(target: Path, assistant: Path, prompt: list[int], n_max: int) -> dict[str, Any]:
    """The first draft after the prompt through libllama (llama-cpp-python's ctypes, over
    the same build as the server), as common/speculative.cpp's draft-mtp does it for a
    Gemma 4 assistant: the target decodes the prompt with its h_nextn rows (the hidden state
    after output_norm) kept; the pending token is the argmax of its last row; the assistant
    (an MTP context over the target's) then takes (pending, h of the last prompt row) at
    position len(prompt), and each further step its own last draft with its own h_nextn,
    at that same position. Every step's assistant logits, for the argmax drafts the server
    logged and for the numbers themselves."""
    import ctypes

    import llama_cpp as lib
    import numpy as np

    # src/llama-ext.h's staging API is C++: its symbols are mangled
    set_nextn = getattr(lib.llama_cpp._lib, "_Z26llama_set_embeddings_nextnP13llama_contextbb")
    set_nextn.argtypes, set_nextn.restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
    get_nextn = getattr(lib.llama_cpp._lib, "_Z30llama_get_embeddings_nextn_ithP13llama_contexti")
    get_nextn.argtypes, get_nextn.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)

    def load(path: Path) -> Any:
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = 0
        return lib.llama_model_load_from_file(str(path).encode(), mp)

    def decode(ctx: Any, rows: list[tuple[int, int, np.ndarray | None]]) -> None:
        batch = lib.llama_batch_ext_init(ctx)
        for i, (tok, pos, h) in enumerate(rows):
            assert lib.llama_batch_ext_add_token(batch, 0, tok) == i
            assert lib.llama_batch_ext_set_pos(batch, i, (ctypes.c_int32 * 1)(pos))
            if h is not None:
                assert lib.llama_batch_ext_set_embd_token(batch, i, lib.llama_embd(
                    h.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, h.size))
            lib.llama_batch_ext_set_output_logits(batch, i, i == len(rows) - 1)
        assert lib.llama_process(ctx, lib.LLAMA_PROCESS_TYPE_DECODE, batch) == 0
        lib.llama_batch_ext_free(batch)

    def row(ptr: Any, n: int) -> np.ndarray:
        return np.ctypeslib.as_array(ptr, shape=(n,)).copy()

    lib.llama_backend_init()
    m_tgt, m_dft = load(target), load(assistant)
    n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(m_tgt))
    n_h = lib.llama_model_n_embd(m_tgt)
    cp = lib.llama_context_default_params()
    cp.n_ctx, cp.n_seq_max, cp.n_threads, cp.n_threads_batch = 256, 1, 2, 2
    ctx_tgt = lib.llama_init_from_model(m_tgt, cp)
    set_nextn(ctx_tgt, True, False)
    cp.ctx_type, cp.ctx_other = lib.LLAMA_CONTEXT_TYPE_MTP, ctx_tgt
    ctx_dft = lib.llama_init_from_model(m_dft, cp)
    set_nextn(ctx_dft, True, True)
    decode(ctx_tgt, [(tok, pos, None) for pos, tok in enumerate(prompt)])
    pending = int(np.argmax(row(lib.llama_get_logits_ith(ctx_tgt, -1), n_vocab)))
    h = row(get_nextn(ctx_tgt, len(prompt) - 1), n_h)
    tok, logits, drafted = pending, [], []
    for _ in range(n_max):
        decode(ctx_dft, [(tok, len(prompt), h)])
        step = row(lib.llama_get_logits_ith(ctx_dft, -1), n_vocab)
        h = row(get_nextn(ctx_dft, 0), n_h)
        tok = int(np.argmax(step))
        logits.append(np.round(step, 6).tolist())
        drafted.append(tok)
    lib.llama_free(ctx_dft)
    lib.llama_free(ctx_tgt)
    lib.llama_model_free(m_dft)
    lib.llama_model_free(m_tgt)
    return {"pending": pending, "pos": len(prompt), "drafted": drafted, "logits": logits}


def _complete(call: Any, prompt: list[int], n_predict: int) -> dict[str, Any]:
    status, answer = call("POST", "/completion", {
        "prompt": prompt, "n_predict": n_predict, "temperature": 0, "top_k": 1, "return_tokens": True,
        "cache_prompt": False})
    assert status == 200, answer
    return answer


def main() -> None:
    server = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        target, assistant = write_files(Path(tmp))
        plain = run_plain(server, target, PROMPTS, N_PREDICT)
        cases = []
        for prompt, no_spec in zip(PROMPTS, plain):
            mtp = run_mtp(server, target, assistant, prompt, N_PREDICT, Path(tmp) / "server.log")
            assert mtp["tokens"] == no_spec, "greedy speculation changed the tokens"
            assert mtp["draft_n"] == sum(len(s["drafted"]) for s in mtp["steps"])
            assert mtp["draft_n_accepted"] == sum(s["accepted"] for s in mtp["steps"])
            first = replay_first_draft(target, assistant, prompt, N_MAX)
            assert {k: first[k] for k in ("pending", "pos", "drafted")} == \
                {k: mtp["steps"][0][k] for k in ("pending", "pos", "drafted")}, (first["drafted"], mtp["steps"][0])
            cases.append({"prompt": prompt, **mtp, "tokens_no_spec": no_spec, "first_draft_logits": first["logits"]})
        out = {
            "reference": "llama-server of llama.cpp as vendored by llama-cpp-python 0.3.36",
            "server_args": ["-m", "target.gguf", "-md", "assistant.gguf", "--spec-type", "draft-mtp", "-lv", "5",
                            *SERVER_ARGS],
            "request": {"n_predict": N_PREDICT, "temperature": 0, "top_k": 1, "cache_prompt": False},
            "target": {"writer": "ggmlpy.testing.models_archs.write_tiny_model", "arch": "gemma4",
                       "settings": TARGET, "sha256": sha256(target)},
            "assistant": {"writer": "ggmlpy.testing.models_gemma4.write_tiny_gemma4_assistant",
                          "settings": ASSISTANT, "sha256": sha256(assistant)},
            "n_max": N_MAX, "n_predict": N_PREDICT, "cases": cases,
        }
    sys.stdout.write(dumps(out))


def dumps(out: dict[str, Any]) -> str:
    """JSON with one line per key, per case key and per step."""
    def obj(d: dict[str, Any], indent: str, inner: Any) -> str:
        items = [f"{indent} {json.dumps(k)}: {inner(k, v, indent + ' ')}" for k, v in d.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"

    def case_value(k: str, v: Any, indent: str) -> str:
        if k != "steps":
            return json.dumps(v)
        return "[\n" + ",\n".join(f"{indent} {json.dumps(step)}" for step in v) + f"\n{indent}]"

    def top_value(k: str, v: Any, indent: str) -> str:
        if k != "cases":
            return json.dumps(v)
        return "[\n" + ",\n".join(indent + " " + obj(c, indent + " ", case_value) for c in v) + f"\n{indent}]"
    return obj(out, "", top_value) + "\n"


if __name__ == "__main__":
    main()
