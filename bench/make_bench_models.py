"""The larger benchmark files, made with llama.cpp's `llama-quantize` (built outside the repo,
next to llama-bench: `cmake --build build --target llama-quantize`):

- `synthetic-7b-q4_k_m.gguf` and `synthetic-0.5b-q4_k_m.gguf`: Qwen2.5-7B's and
  Qwen2.5-0.5B's layer shapes (7B: 28 layers, 3584 wide, FFN 18944, 28 query and 4
  key/value heads; 0.5B: 24 layers, 896 wide, FFN 4864, 14 and 2 heads, the output tied to
  the embedding; both with biases on q/k/v) with Qwen2.5-Coder-1.5B's tokenizer and
  vocabulary (151936 rows), random weights written as F16 and quantised to Q4_K_M (the
  0.5B's width is no multiple of 256, so llama-quantize gives its 896-wide rows 32-block
  types, as in the published file). Speed does not depend on the values, so one random
  matrix per shape is shared by every layer (each layer still has its own bytes in the
  file): the 7B's F16 file (15 GB on disk) is written from about 1.5 GB of memory.
- `qwen2.5-coder-1.5b-q2_k.gguf` and `-q3_k_m.gguf`: the 1.5B Q4_K_M file (the known model
  `qwen2.5-coder-1.5b`) re-quantised by `llama-quantize --allow-requantize` (its widths,
  1536 and 8960, take 256-blocks).

    python bench/make_bench_models.py --llama-quantize PATH [--out DIR] [--only 7b|0.5b|q2k|q3km]

Prints the paths as JSON; existing files are kept. `bench/bench_vs_llama.py -m PATH` then
measures them next to llama-bench.
"""
from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggmlpy.gguf import GGUFFile, GGUFWriter
from ggmlpy.hub import resolve_model

@dataclass(frozen=True)
class Shapes:
    """A Qwen2.5 model's shapes (its config.json); head size 128 (7B) or 64 (0.5B)."""
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    tied: bool

    @property
    def keys(self) -> dict[str, int]:
        return {"block_count": self.n_layer, "embedding_length": self.n_embd, "feed_forward_length": self.n_ff,
                "attention.head_count": self.n_head, "attention.head_count_kv": self.n_head_kv}


SYNTHETIC = {"7b": Shapes(28, 3584, 18944, 28, 4, tied=False), "0.5b": Shapes(24, 896, 4864, 14, 2, tied=True)}


@dataclass
class RandomF16:
    """Random weights for the synthetic files (speed does not depend on the values):
    matrices [n_out, n_in] (a stack of them with `stack`) scaled by 1 / sqrt(n_in) so that
    activations stay O(1), as F16; norm weights 1 + noise, as F32."""

    rng: np.random.Generator

    def matrix(self, n_in: int, n_out: int, stack: int = 0) -> np.ndarray:
        shape = (stack, n_out, n_in) if stack else (n_out, n_in)
        return (self.rng.standard_normal(shape, dtype=np.float32) / np.sqrt(n_in)).astype(np.float16)

    def vector(self, n: int) -> np.ndarray:
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)


def synthetic_f16(path: Path, shapes: Shapes, seed: int = 0) -> Path:
    """The F16 file: the 1.5B file's metadata (tokenizer, rope, norms) with other shapes."""
    rng = np.random.default_rng(seed)
    n_embd, n_ff = shapes.n_embd, shapes.n_ff
    with GGUFFile(resolve_model("qwen2.5-coder-1.5b")) as src:
        arch = src.get("general.architecture")
        w = GGUFWriter(version=src.version)
        for key, field in src.fields.items():
            short = key.removeprefix(f"{arch}.")
            value = shapes.keys.get(short, field.value)
            if key == "general.name":
                value = f"synthetic Qwen2.5 shapes ({shapes.n_layer} x {n_embd})"
            if key != "general.file_type" and not key.startswith("split."):
                w.add_key_value(key, value, field.type, field.element_type)
        n_vocab = len(src.get("tokenizer.ggml.tokens"))

    weights = RandomF16(rng)
    matrix, vector = weights.matrix, weights.vector

    kv = shapes.n_head_kv * (n_embd // shapes.n_head)
    shared = {"embd": matrix(n_embd, n_vocab), "q": matrix(n_embd, n_embd), "kv": matrix(n_embd, kv),
              "o": matrix(n_embd, n_embd), "up": matrix(n_embd, n_ff), "down": matrix(n_ff, n_embd)}
    w.add_tensor("token_embd.weight", shared["embd"])
    w.add_tensor("output_norm.weight", vector(n_embd))
    if not shapes.tied:
        w.add_tensor("output.weight", shared["embd"])
    for il in range(shapes.n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", vector(n_embd))
        for name, n in (("attn_q", n_embd), ("attn_k", kv), ("attn_v", kv)):
            w.add_tensor(p + name + ".weight", shared["q"] if n == n_embd else shared["kv"])
            w.add_tensor(p + name + ".bias", (0.1 * rng.standard_normal(n)).astype(np.float32))
        w.add_tensor(p + "attn_output.weight", shared["o"])
        w.add_tensor(p + "ffn_norm.weight", vector(n_embd))
        w.add_tensor(p + "ffn_gate.weight", shared["up"])
        w.add_tensor(p + "ffn_up.weight", shared["up"])
        w.add_tensor(p + "ffn_down.weight", shared["down"])
    return w.write(path)


def quantized_once(binary: str, dst: Path, write_f16) -> Path:
    """dst, made unless it exists: write_f16(path) writes the F16 file beside it, which
    llama-quantize turns into Q4_K_M and which is then deleted."""
    if not dst.exists():
        f16 = write_f16(dst.with_name(dst.name.replace("-q4_k_m", "-f16")))
        quantize(binary, f16, dst, "Q4_K_M")
        f16.unlink()
    return dst


def layered_file_main(doc: str, name: str, default_layers: int, write_f16, layers_help: str = "") -> int:
    """The command line of a script that writes one synthetic file of N layers as F16 and
    quantises it to Q4_K_M with llama-quantize: write_f16(path, n_layer) writes the F16
    file; prints {name: path} as JSON."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--llama-quantize", required=True, help="path of llama.cpp's llama-quantize")
    ap.add_argument("--layers", type=int, default=default_layers,
                    help=layers_help or f"layers (default {default_layers})")
    ap.add_argument("--out", default=str(Path.home() / ".cache" / "ggmlpy" / "bench-models"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dst = quantized_once(a.llama_quantize, out / f"synthetic-{name}-{a.layers}l-q4_k_m.gguf",
                         lambda path: write_f16(path, a.layers))
    print(json.dumps({name: str(dst)}, indent=1))
    return 0


def quantize(binary: str, src: Path, dst: Path, ftype: str, requantize: bool = False) -> Path:
    args = [binary] + (["--allow-requantize"] if requantize else []) + [str(src), str(dst), ftype, "2"]
    subprocess.run(args, check=True, capture_output=True, text=True)
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-quantize", required=True, help="path of llama.cpp's llama-quantize")
    ap.add_argument("--out", default=str(Path.home() / ".cache" / "ggmlpy" / "bench-models"))
    ap.add_argument("--only", choices=["7b", "0.5b", "q2k", "q3km"], action="append")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    wanted = a.only or ["7b", "0.5b", "q2k", "q3km"]
    made = {}
    for key, shapes in SYNTHETIC.items():
        if key not in wanted:
            continue
        dst = quantized_once(a.llama_quantize, out / f"synthetic-{key}-q4_k_m.gguf",
                             lambda path, shapes=shapes: synthetic_f16(path, shapes))
        made[key] = str(dst)
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
