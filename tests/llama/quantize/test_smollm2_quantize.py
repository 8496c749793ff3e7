"""SmolLM2-135M through ggmlpy's quantize as llama-quantize took it (tests/tools/quantize_vectors.py
--smollm2): the Q4_1 file of ggmlpy.hub requantised to F16 (every tensor dequantised, the
vocabulary's 49152 strings copied), then that F16 file to Q4_K_M (rows of 576 falling back to
Q5_0, ffn_down's Q4_K/Q6_K, the tied embeddings as Q8_0). About 10 s; a `model` test (the
real file), so in CI's full run."""
from __future__ import annotations

import json

from llama.quantize import quantize_file
from tests.llama.quantize.cases import DATA, sha256

SMOLLM2 = json.loads(DATA.read_text())["smollm2"]


def test_smollm2_f16_and_q4_k_m_are_llama_quantizes(smollm2_path, tmp_path):
    assert sha256(smollm2_path) == SMOLLM2["input_sha256"]
    f16 = quantize_file(smollm2_path, tmp_path / "f16.gguf", "F16", allow_requantize=True, progress=False)
    assert sha256(f16.path) == SMOLLM2["f16_sha256"]
    q4km = quantize_file(f16.path, tmp_path / "q4_k_m.gguf", "Q4_K_M", progress=False)
    assert sha256(q4km.path) == SMOLLM2["q4_k_m_sha256"]
    assert q4km.types["token_embd.weight"].name == "Q8_0"   # tied: the output's rule, 576 % 256 != 0
    assert q4km.types["blk.0.attn_q.weight"].name == "Q5_0"   # Q4_K's fallback for rows of 576
    assert q4km.types["blk.0.ffn_down.weight"].name == "Q6_K"   # use_more_bits(0, 30)
    assert q4km.types["blk.4.ffn_down.weight"].name == "Q4_K"
