"""A synthetic benchmark file with DeepSeek-V2-Lite's layer shapes in the MLA form llama.cpp's
converter writes today, quantised to Q4_K_M by llama.cpp's `llama-quantize` (built outside the
repo, next to llama-bench).

Shapes (its config.json): 2048 wide, 16 heads; queries without a low rank (3072 = 16 x (128
+ 64)); keys and values compressed to 512 plus 64 rope dims (`attn_kv_a_mqa`), decompressed
per head by `attn_k_b` (128 x 512) and `attn_v_b` (512 x 128); the first layer a dense
10944-wide FFN, the others 64 experts of 1408 of which 6 run (softmax router) beside 2 shared
ones; YaRN (factor 40, mscale_all_dim 0.707) as the released file has it. 6 layers by
default, Qwen 2.5's 151,936-token vocabulary (the tokenizer of the known model
`qwen2.5-coder-1.5b`) and random weights; one random stack of experts is shared by the
layers (each still has its own bytes), so the F16 file (about 1.2 GB a layer) is written
from about 1.5 GB of memory.

    python bench/make_deepseek_file.py --llama-quantize PATH [--layers N] [--out DIR]

Prints the path as JSON; an existing file is kept. `bench/bench_vs_llama.py -m PATH` then
measures it next to llama-bench.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ggmlpy.gguf import GGUFWriter
from make_bench_models import RandomF16, layered_file_main
from make_moe_file import _tokenizer

ARCH = "deepseek2"
N_EMBD, N_HEAD, KV_RANK, NOPE, ROPE, HEAD_V = 2048, 16, 512, 128, 64, 128
N_FF, N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_SHARED = 10944, 64, 6, 1408, 2


def synthetic_f16(path: Path, n_layer: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(ARCH)
    n_vocab = _tokenizer(w)
    w.add_string("general.name", f"synthetic DeepSeek-V2-Lite shapes ({n_layer} layers)")
    for key, value in (("context_length", 163840), ("embedding_length", N_EMBD), ("block_count", n_layer),
                       ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", 1), ("attention.key_length", KV_RANK + ROPE),
                       ("attention.value_length", KV_RANK), ("attention.key_length_mla", NOPE + ROPE),
                       ("attention.value_length_mla", HEAD_V), ("attention.q_lora_rank", 0),
                       ("attention.kv_lora_rank", KV_RANK),
                       ("rope.dimension_count", ROPE), ("leading_dense_block_count", 1),
                       ("expert_count", N_EXPERT), ("expert_used_count", N_EXPERT_USED),
                       ("expert_feed_forward_length", N_FF_EXP), ("expert_shared_count", N_SHARED),
                       ("expert_gating_func", 1), ("rope.scaling.original_context_length", 4096)):
        w.add_uint32(f"{ARCH}.{key}", value)
    for key, value in (("rope.freq_base", 10000.0), ("attention.layer_norm_rms_epsilon", 1e-6),
                       ("expert_weights_scale", 1.0), ("rope.scaling.factor", 40.0),
                       ("rope.scaling.yarn_log_multiplier", 0.0707)):
        w.add_float32(f"{ARCH}.{key}", value)
    w.add_string(f"{ARCH}.rope.scaling.type", "yarn")

    weights = RandomF16(rng)
    matrix, vector = weights.matrix, weights.vector

    shared = {"embd": matrix(N_EMBD, n_vocab), "q": matrix(N_EMBD, N_HEAD * (NOPE + ROPE)),
              "kv_a": matrix(N_EMBD, KV_RANK + ROPE), "k_b": matrix(NOPE, KV_RANK, N_HEAD),
              "v_b": matrix(KV_RANK, HEAD_V, N_HEAD), "o": matrix(N_HEAD * HEAD_V, N_EMBD),
              "up": matrix(N_EMBD, N_FF), "down": matrix(N_FF, N_EMBD),
              "router": matrix(N_EMBD, N_EXPERT), "up_exps": matrix(N_EMBD, N_FF_EXP, N_EXPERT),
              "down_exps": matrix(N_FF_EXP, N_EMBD, N_EXPERT), "up_sh": matrix(N_EMBD, N_FF_EXP * N_SHARED),
              "down_sh": matrix(N_FF_EXP * N_SHARED, N_EMBD)}
    w.add_tensor("token_embd.weight", shared["embd"])
    w.add_tensor("output_norm.weight", vector(N_EMBD))
    w.add_tensor("output.weight", shared["embd"])
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", vector(N_EMBD))
        w.add_tensor(p + "attn_kv_a_norm.weight", vector(KV_RANK))
        for name, key in (("attn_q", "q"), ("attn_kv_a_mqa", "kv_a"), ("attn_k_b", "k_b"), ("attn_v_b", "v_b"),
                          ("attn_output", "o")):
            w.add_tensor(p + name + ".weight", shared[key])
        w.add_tensor(p + "ffn_norm.weight", vector(N_EMBD))
        if il == 0:
            for name, key in (("ffn_gate", "up"), ("ffn_up", "up"), ("ffn_down", "down")):
                w.add_tensor(p + name + ".weight", shared[key])
            continue
        w.add_tensor(p + "ffn_gate_inp.weight", shared["router"].astype(np.float32))
        for name, key in (("ffn_gate_exps", "up_exps"), ("ffn_up_exps", "up_exps"), ("ffn_down_exps", "down_exps"),
                          ("ffn_gate_shexp", "up_sh"), ("ffn_up_shexp", "up_sh"), ("ffn_down_shexp", "down_sh")):
            w.add_tensor(p + name + ".weight", shared[key])
    return w.write(path)


def main() -> int:
    return layered_file_main(__doc__, "deepseek2-lite", 6, synthetic_f16)


if __name__ == "__main__":
    raise SystemExit(main())
