"""Synthetic Gemma 4 benchmark files with E2B's or 26B-A4B's layer shapes, made with llama.cpp's
`llama-quantize` (built outside the repo, next to llama-bench) as Q4_K_M.

Shapes (the released config.json files):
- `--shape e2b`: 1536 wide, 8 query heads and 1 key/value head, heads of 256 on the
  sliding-window layers (512-token windows) and 512 on the global ones (every 5th, with
  proportional RoPE over a quarter of their dims), a 6144-wide GELU FFN (twice as wide in
  the layers that share an earlier layer's cache), per-layer embedding inputs 256 wide;
  10 layers by default, the last 5 sharing the caches of layers 3 and 4 (E2B: the last 20 of
  35, so a layer count N shares all but the first 5 * round(3N / 35) layers).
- `--shape 26b-a4b`: 2816 wide, 16 query heads, 8 key/value heads on the window layers
  (1024-token windows) and 2 on the global ones (every 6th, K used as V), heads of 256 and
  512; a 2112-wide dense FFN beside 128 experts of 704 of which 8 run, gate and up stacked
  in one tensor; 6 layers by default.
Both use Qwen 2.5's 151,936-token vocabulary (its tokenizer stands in for Gemma's 262,144
tokens; speed does not depend on which) and tie the output to the embedding. Random weights
are written as F16 (one random stack per shape, shared by every layer) and quantised by
llama-quantize.

    python bench/make_gemma4_file.py --llama-quantize PATH [--shape e2b|26b-a4b] [--layers N] [--out DIR]

Prints the path as JSON; an existing file is kept. `bench/bench_vs_llama.py -m PATH` then
measures it next to llama-bench.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggmlpy.gguf import GGUFWriter
from ggmlpy.gguf.writer import GGUFValueType
from make_bench_models import quantized_once
from make_moe_file import _tokenizer

ARCH = "gemma4"


@dataclass(frozen=True)
class Shape:
    n_embd: int
    n_head: int
    n_head_kv_swa: int
    n_head_kv_full: int
    n_ff: int
    n_swa: int
    swa_period: int          # every swa_period-th layer is global
    n_layer: int
    n_shared_kv: int = 0
    n_pl: int = 0            # per-layer embedding width
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    k_eq_v_global: bool = False
    head_swa: int = 256
    head_full: int = 512


SHAPES = {
    "e2b": Shape(n_embd=1536, n_head=8, n_head_kv_swa=1, n_head_kv_full=1, n_ff=6144, n_swa=512, swa_period=5,
                 n_layer=10, n_shared_kv=5, n_pl=256),
    "26b-a4b": Shape(n_embd=2816, n_head=16, n_head_kv_swa=8, n_head_kv_full=2, n_ff=2112, n_swa=1024,
                     swa_period=6, n_layer=6, n_expert=128, n_expert_used=8, n_ff_exp=704, k_eq_v_global=True),
}


def synthetic_f16(path: Path, s: Shape, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(ARCH)
    n_vocab = _tokenizer(w)
    swa = [(il + 1) % s.swa_period != 0 for il in range(s.n_layer)]
    start = s.n_layer - s.n_shared_kv
    n_ff = [s.n_ff * (2 if s.n_shared_kv and il >= start else 1) for il in range(s.n_layer)]
    n_kv = [s.n_head_kv_swa if x else s.n_head_kv_full for x in swa]
    w.add_string("general.name", f"synthetic Gemma 4 shapes ({s.n_layer} layers)")
    for key, value in (("context_length", 131072), ("embedding_length", s.n_embd), ("block_count", s.n_layer),
                       ("attention.head_count", s.n_head), ("attention.key_length", s.head_full),
                       ("attention.value_length", s.head_full), ("attention.key_length_swa", s.head_swa),
                       ("attention.value_length_swa", s.head_swa), ("rope.dimension_count", s.head_full),
                       ("rope.dimension_count_swa", s.head_swa), ("attention.sliding_window", s.n_swa),
                       ("attention.shared_kv_layers", s.n_shared_kv),
                       ("embedding_length_per_layer_input", s.n_pl)):
        w.add_uint32(f"{ARCH}.{key}", value)
    w.add_array(f"{ARCH}.feed_forward_length", n_ff, GGUFValueType.INT32)
    w.add_array(f"{ARCH}.attention.head_count_kv", n_kv, GGUFValueType.INT32)
    w.add_array(f"{ARCH}.attention.sliding_window_pattern", swa, GGUFValueType.BOOL)
    for key, value in (("rope.freq_base", 1e6), ("rope.freq_base_swa", 1e4),
                       ("attention.layer_norm_rms_epsilon", 1e-6), ("final_logit_softcapping", 30.0)):
        w.add_float32(f"{ARCH}.{key}", value)
    if s.n_expert:
        for key, value in (("expert_count", s.n_expert), ("expert_used_count", s.n_expert_used),
                           ("expert_feed_forward_length", s.n_ff_exp)):
            w.add_uint32(f"{ARCH}.{key}", value)

    cache: dict[tuple, np.ndarray] = {}

    def matrix(n_in: int, n_out: int, stack: int = 0) -> np.ndarray:
        """One random matrix per shape, shared by the layers that have that shape."""
        key = (n_in, n_out, stack)
        if key not in cache:
            shape = (stack, n_out, n_in) if stack else (n_out, n_in)
            cache[key] = (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(n_in)).astype(np.float16)
        return cache[key]

    def vector(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", matrix(s.n_embd, n_vocab))
    w.add_tensor("output_norm.weight", vector(s.n_embd))
    rotated = s.head_full // 8   # proportional RoPE: a quarter of the dims, in pairs
    w.add_tensor("rope_freqs.weight", np.array([1.0] * rotated + [1e30] * (s.head_full // 2 - rotated), np.float32))
    if s.n_pl:
        w.add_tensor("per_layer_token_embd.weight", matrix(s.n_pl * s.n_layer, n_vocab))
        w.add_tensor("per_layer_model_proj.weight", matrix(s.n_embd, s.n_pl * s.n_layer))
        w.add_tensor("per_layer_proj_norm.weight", vector(s.n_pl))
    for il in range(s.n_layer):
        _layer(w, f"blk.{il}.", s, swa[il], n_kv[il], n_ff[il], matrix, vector)
    return w.write(path)


def _layer(w: GGUFWriter, p: str, s: Shape, swa: bool, n_kv: int, n_ff: int, matrix, vector) -> None:
    head = s.head_swa if swa else s.head_full
    w.add_tensor(p + "attn_norm.weight", vector(s.n_embd))
    w.add_tensor(p + "attn_q.weight", matrix(s.n_embd, s.n_head * head))
    w.add_tensor(p + "attn_k.weight", matrix(s.n_embd, n_kv * head))
    if swa or not s.k_eq_v_global:
        w.add_tensor(p + "attn_v.weight", matrix(s.n_embd, n_kv * head))
    w.add_tensor(p + "attn_output.weight", matrix(s.n_head * head, s.n_embd))
    w.add_tensor(p + "attn_q_norm.weight", vector(head))
    w.add_tensor(p + "attn_k_norm.weight", vector(head))
    w.add_tensor(p + "post_attention_norm.weight", vector(s.n_embd))
    w.add_tensor(p + "layer_output_scale.weight", np.array([0.5], np.float32))
    w.add_tensor(p + "ffn_norm.weight", vector(s.n_embd))
    w.add_tensor(p + "ffn_gate.weight", matrix(s.n_embd, n_ff))
    w.add_tensor(p + "ffn_up.weight", matrix(s.n_embd, n_ff))
    w.add_tensor(p + "ffn_down.weight", matrix(n_ff, s.n_embd))
    w.add_tensor(p + "post_ffw_norm.weight", vector(s.n_embd))
    if s.n_expert:
        w.add_tensor(p + "ffn_gate_inp.weight", matrix(s.n_embd, s.n_expert).astype(np.float32))
        w.add_tensor(p + "ffn_gate_inp.scale", vector(s.n_embd))
        w.add_tensor(p + "ffn_gate_up_exps.weight", matrix(s.n_embd, 2 * s.n_ff_exp, s.n_expert))
        w.add_tensor(p + "ffn_down_exps.weight", matrix(s.n_ff_exp, s.n_embd, s.n_expert))
        w.add_tensor(p + "ffn_down_exps.scale", vector(s.n_expert))
        for name in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
            w.add_tensor(p + name + ".weight", vector(s.n_embd))
    if s.n_pl:
        w.add_tensor(p + "inp_gate.weight", matrix(s.n_embd, s.n_pl))
        w.add_tensor(p + "proj.weight", matrix(s.n_pl, s.n_embd))
        w.add_tensor(p + "post_norm.weight", vector(s.n_embd))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-quantize", required=True, help="path of llama.cpp's llama-quantize")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="e2b")
    ap.add_argument("--layers", type=int, help="layers (default: e2b 10, 26b-a4b 6)")
    ap.add_argument("--out", default=str(Path.home() / ".cache" / "ggmlpy" / "bench-models"))
    a = ap.parse_args()
    shape = SHAPES[a.shape]
    if a.layers:
        owning = shape.swa_period * max(1, round(3 * a.layers / 35)) if shape.n_shared_kv else a.layers
        shape = Shape(**{**shape.__dict__, "n_layer": a.layers, "n_shared_kv": a.layers - owning})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dst = quantized_once(a.llama_quantize, out / f"synthetic-gemma4-{a.shape}-{shape.n_layer}l-q4_k_m.gguf",
                         lambda path: synthetic_f16(path, shape))
    print(json.dumps({a.shape: str(dst)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
