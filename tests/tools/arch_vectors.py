"""llama.cpp's logits on the tiny random-weight files of the architectures listed in VARIANTS,
for tests/llama/models/test_archs_llama_cpp.py.

Writes each file with ggmlpy.testing.models_archs.write_tiny_model (seeded, so the same
bytes every time; their sha256 goes with the vectors), evaluates PROMPT with
llama-cpp-python's `Llama(path, logits_all=True)` over the llama.cpp that llama-cpp-python
0.3.36 vendors, and records every position's logits and the greedy continuation of N_GREEDY
tokens. Not a test and not a dependency; rerun it in an environment with that package when
the reference or the files change:

    PEER/bin/python -m tests.tools.arch_vectors > tests/llama/models/data/llama_cpp_archs.json
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.testing.models_archs import write_tiny_model
from ggmlpy.testing.models_deepseek2 import DEEPSEEK2_LEGACY, DEEPSEEK2_TEMP, DEEPSEEK2_V3
from ggmlpy.testing.models_gemma4 import GEMMA4_MOE

# name -> (architecture, tiny-model settings)
VARIANTS: dict[str, tuple[str, dict]] = {
    "qwen3moe-f32": ("qwen3moe", {}),
    "qwen3moe-q8_0": ("qwen3moe", {"weight_type": GGMLType.Q8_0}),
    "qwen2moe-f32": ("qwen2moe", {}),
    "qwen2moe-q8_0": ("qwen2moe", {"weight_type": GGMLType.Q8_0}),
    # YaRN: llama_context's ext_factor, attn_factor and beta fast/slow (prompt positions past
    # the original context's tenth, where interpolated and extrapolated dims part)
    "qwen2-yarn-f32": ("qwen2", {"extra_keys": {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                                "rope.scaling.original_context_length": 32}}),
    "mixtral-f32": ("llama", {"n_expert": 4, "n_expert_used": 2}),
    "mixtral-q4_0": ("llama", {"n_expert": 4, "n_expert_used": 2, "weight_type": GGMLType.Q4_0}),
    "olmoe-f32": ("olmoe", {}),
    "olmoe-q8_0": ("olmoe", {"weight_type": GGMLType.Q8_0}),
    "granite-f32": ("granite", {}),
    "granite-norope-q8_0": ("granite", {"weight_type": GGMLType.Q8_0,
                                        "extra_keys": {"logit_scale": 4.0, "residual_scale": 0.5,
                                                       "embedding_scale": 3.0, "rope.scaling.finetuned": False}}),
    "granitemoe-f32": ("granitemoe", {}),
    "granitemoe-q4_0": ("granitemoe", {"weight_type": GGMLType.Q4_0}),
    "glm4moe-f32": ("glm4moe", {}),
    "glm4moe-q8_0": ("glm4moe", {"weight_type": GGMLType.Q8_0}),
    # the other gating functions of build_moe_ffn, through the file's expert_gating_func
    "glm4moe-sqrt-softplus-f32": ("glm4moe", {"extra_keys": {
        "leading_dense_block_count": 1, "expert_shared_count": 1, "expert_weights_norm": False,
        "expert_weights_scale": 1.5, "expert_gating_func": 4}}),
    "glm4moe-softmax-q8_0": ("glm4moe", {"weight_type": GGMLType.Q8_0, "extra_keys": {
        "leading_dense_block_count": 1, "expert_shared_count": 1, "expert_weights_norm": True,
        "expert_gating_func": 1}}),
    "gpt-oss-f32": ("gpt-oss", {}),
    # gpt-oss's own mix: MXFP4 experts, Q8_0 attention; YaRN as the released files have it
    "gpt-oss-mxfp4": ("gpt-oss", {"weight_type": GGMLType.Q8_0, "expert_type": GGMLType.MXFP4,
                                  "extra_keys": {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                                 "rope.scaling.original_context_length": 32}}),
    # hybrids: gated delta-net layers beside gated attention with multi-section RoPE
    "qwen35-f32": ("qwen35", {}),
    "qwen35-q8_0": ("qwen35", {"weight_type": GGMLType.Q8_0}),
    "qwen35moe-f32": ("qwen35moe", {}),
    "qwen35moe-q4_0": ("qwen35moe", {"weight_type": GGMLType.Q4_0}),
    "qwen3next-q8_0": ("qwen3next", {"weight_type": GGMLType.Q8_0}),
    # older converters' fused ssm_in (Q, K, V and z per key head)
    "qwen3next-ssm-in-f32": ("qwen3next", {"legacy_ssm_in": True}),
    # I-quants: IQ4_NL's 32-blocks (experts too); the super-block types need rows of 256
    "llama-iq4_nl": ("llama", {"weight_type": GGMLType.IQ4_NL}),
    "mixtral-iq4_nl": ("llama", {"n_expert": 4, "n_expert_used": 2, "weight_type": GGMLType.IQ4_NL}),
    "llama-iq4_xs": ("llama", {"weight_type": GGMLType.IQ4_XS, "n_embd": 256, "n_ff": 512}),
    # the grid I-quants ggml quantises without an importance matrix, and the ternary types
    "llama-iq3_s": ("llama", {"weight_type": GGMLType.IQ3_S, "n_embd": 256, "n_ff": 512}),
    "llama-iq3_xxs": ("llama", {"weight_type": GGMLType.IQ3_XXS, "n_embd": 256, "n_ff": 512}),
    "llama-iq2_s": ("llama", {"weight_type": GGMLType.IQ2_S, "n_embd": 256, "n_ff": 512}),
    # and those it quantises only with one (a uniform matrix: add_random_matrix)
    "llama-iq2_xs": ("llama", {"weight_type": GGMLType.IQ2_XS, "n_embd": 256, "n_ff": 512}),
    # (seed 3: seeds 0 and 1 have greedy paths with two logits 0.001-0.005 apart, which rounding
    # may order either way)
    "llama-iq2_xxs": ("llama", {"weight_type": GGMLType.IQ2_XXS, "n_embd": 256, "n_ff": 512, "seed": 3}),
    "llama-iq1_s": ("llama", {"weight_type": GGMLType.IQ1_S, "n_embd": 256, "n_ff": 512}),
    "llama-iq1_m": ("llama", {"weight_type": GGMLType.IQ1_M, "n_embd": 256, "n_ff": 512}),
    "llama-tq2_0": ("llama", {"weight_type": GGMLType.TQ2_0, "n_embd": 256, "n_ff": 512}),
    "llama-tq1_0": ("llama", {"weight_type": GGMLType.TQ1_0, "n_embd": 256, "n_ff": 512}),
    # the blocks of 64 and 128 that ggml multiplies against Q8_0
    "llama-q2_0": ("llama", {"weight_type": GGMLType.Q2_0, "n_embd": 256, "n_ff": 512}),
    "llama-q1_0": ("llama", {"weight_type": GGMLType.Q1_0, "n_embd": 256, "n_ff": 512}),
    "llama-nvfp4": ("llama", {"weight_type": GGMLType.NVFP4, "n_embd": 256, "n_ff": 512}),
    # Gemma 4: per-layer embeddings, per-layer head sizes and KV heads, shared KV layers (E2B's
    # shape), and the experts' variant with a dense FFN beside them (26B-A4B's)
    "gemma4-f32": ("gemma4", {}),
    "gemma4-q8_0": ("gemma4", {"weight_type": GGMLType.Q8_0}),
    "gemma4-moe-f32": ("gemma4", GEMMA4_MOE),
    "gemma4-moe-q4_0": ("gemma4", {**GEMMA4_MOE, "weight_type": GGMLType.Q4_0}),
    # Q, K and V as the rows of one attn_qkv.weight (V on the global layers too)
    "gemma4-qkv-q8_0": ("gemma4", {"fused_qkv": True, "weight_type": GGMLType.Q8_0}),
    # DeepSeek V2/V3: MLA absorbed (attn_k_b/attn_v_b, K-only cache) and as older files store it
    # (attn_kv_b), grouped routing with YaRN, Mistral Large 3's attention temperature
    "deepseek2-mla-f32": ("deepseek2", {}),
    "deepseek2-mla-q8_0": ("deepseek2", {"weight_type": GGMLType.Q8_0}),
    "deepseek2-lite-f32": ("deepseek2", DEEPSEEK2_LEGACY),
    "deepseek2-lite-q4_0": ("deepseek2", {**DEEPSEEK2_LEGACY, "weight_type": GGMLType.Q4_0}),
    "deepseek2-v3-groups-yarn-f32": ("deepseek2", DEEPSEEK2_V3),
    "deepseek2-temperature-f32": ("deepseek2", DEEPSEEK2_TEMP),
}
PROMPT = [5, 17, 200, 33, 41, 9, 8, 7, 100]
N_GREEDY = 8


def vectors(name: str, arch: str, settings: dict, folder: Path) -> dict:
    from llama_cpp import Llama

    path = write_tiny_model(arch, folder / f"{name}.gguf", **settings)
    llm = Llama(str(path), logits_all=True, n_ctx=64, n_batch=64, verbose=False, seed=0)
    llm.eval(PROMPT)
    logits = np.array(llm.scores[:len(PROMPT)], dtype=np.float32)
    greedy = []
    for _ in range(N_GREEDY):
        greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([greedy[-1]])
    return {"arch": arch, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "prompt": PROMPT,
            "logits": np.round(logits, 6).tolist(), "greedy": greedy}


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        out = {name: vectors(name, arch, settings, Path(d)) for name, (arch, settings) in VARIANTS.items()}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
