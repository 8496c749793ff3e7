"""ggml's block formats: layouts, dequantisation and reference quantisation.

`dequantize(data, type, ne)` decodes a tensor's bytes to float32 (numpy shape = ne reversed),
`dequantize_rows` decodes only some rows, `dequantizable_types()` lists the types these two
decode (the types the engine computes), `quantize(x, type)` encodes float32 rows the way
ggml's reference quantisers (quantize_row_*_ref) do, byte for byte, and `block_dtype(type)`
is the numpy structured dtype of one block.
"""
from ggmlpy.quants.dequant import dequantizable_types, dequantize, dequantize_rows
from ggmlpy.quants.layouts import QK_K, block_dtype, supported_types
from ggmlpy.quants.quant import ENCODERS, quantize

QUANTIZABLE = tuple(sorted(ENCODERS))

__all__ = ["QK_K", "QUANTIZABLE", "block_dtype", "dequantizable_types", "dequantize",
           "dequantize_rows", "quantize", "supported_types"]
