"""A synthetic mixture-of-experts benchmark file with Qwen3-30B-A3B's layer shapes, made with
llama.cpp's `llama-quantize` (built outside the repo, next to llama-bench).

Shapes (its config.json): 2048 wide, 32 query and 4 key/value heads of 128, per-head q/k
norms, 128 experts of which 8 run, each 768 wide, Qwen's 151,936-token vocabulary (the
tokenizer and metadata of the known model `qwen2.5-coder-1.5b`); 24 layers by default,
so that the experts and not the output matrix dominate a token's reads. Random weights are
written as F16 and quantised to Q4_K_M (Q4_K experts, Q6_K for part of the down
projections, as llama-quantize chooses). Speed does not depend on the values, so one random
stack of experts per shape is shared by every layer (each layer still has its own bytes):
the F16 file (about 1.2 GB a layer on disk) is written from about 1.5 GB of memory.

With `--shape gpt-oss`, gpt-oss-20b's shapes instead (2880 wide, 64 query and 8 key/value
heads of 64 with biases and sinks, alternating 128-token windows, YaRN; 32 experts of which
4 run, each 2880 wide, with biases; 12 layers by default), quantised here by ggmlpy's
reference quantisers as the released file mixes them: MXFP4 experts, Q8_0 for the other
matrices (Qwen's vocabulary stands in for gpt-oss's 201,088 tokens). No llama-quantize needed.

    python bench/make_moe_file.py --llama-quantize PATH [--layers N] [--out DIR]
    python bench/make_moe_file.py --shape gpt-oss [--layers N] [--out DIR]

Prints the path as JSON; an existing file is kept. `bench/bench_vs_llama.py -m PATH` then
measures it next to llama-bench.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ggmlpy.gguf import GGUFFile, GGUFWriter
from ggmlpy.hub import resolve_model
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import quantize as quantize_rows
from make_bench_models import RandomF16, quantized_once

ARCH = "qwen3moe"
N_EMBD, N_HEAD, N_HEAD_KV, HEAD = 2048, 32, 4, 128
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 128, 8, 768


def synthetic_f16(path: Path, n_layer: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(ARCH)
    n_vocab = _tokenizer(w)
    with GGUFFile(resolve_model("qwen2.5-coder-1.5b")) as src:
        rope_base = float(src.get(f"{src.get('general.architecture')}.rope.freq_base"))
    w.add_string("general.name", f"synthetic Qwen3-30B-A3B shapes ({n_layer} layers)")
    for key, value in (("context_length", 40960), ("embedding_length", N_EMBD), ("block_count", n_layer),
                       ("feed_forward_length", 6144), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD_KV), ("attention.key_length", HEAD),
                       ("attention.value_length", HEAD), ("rope.dimension_count", HEAD), ("expert_count", N_EXPERT),
                       ("expert_used_count", N_EXPERT_USED), ("expert_feed_forward_length", N_FF_EXP)):
        w.add_uint32(f"{ARCH}.{key}", value)
    w.add_float32(f"{ARCH}.rope.freq_base", rope_base)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-6)

    weights = RandomF16(rng)
    matrix, vector = weights.matrix, weights.vector

    shared = {"embd": matrix(N_EMBD, n_vocab), "q": matrix(N_EMBD, N_HEAD * HEAD),
              "kv": matrix(N_EMBD, N_HEAD_KV * HEAD), "o": matrix(N_HEAD * HEAD, N_EMBD),
              "router": matrix(N_EMBD, N_EXPERT), "up": matrix(N_EMBD, N_FF_EXP, N_EXPERT),
              "down": matrix(N_FF_EXP, N_EMBD, N_EXPERT)}
    w.add_tensor("token_embd.weight", shared["embd"])
    w.add_tensor("output_norm.weight", vector(N_EMBD))
    w.add_tensor("output.weight", shared["embd"])
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", vector(N_EMBD))
        w.add_tensor(p + "attn_q.weight", shared["q"])
        w.add_tensor(p + "attn_k.weight", shared["kv"])
        w.add_tensor(p + "attn_v.weight", shared["kv"])
        w.add_tensor(p + "attn_output.weight", shared["o"])
        w.add_tensor(p + "attn_q_norm.weight", vector(HEAD))
        w.add_tensor(p + "attn_k_norm.weight", vector(HEAD))
        w.add_tensor(p + "ffn_norm.weight", vector(N_EMBD))
        w.add_tensor(p + "ffn_gate_inp.weight", shared["router"].astype(np.float32))
        w.add_tensor(p + "ffn_gate_exps.weight", shared["up"])
        w.add_tensor(p + "ffn_up_exps.weight", shared["up"])
        w.add_tensor(p + "ffn_down_exps.weight", shared["down"])
    return w.write(path)


def _tokenizer(w: GGUFWriter) -> int:
    """Qwen 2.5's tokenizer into w; returns the vocabulary size."""
    with GGUFFile(resolve_model("qwen2.5-coder-1.5b")) as src:
        for key, field in src.fields.items():
            if key.startswith("tokenizer."):
                w.add_key_value(key, field.value, field.type, field.element_type)
        return len(src.get("tokenizer.ggml.tokens"))


