"""The larger benchmark files, made with llama.cpp's `llama-quantize` (built outside the repo,
next to llama-bench: `cmake --build build --target llama-quantize`):

- `synthetic-7b-q4_k_m.gguf`: Qwen2.5-7B's layer shapes (28 layers, 3584 wide, FFN 18944,
  28 query and 4 key/value heads, biases on q/k/v) with Qwen2.5-Coder-1.5B's tokenizer and
  vocabulary (151936 rows), random weights written as F16 and quantised to Q4_K_M. Speed
  does not depend on the values, so one random matrix per shape is shared by every layer
  (each layer still has its own bytes in the file): the F16 file (15 GB on disk) is
  written from about 1.5 GB of memory.
- `qwen2.5-coder-1.5b-q2_k.gguf` and `-q3_k_m.gguf`: the 1.5B Q4_K_M file (the known model
  `qwen2.5-coder-1.5b`) re-quantised by `llama-quantize --allow-requantize` (its widths,
  1536 and 8960, take 256-blocks).

    python bench/make_bench_models.py --llama-quantize PATH [--out DIR] [--only 7b|q2k|q3km]

Prints the paths as JSON; existing files are kept. `bench/bench_vs_llama.py -m PATH` then
measures them next to llama-bench.
"""
from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import numpy as np

from ggmlpy.gguf import GGUFFile, GGUFWriter
from ggmlpy.hub import resolve_model

# Qwen2.5-7B's shapes (its config.json)
N_LAYER, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, HEAD_DIM = 28, 3584, 18944, 28, 4, 128
SHAPE_KEYS = {"block_count": N_LAYER, "embedding_length": N_EMBD, "feed_forward_length": N_FF,
              "attention.head_count": N_HEAD, "attention.head_count_kv": N_HEAD_KV}


def synthetic_7b_f16(path: Path, seed: int = 0) -> Path:
    """The F16 file: the 1.5B file's metadata (tokenizer, rope, norms) with 7B shapes."""
    rng = np.random.default_rng(seed)
    with GGUFFile(resolve_model("qwen2.5-coder-1.5b")) as src:
        arch = src.get("general.architecture")
        w = GGUFWriter(version=src.version)
        for key, field in src.fields.items():
            short = key.removeprefix(f"{arch}.")
            value = SHAPE_KEYS.get(short, field.value)
            if key == "general.name":
                value = "synthetic Qwen2.5-7B shapes"
            if key != "general.file_type" and not key.startswith("split."):
                w.add_key_value(key, value, field.type, field.element_type)
        n_vocab = len(src.get("tokenizer.ggml.tokens"))

    def matrix(n_in: int, n_out: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in), dtype=np.float32) / np.sqrt(n_in)).astype(np.float16)

    def vector(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    kv = N_HEAD_KV * HEAD_DIM
    shared = {"embd": matrix(N_EMBD, n_vocab), "q": matrix(N_EMBD, N_EMBD), "kv": matrix(N_EMBD, kv),
              "o": matrix(N_EMBD, N_EMBD), "up": matrix(N_EMBD, N_FF), "down": matrix(N_FF, N_EMBD)}
    w.add_tensor("token_embd.weight", shared["embd"])
    w.add_tensor("output_norm.weight", vector(N_EMBD))
    w.add_tensor("output.weight", shared["embd"])
    for il in range(N_LAYER):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", vector(N_EMBD))
        for name, n in (("attn_q", N_EMBD), ("attn_k", kv), ("attn_v", kv)):
            w.add_tensor(p + name + ".weight", shared["q"] if n == N_EMBD else shared["kv"])
            w.add_tensor(p + name + ".bias", (0.1 * rng.standard_normal(n)).astype(np.float32))
        w.add_tensor(p + "attn_output.weight", shared["o"])
        w.add_tensor(p + "ffn_norm.weight", vector(N_EMBD))
        w.add_tensor(p + "ffn_gate.weight", shared["up"])
        w.add_tensor(p + "ffn_up.weight", shared["up"])
        w.add_tensor(p + "ffn_down.weight", shared["down"])
    return w.write(path)


def quantize(binary: str, src: Path, dst: Path, ftype: str, requantize: bool = False) -> Path:
    args = [binary] + (["--allow-requantize"] if requantize else []) + [str(src), str(dst), ftype, "2"]
    subprocess.run(args, check=True, capture_output=True, text=True)
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-quantize", required=True, help="path of llama.cpp's llama-quantize")
    ap.add_argument("--out", default=str(Path.home() / ".cache" / "ggmlpy" / "bench-models"))
    ap.add_argument("--only", choices=["7b", "q2k", "q3km"], action="append")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = a.only or ["7b", "q2k", "q3km"]
    made = {}
    if "7b" in wanted:
        dst = out / "synthetic-7b-q4_k_m.gguf"
        if not dst.exists():
            f16 = synthetic_7b_f16(out / "synthetic-7b-f16.gguf")
            quantize(a.llama_quantize, f16, dst, "Q4_K_M")
            f16.unlink()
        made["7b"] = str(dst)
    base = resolve_model("qwen2.5-coder-1.5b")
    for key, ftype in (("q2k", "Q2_K"), ("q3km", "Q3_K_M")):
        if key in wanted:
            dst = out / f"qwen2.5-coder-1.5b-{ftype.lower()}.gguf"
            if not dst.exists():
                quantize(a.llama_quantize, base, dst, ftype, requantize=True)
            made[key] = str(dst)
    print(json.dumps(made, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
