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

    python bench/make_moe_file.py --llama-quantize PATH [--layers N] [--out DIR]

Prints the path as JSON; an existing file is kept. `bench/bench_vs_llama.py -m PATH` then
measures it next to llama-bench. (gpt-oss-20b's shapes need its architecture and MXFP4,
which ggmlpy does not have yet.)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ggmlpy.gguf import GGUFFile, GGUFWriter
from ggmlpy.hub import resolve_model
from make_bench_models import quantize

ARCH = "qwen3moe"
N_EMBD, N_HEAD, N_HEAD_KV, HEAD = 2048, 32, 4, 128
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 128, 8, 768


def synthetic_f16(path: Path, n_layer: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(ARCH)
    with GGUFFile(resolve_model("qwen2.5-coder-1.5b")) as src:
        src_arch = src.get("general.architecture")
        for key, field in src.fields.items():
            if key.startswith("tokenizer."):
                w.add_key_value(key, field.value, field.type, field.element_type)
        n_vocab = len(src.get("tokenizer.ggml.tokens"))
        rope_base = float(src.get(f"{src_arch}.rope.freq_base"))
    w.add_string("general.name", f"synthetic Qwen3-30B-A3B shapes ({n_layer} layers)")
    for key, value in (("context_length", 40960), ("embedding_length", N_EMBD), ("block_count", n_layer),
                       ("feed_forward_length", 6144), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD_KV), ("attention.key_length", HEAD),
                       ("attention.value_length", HEAD), ("rope.dimension_count", HEAD), ("expert_count", N_EXPERT),
                       ("expert_used_count", N_EXPERT_USED), ("expert_feed_forward_length", N_FF_EXP)):
        w.add_uint32(f"{ARCH}.{key}", value)
    w.add_float32(f"{ARCH}.rope.freq_base", rope_base)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-6)

    def matrix(n_in: int, n_out: int, stack: int = 0) -> np.ndarray:
        shape = (stack, n_out, n_in) if stack else (n_out, n_in)
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(n_in)).astype(np.float16)

    def vector(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-quantize", required=True, help="path of llama.cpp's llama-quantize")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--out", default=str(Path.home() / ".cache" / "ggmlpy" / "bench-models"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dst = out / f"synthetic-qwen3moe-{a.layers}l-q4_k_m.gguf"
    if not dst.exists():
        f16 = synthetic_f16(out / f"synthetic-qwen3moe-{a.layers}l-f16.gguf", a.layers)
        quantize(a.llama_quantize, f16, dst, "Q4_K_M")
        f16.unlink()
    print(json.dumps({"qwen3moe": str(dst)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
