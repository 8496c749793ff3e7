"""ggml's block formats: layouts, dequantisation and reference quantisation.

`dequantize(data, type, ne)` decodes a tensor's bytes to float32 (numpy shape = ne reversed),
`dequantize_rows` decodes only some rows, `dequantizable_types()` lists the types these two
decode (the types the engine computes), `quantize(x, type)` encodes float32 rows the way
ggml's reference quantisers (quantize_row_*_ref) do, byte for byte (`quantize(x, type,
imatrix)`: as ggml_quantize_chunk does with an importance matrix), and `block_dtype(type)` is
the numpy structured dtype of one block.
"""
from ggmlpy.quants.dequant import dequantizable_types, dequantize, dequantize_rows
from ggmlpy.quants.layouts import QK_K, block_dtype, supported_types
from ggmlpy.quants.quant import ENCODERS, quantize
from ggmlpy.quants.quant_imatrix import ENCODERS as IMATRIX_ENCODERS

QUANTIZABLE = tuple(sorted(ENCODERS))
# with an importance matrix: these too (the types that need one)
QUANTIZABLE_WITH_IMATRIX = tuple(sorted(set(ENCODERS) | set(IMATRIX_ENCODERS)))

__all__ = ["QK_K", "QUANTIZABLE", "QUANTIZABLE_WITH_IMATRIX", "block_dtype", "dequantizable_types", "dequantize",
           "dequantize_rows", "quantize", "supported_types"]