def synthetic_gpt_oss(path: Path, n_layer: int, seed: int = 0) -> Path:
    """gpt-oss-20b's shapes with random weights, MXFP4 experts and Q8_0 matrices."""
    embd, n_head, n_head_kv, head, n_expert, n_used, n_ff = 2880, 64, 8, 64, 32, 4, 2880
    rng = np.random.default_rng(seed)
    arch = "gpt-oss"
    w = GGUFWriter(arch)
    n_vocab = _tokenizer(w)
    w.add_string("general.name", f"synthetic gpt-oss-20b shapes ({n_layer} layers)")
    for key, value in (("context_length", 131072), ("embedding_length", embd), ("block_count", n_layer),
                       ("feed_forward_length", n_ff), ("attention.head_count", n_head),
                       ("attention.head_count_kv", n_head_kv), ("attention.key_length", head),
                       ("attention.value_length", head), ("rope.dimension_count", head), ("expert_count", n_expert),
                       ("expert_used_count", n_used), ("expert_feed_forward_length", n_ff),
                       ("attention.sliding_window", 128), ("rope.scaling.original_context_length", 4096)):
        w.add_uint32(f"{arch}.{key}", value)
    for key, value in (("rope.freq_base", 150000.0), ("attention.layer_norm_rms_epsilon", 1e-5),
                       ("rope.scaling.factor", 32.0)):
        w.add_float32(f"{arch}.{key}", value)
    w.add_string(f"{arch}.rope.scaling.type", "yarn")

    def matrix(n_in: int, n_out: int, qtype: GGMLType, stack: int = 0) -> tuple[np.ndarray, dict]:
        rows = (rng.standard_normal((max(stack, 1) * n_out, n_in), dtype=np.float32) / np.sqrt(n_in))
        data = quantize_rows(rows, qtype)
        ne = (n_in, n_out, stack) if stack else (n_in, n_out)
        return data, {"type": qtype, "ne": ne}

    def vector(*shape: int, scale: float = 0.1, base: float = 0.0) -> np.ndarray:
        return (base + scale * rng.standard_normal(shape)).astype(np.float32)

    q8, fp4 = GGMLType.Q8_0, GGMLType.MXFP4
    shared = {"embd": matrix(embd, n_vocab, q8), "q": matrix(embd, n_head * head, q8),
              "kv": matrix(embd, n_head_kv * head, q8), "o": matrix(n_head * head, embd, q8),
              "up": matrix(embd, n_ff, fp4, n_expert), "down": matrix(n_ff, embd, fp4, n_expert)}
    w.add_tensor("token_embd.weight", shared["embd"][0], **shared["embd"][1])
    w.add_tensor("output_norm.weight", vector(embd, base=1.0))
    w.add_tensor("output.weight", shared["embd"][0], **shared["embd"][1])
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", vector(embd, base=1.0))
        for name, key, n_out in (("attn_q", "q", n_head * head), ("attn_k", "kv", n_head_kv * head),
                                 ("attn_v", "kv", n_head_kv * head), ("attn_output", "o", embd)):
            w.add_tensor(p + name + ".weight", shared[key][0], **shared[key][1])
            w.add_tensor(p + name + ".bias", vector(n_out))
        w.add_tensor(p + "attn_sinks.weight", vector(n_head, scale=1.0))
        w.add_tensor(p + "post_attention_norm.weight", vector(embd, base=1.0))
        w.add_tensor(p + "ffn_gate_inp.weight", vector(n_expert, embd, scale=1 / np.sqrt(embd)))
        w.add_tensor(p + "ffn_gate_inp.bias", vector(n_expert))
        for name, key, n_out in (("gate", "up", n_ff), ("up", "up", n_ff), ("down", "down", embd)):
            w.add_tensor(p + f"ffn_{name}_exps.weight", shared[key][0], **shared[key][1])
            w.add_tensor(p + f"ffn_{name}_exps.bias", vector(n_expert, n_out))
    return w.write(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=["qwen3moe", "gpt-oss"], default="qwen3moe")
    ap.add_argument("--llama-quantize", help="path of llama.cpp's llama-quantize (qwen3moe)")
    ap.add_argument("--layers", type=int, help="layers (default: qwen3moe 24, gpt-oss 12)")
    ap.add_argument("--out", default=str(Path.home() / ".cache" / "ggmlpy" / "bench-models"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.shape == "gpt-oss":
        dst = out / f"synthetic-gpt-oss-{a.layers or 12}l-mxfp4.gguf"
        if not dst.exists():
            synthetic_gpt_oss(dst, a.layers or 12)
        print(json.dumps({"gpt-oss": str(dst)}, indent=1))
        return 0
    if not a.llama_quantize:
        ap.error("--llama-quantize is needed for the qwen3moe file")
    a.layers = a.layers or 24
    dst = quantized_once(a.llama_quantize, out / f"synthetic-qwen3moe-{a.layers}l-q4_k_m.gguf",
                         lambda path: synthetic_f16(path, a.layers))
    print(json.dumps({"qwen3moe": str(dst)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
