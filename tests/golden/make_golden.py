"""Regenerate llama.cpp's reference outputs in this folder (tokenize.json, logits.npz,
greedy.json, ppl.json) for each model folder, keeping the inputs the files already hold: the
tokenizer cases' texts and flags, the evaluated token ids, the greedy prompts and the
perplexity text and protocol. Not a test and not a dependency of the project; the tests read
the files it writes.

It needs llama-cpp-python 0.3.36 over a libllama built from the llama.cpp it vendors (see
README.md beside this file), and the model files (`ggmlpy.hub.resolve_model` fetches them):

    PEER/bin/python tests/golden/make_golden.py [smollm2-135m-q4_1 gemma3-270m-q4_k_m]
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from ggmlpy.hub import resolve_model  # noqa: E402

MODELS = {"smollm2-135m-q4_1": "smollm2-135m", "gemma3-270m-q4_k_m": "gemma3-270m"}
TOP = 20           # logits.npz keeps the 20 largest logits per position
GREEDY_STEPS = 32


def load(path: Path, n_ctx: int):
    from llama_cpp import Llama

    return Llama(str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=2,
                 logits_all=True, verbose=False)


def piece(llm, token: int) -> str:
    return llm._model.token_to_piece(token, special=True).hex()


def run(llm, tokens: list[int]) -> np.ndarray:
    """Every position's logits for `tokens` evaluated from an empty cache."""
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


def tokenize(llm, folder: Path) -> None:
    data = json.loads((folder / "tokenize.json").read_text())
    pieces: dict[str, str] = {}
    for case in data["cases"]:
        case["ids"] = llm.tokenize(case["text"].encode("utf-8"), add_bos=case["add_special"],
                                   special=case["parse_special"])
        pieces.update({str(t): piece(llm, t) for t in case["ids"]})
    data["pieces_hex"] = pieces
    (folder / "tokenize.json").write_text(json.dumps(data, indent=1, ensure_ascii=False))


def logits(llm, folder: Path) -> None:
    tokens = [int(t) for t in np.load(folder / "logits.npz")["tokens"]]
    rows = run(llm, tokens).astype(np.float64)
    top_ids = np.argsort(-rows, axis=1, kind="stable")[:, :TOP]
    mx = rows.max(axis=1, keepdims=True)
    lse = (mx + np.log(np.exp(rows - mx).sum(axis=1, keepdims=True)))[:, 0]
    np.savez_compressed(folder / "logits.npz", tokens=np.array(tokens, dtype=np.int32),
                        top_ids=top_ids.astype(np.int32),
                        top_logits=np.take_along_axis(rows, top_ids, axis=1).astype(np.float32),
                        logsumexp=lse.astype(np.float32), last_logits=rows[-1].astype(np.float32))


def greedy(llm, folder: Path) -> None:
    cases = json.loads((folder / "greedy.json").read_text())
    for case in cases:
        ids = llm.tokenize(case["prompt"].encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        out, margins = [], []
        for _ in range(GREEDY_STEPS):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            first, second = np.argsort(-row, kind="stable")[:2]
            out.append(int(first))
            margins.append(float(row[first] - row[second]))
            llm.eval([int(first)])
        case.update(prompt_ids=ids, ids=out, margins=margins,
                    text=llm.detokenize(out).decode("utf-8", errors="replace"),
                    pieces_hex=[piece(llm, t) for t in out])
    (folder / "greedy.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False))


def perplexity(llm, folder: Path, add_bos: bool) -> None:
    spec = json.loads((folder / "ppl.json").read_text())
    n_ctx = spec["n_ctx"]
    text = (folder / spec["text_file"]).read_text(encoding="utf-8")
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    width = n_ctx - (1 if add_bos else 0)
    per_chunk, total_nll, total_n = [], 0.0, 0
    for i in range(spec["chunks"]):
        chunk = tokens[i * width:(i + 1) * width]
        if add_bos:
            chunk = [llm.token_bos()] + chunk
        rows = run(llm, chunk).astype(np.float64)
        nll = 0.0
        for t in range(n_ctx // 2, n_ctx - 1):
            row = rows[t]
            mx = row.max()
            nll += mx + math.log(np.exp(row - mx).sum()) - row[chunk[t + 1]]
        n = n_ctx - 1 - n_ctx // 2
        per_chunk.append(math.exp(nll / n))
        total_nll, total_n = total_nll + nll, total_n + n
    spec.update(ppl=math.exp(total_nll / total_n), ppl_per_chunk=per_chunk)
    (folder / "ppl.json").write_text(json.dumps(spec, indent=1))


def main(names: list[str]) -> None:
    for name in names or list(MODELS):
        folder = HERE / name
        meta = json.loads((folder / "meta.json").read_text())
        path = resolve_model(MODELS[name])
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != meta["model_sha256"]:
            raise SystemExit(f"{path}: sha256 {digest} is not meta.json's {meta['model_sha256']}")
        llm = load(path, n_ctx=512)
        tokenize(llm, folder)
        logits(llm, folder)
        greedy(llm, folder)
        perplexity(load(path, n_ctx=json.loads((folder / "ppl.json").read_text())["n_ctx"]),
                   folder, meta["add_bos"])
        print(f"{name}: written")


if __name__ == "__main__":
    main(sys.argv[1:])
