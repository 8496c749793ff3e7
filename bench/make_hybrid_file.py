"""A synthetic hybrid benchmark file with Qwen3.5-4B's layer shapes, made with llama.cpp's
`llama-quantize` (built outside the repo, next to llama-bench).

Shapes: 2560 wide; gated delta-net layers with 16 key heads and 32 value heads of 128
(convolution kernel 4); gated attention layers with 16 query and 4 key/value heads of 256,
interleaved multi-section RoPE on 64 of them (sections 11, 11, 10); every fourth layer is
attention; a 9216-wide SwiGLU FFN; Qwen3.5's 248,320-token vocabulary (the tokenizer of
llama.cpp's vocabulary file, kept xz-compressed in tests/llama/vocab/data). 8 layers by
default: 6 delta-net, 2 attention. Random weights are written as F16 and quantised to
Q4_K_M by llama-quantize. Speed does not depend on the values, so one random matrix per
shape is shared by every layer (each layer still has its own bytes).

    python bench/make_hybrid_file.py --llama-quantize PATH [--layers N] [--out DIR]

Prints the path as JSON; an existing file is kept. `bench/bench_vs_llama.py -m PATH` then
measures it next to llama-bench (`--depth 8192` for decode after an 8,192-token prompt).
"""
from __future__ import annotations

import lzma
import tempfile
from pathlib import Path

import numpy as np

from ggmlpy.gguf import GGUFFile, GGUFWriter
from ggmlpy.gguf.writer import GGUFValueType
from make_bench_models import layered_file_main

ARCH = "qwen35"
N_EMBD, N_FF = 2560, 9216
N_HEAD, N_HEAD_KV, HEAD, N_ROT = 16, 4, 256, 64
N_K_HEADS, N_V_HEADS, SSM_HEAD, D_CONV = 16, 32, 128, 4
VOCAB = Path(__file__).resolve().parent.parent / "tests" / "llama" / "vocab" / "data" / "ggml-vocab-qwen35.gguf.xz"


def synthetic_f16(path: Path, n_layer: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    w = GGUFWriter(ARCH)
    n_vocab = _tokenizer(w)
    w.add_string("general.name", f"synthetic Qwen3.5-4B shapes ({n_layer} layers)")
    key_dim, value_dim = N_K_HEADS * SSM_HEAD, N_V_HEADS * SSM_HEAD
    conv_dim = 2 * key_dim + value_dim
    for key, value in (("context_length", 262144), ("embedding_length", N_EMBD), ("block_count", n_layer),
                       ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD_KV), ("attention.key_length", HEAD),
                       ("attention.value_length", HEAD), ("rope.dimension_count", N_ROT),
                       ("full_attention_interval", 4), ("ssm.conv_kernel", D_CONV), ("ssm.inner_size", value_dim),
                       ("ssm.state_size", SSM_HEAD), ("ssm.time_step_rank", N_V_HEADS),
                       ("ssm.group_count", N_K_HEADS)):
        w.add_uint32(f"{ARCH}.{key}", value)
    w.add_array(f"{ARCH}.rope.dimension_sections", [11, 11, 10, 0], GGUFValueType.INT32)
    w.add_float32(f"{ARCH}.rope.freq_base", 1e7)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-6)

    def matrix(n_in: int, n_out: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in), dtype=np.float32) / np.sqrt(n_in)).astype(np.float16)

    def vector(n: int, base: float = 1.0, scale: float = 0.1) -> np.ndarray:
        return (base + scale * rng.standard_normal(n)).astype(np.float32)

    shared = {"embd": matrix(N_EMBD, n_vocab), "qkv": matrix(N_EMBD, conv_dim), "z": matrix(N_EMBD, value_dim),
              "ba": matrix(N_EMBD, N_V_HEADS), "ssm_out": matrix(value_dim, N_EMBD),
              "q": matrix(N_EMBD, 2 * N_HEAD * HEAD), "kv": matrix(N_EMBD, N_HEAD_KV * HEAD),
              "o": matrix(N_HEAD * HEAD, N_EMBD), "up": matrix(N_EMBD, N_FF), "down": matrix(N_FF, N_EMBD)}
    w.add_tensor("token_embd.weight", shared["embd"])
    w.add_tensor("output_norm.weight", vector(N_EMBD))
    w.add_tensor("output.weight", shared["embd"])
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", vector(N_EMBD))
        w.add_tensor(p + "post_attention_norm.weight", vector(N_EMBD))
        if (il + 1) % 4:
            w.add_tensor(p + "attn_qkv.weight", shared["qkv"])
            w.add_tensor(p + "attn_gate.weight", shared["z"])
            w.add_tensor(p + "ssm_conv1d.weight", vector(conv_dim * D_CONV, 0.0, 0.5).reshape(conv_dim, D_CONV))
            w.add_tensor(p + "ssm_dt.bias", vector(N_V_HEADS, 0.0, 0.5))
            w.add_tensor(p + "ssm_a", -np.exp(vector(N_V_HEADS, 0.0, 0.5)))
            w.add_tensor(p + "ssm_beta.weight", shared["ba"])
            w.add_tensor(p + "ssm_alpha.weight", shared["ba"])
            w.add_tensor(p + "ssm_norm.weight", vector(SSM_HEAD))
            w.add_tensor(p + "ssm_out.weight", shared["ssm_out"])
        else:
            w.add_tensor(p + "attn_q.weight", shared["q"])
            w.add_tensor(p + "attn_k.weight", shared["kv"])
            w.add_tensor(p + "attn_v.weight", shared["kv"])
            w.add_tensor(p + "attn_output.weight", shared["o"])
            w.add_tensor(p + "attn_q_norm.weight", vector(HEAD))
            w.add_tensor(p + "attn_k_norm.weight", vector(HEAD))
        w.add_tensor(p + "ffn_gate.weight", shared["up"])
        w.add_tensor(p + "ffn_up.weight", shared["up"])
        w.add_tensor(p + "ffn_down.weight", shared["down"])
    return w.write(path)


def _tokenizer(w: GGUFWriter) -> int:
    """Qwen3.5's tokenizer into w; returns the vocabulary size."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "vocab.gguf"
        path.write_bytes(lzma.decompress(VOCAB.read_bytes()))
        with GGUFFile(path) as src:
            for key, field in src.fields.items():
                if key.startswith("tokenizer."):
                    w.add_key_value(key, field.value, field.type, field.element_type)
            return len(src.get("tokenizer.ggml.tokens"))


def main() -> int:
    return layered_file_main(__doc__, "qwen35", 8, synthetic_f16, "layers, every fourth attention (default 8)")


if __name__ == "__main__":
    raise SystemExit(main())
