"""`ggmlpy quantize`: llama.cpp's llama-quantize in Python, writing the same bytes.

    from llama.quantize import quantize_file
    quantize_file("model-f16.gguf", "model-q4_k_m.gguf", "Q4_K_M")

mixes.py lists llama-quantize's named mixes, names.py and rules.py / choose.py decide each
tensor's type as llama_tensor_get_type does, prune.py drops and renumbers layers
(--prune-layers), plan.py settles the whole output (its files with --keep-split) before
writing and driver.py writes it; imatrix.py reads importance matrices (llama-imatrix's GGUF and
legacy files), which ggmlpy's reference quantisers cannot use yet (see docs/quantize.md).
"""
from llama.quantize.driver import QuantizeResult, quantize_file
from llama.quantize.imatrix import Imatrix, load_imatrix
from llama.quantize.mixes import MIXES, Mix, ggml_name, mix_help, parse_ggml_type, parse_mix
from llama.quantize.prune import parse_prune_layers

__all__ = ["MIXES", "Imatrix", "Mix", "QuantizeResult", "ggml_name", "load_imatrix", "mix_help", "parse_ggml_type",
           "parse_mix", "parse_prune_layers", "quantize_file"]
