"""Random LoRA adapter files for tests and benchmarks, in the layout llama.cpp reads
(convert_lora_to_gguf.py's): `W.lora_a` ne [n_in, r], `W.lora_b` ne [r, n_out], the token
embedding's pair transposed (A ne [r, n_vocab], B ne [r, n_embd]).

`merged` gives what the adapter does to each matrix as numpy (W + s·alpha/r·B·A, in the
[n_out, n_in] layout), for an independent forward pass over the merged weights.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from ggmlpy.gguf import GGUFFile, GGUFWriter
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import quantize

# (a mixture-of-experts layer's router, ffn_gate_inp, is a matrix too; its experts are not)
DEFAULT_TARGETS = ("attn_qkv", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                   "ffn_gate_inp")


def write_lora(model_path: str | Path, path: str | Path, *, rank: int = 8, alpha: float = 16.0,
               targets: Iterable[str] = DEFAULT_TARGETS, output: bool = False,
               token_embd: bool = False, magnitude: float = 1.0, seed: int = 0,
               dtype: GGMLType = GGMLType.F32) -> Path:
    """An adapter for the model at `model_path`: a random pair for every layer matrix whose
    name is `blk.N.<target>.weight`, plus `output.weight` and `token_embd.weight` if asked.
    `magnitude` scales B so that the adaptation moves the logits clearly (the B·A product
    is about `magnitude` times the matrix it adapts, per element, at scale alpha/r = 1)."""
    targets = tuple(targets)
    with GGUFFile(model_path) as model:
        arch = model.metadata["general.architecture"]
        shapes = {name: tuple(info.ne) for name, info in model.tensors.items()}
    rng = np.random.default_rng(seed)
    w = GGUFWriter(arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)

    def add(name: str, data: np.ndarray) -> None:
        if dtype == GGMLType.F32:
            w.add_tensor(name, data.astype(np.float32))
        elif dtype == GGMLType.F16:
            w.add_tensor(name, data.astype(np.float16))
        elif data.shape[1] % 32:  # rows shorter than a block stay F16, as the converter's
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, quantize(data.astype(np.float32), dtype), type=dtype,
                         ne=(data.shape[1], data.shape[0]))

    for name in sorted(shapes):
        n_in, n_out = shapes[name][:2] if len(shapes[name]) > 1 else (0, 0)
        wanted = (name.startswith("blk.") and name.split(".")[2] in targets and name.endswith(".weight")
                  and len(shapes[name]) == 2)
        if name == "output.weight" and output:
            wanted = True
        if name == "token_embd.weight" and token_embd:
            a = rng.standard_normal((n_out, rank))                       # ne [r, n_vocab]
            b = rng.standard_normal((n_in, rank)) * magnitude / np.sqrt(rank * n_in)  # ne [r, n_embd]
            add(f"{name}.lora_a", a)
            add(f"{name}.lora_b", b)
            continue
        if not wanted:
            continue
        a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)            # ne [n_in, r]
        b = rng.standard_normal((n_out, rank)) * magnitude / np.sqrt(rank * n_in)  # ne [r, n_out]
        add(f"{name}.lora_a", a)
        add(f"{name}.lora_b", b)
    return w.write(path)


def merged(tensors: dict[str, np.ndarray], adapter_path: str | Path, scale: float) -> dict[str, np.ndarray]:
    """`tensors` (numpy layout: [n_out, n_in] matrices, float64, as tests/llama/models/oracles reads
    them) with the adapter merged in at `scale`, from the adapter file read by the `gguf`
    package: W + scale·alpha/r·B·A, and for the token embedding E + scale·alpha/r·(B·A)ᵀ (a
    tied output then gets `output.weight`, the embedding as it was: llama.cpp adapts the
    lookup only)."""
    import gguf

    reader = gguf.GGUFReader(str(adapter_path))
    alpha = float(reader.fields["adapter.lora.alpha"].parts[-1][0])
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for t in reader.tensors:
        data = t.data
        if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            data = gguf.quants.dequantize(data, t.tensor_type)
        shape = tuple(reversed([int(n) for n in t.shape]))
        base, half = t.name.rsplit(".lora_", 1)
        pairs.setdefault(base, {})[half] = np.asarray(data, np.float64).reshape(shape)
    out = dict(tensors)
    for base, pair in pairs.items():
        a, b = pair["a"], pair["b"]
        rank = b.shape[1] if base != "token_embd.weight" else a.shape[1]
        s = scale * (alpha / rank if alpha else 1.0)
        if base == "token_embd.weight":  # a [n_vocab, r], b [n_embd, r]
            # the lookup only: a tied output projection reads the embedding unadapted
            out.setdefault("output.weight", tensors[base])
            out[base] = tensors[base] + s * (a @ b.T)
        else:                             # a [r, n_in], b [n_out, r]
            out[base] = tensors[base] + s * (b @ a)
    return out
