"""The inputs and command lines that tests/tools/quantize_vectors.py ran through llama-quantize
and test_llama_cpp_identity.py runs through ggmlpy's quantize.

Every input is written here, deterministically (seeded tiny models, an importance matrix
from a fixed generator), so CI can rebuild it without llama.cpp; the stored sha256 of each
input proves it is the file llama-quantize saw.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from ggmlpy.gguf import GGUFFile, GGUFWriter
from ggmlpy.ir.types import GGMLType
from ggmlpy.testing.models_archs import write_tiny_model
from llama.quantize import MIXES
from llama.quantize.imatrix import write_imatrix as write_imatrix_file

DATA = Path(__file__).with_name("data") / "llama_quantize.json"

# name -> (architecture, tiny-model settings); weight types by name so the table is JSON
FILES: dict[str, tuple[str, dict[str, Any]]] = {
    # K-quant rows (256), 8 layers for the per-layer rules, GQA 2, untied output
    "llama-256": ("llama", {"n_embd": 256, "n_ff": 256, "n_layer": 8, "weight_type": "F16"}),
    # 8 experts (the n_expert == 8 rules, MXFP4_MOE's 3-D experts), GQA 4, attn_output rows of
    # 128 (the fallbacks of 256-blocks)
    "qwen3moe-256": ("qwen3moe", {"n_embd": 256, "n_head_kv": 1, "n_ff_exp": 256, "weight_type": "F16"}),
    # 4 experts: layers read from the names
    "mixtral-256": ("llama", {"n_embd": 256, "n_ff": 256, "n_layer": 2, "n_expert": 4, "n_expert_used": 2,
                              "weight_type": "F16"}),
    # rows of 160 (32-block fallbacks) and 200 (F16 fallback), tied embeddings, GQA 5
    "qwen2-odd": ("qwen2", {"n_embd": 160, "n_head": 5, "n_head_kv": 1, "n_ff": 200, "weight_type": "F16"}),
    # a quantised input (requantizing, COPY)
    "llama-q8_0": ("llama", {"n_embd": 256, "n_ff": 256, "n_layer": 2, "weight_type": "Q8_0"}),
}

# name -> (file of FILES, parts, reversed): that model split as gguf-split splits it, written
# as NAME-0000i-of-0000N.gguf. Reversed, its tensors are in reverse order, so the files' order
# (which --keep-split quantizes in) is not the loader's and the per-layer counters of the
# mixes run the other way.
SPLIT_FILES: dict[str, tuple[str, int, bool]] = {"llama-256-rev": ("llama-256", 3, True),
                                                 "llama-256-split": ("llama-256", 3, False)}
SPLIT = "llama-256-rev-00001-of-00003"   # first parts, the files llama-quantize is given
SPLIT_IN_ORDER = "llama-256-split-00001-of-00003"

ALIASES = {"Q3_K", "Q4_K", "Q5_K"}   # the same ftype as Q3_K_M, Q4_K_M, Q5_K_M
MIX_NAMES = [m.name for m in MIXES if m.name not in ALIASES]
IMATRIX = "imatrix.gguf"   # written by write_imatrix beside the models
# the mixes run with the importance matrix on llama-256 (Q4_K_M is among the options' cases)
IMATRIX_MIXES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q5_K_M", "Q6_K", "IQ4_NL",
                 "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_S", "IQ2_M"]
# IMATRIX plus the attn_output rows of llama-256's first two layers (qwen3moe-256's are 128
# wide there, so IMATRIX leaves them out): the very low-bit mixes need every matrix
IMATRIX_DENSE = "imatrix-dense.gguf"
LOW_BIT_MIXES = ["Q2_K_S", "IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"]

# (file, llama-quantize options, mix): every mix on the F16 files, then the options
CASES: list[tuple[str, list[str], str]] = [
    *[(f, [], mix) for f in ("llama-256", "qwen3moe-256", "qwen2-odd") for mix in MIX_NAMES],
    *[("mixtral-256", [], mix) for mix in ("Q2_K", "Q3_K_M", "Q4_K_M", "IQ4_XS", "MXFP4_MOE", "IQ3_M")],
    ("llama-256", ["--pure"], "Q4_K_M"),
    ("llama-256", ["--pure"], "Q2_K"),
    ("llama-256", ["--leave-output-tensor"], "Q4_K_M"),
    ("llama-256", ["--output-tensor-type", "q8_0"], "Q4_K_M"),
    ("llama-256", ["--token-embedding-type", "Q4_0"], "Q5_K_M"),
    ("llama-256", ["--output-tensor-type", "iq4_nl", "--token-embedding-type", "q5_1"], "Q3_K_S"),
    ("llama-256", ["--tensor-type", "attn_v=q8_0", "--tensor-type", r"blk\.[0-3]\.ffn_down=iq4_nl"], "Q4_K_M"),
    ("llama-256", ["--tensor-type", "ATTN_Q=f16", "--tensor-type", "ffn_up=q4_K"], "Q8_0"),
    ("qwen2-odd", ["--tensor-type", "ffn=q6_k"], "Q4_0"),
    ("qwen2-odd", ["--output-tensor-type", "q4_K"], "Q4_K_M"),
    ("llama-256", ["--override-kv", "general.name=str:renamed", "--override-kv", "llama.context_length=int:-1024",
                   "--override-kv", "tiny.flag=bool:true", "--override-kv", "tiny.scale=float:0.1"], "Q5_K_S"),
    ("llama-q8_0", [], "Q4_K_M"),
    ("llama-q8_0", ["--allow-requantize"], "Q4_K_M"),
    ("llama-q8_0", ["--allow-requantize"], "F16"),
    ("llama-q8_0", [], "COPY"),
    ("llama-q8_0", [], "Q8_0"),
    ("llama-256", ["--imatrix", IMATRIX], "Q8_0"),
    ("qwen3moe-256", ["--imatrix", IMATRIX], "MXFP4_MOE"),
    ("llama-256", ["--imatrix", IMATRIX, "--include-weights", "attn_v"], "Q8_0"),
    ("llama-256", ["--imatrix", IMATRIX, "--exclude-weights", "weight"], "Q4_K_M"),   # nothing left: none used
    ("llama-256", ["--imatrix", IMATRIX], "Q4_K_M"),
    # every type's encoder with an importance matrix (per expert on qwen3moe-256)
    *[("llama-256", ["--imatrix", IMATRIX], mix) for mix in IMATRIX_MIXES],
    ("llama-256", ["--imatrix", IMATRIX], "IQ2_XXS"),   # a matrix without attn_output: refused
    *[("llama-256", ["--imatrix", IMATRIX_DENSE], mix) for mix in LOW_BIT_MIXES],
    *[("qwen3moe-256", ["--imatrix", IMATRIX], mix) for mix in ("Q4_K_M", "IQ2_XXS", "IQ1_M")],
    # --prune-layers: the per-layer rules count the kept layers against the input's block_count
    ("llama-256", ["--prune-layers", "1"], "Q4_K_M"),
    ("llama-256", ["--prune-layers", "0,2"], "Q4_K_M"),
    ("llama-256", ["--prune-layers", "6,3,6"], "Q3_K_M"),   # sorted, the duplicate dropped
    ("llama-256", ["--prune-layers", "0,2", "--imatrix", IMATRIX], "Q4_K_M"),   # matrix of the input's layers
    ("mixtral-256", ["--prune-layers", "0"], "Q4_K_M"),   # experts: the layer read from the new name
    # a split input: one file without --keep-split, the same three files with it
    (SPLIT, [], "Q4_K_M"),
    (SPLIT, ["--keep-split"], "Q4_K_M"),
    (SPLIT, ["--keep-split", "--prune-layers", "5,6,7"], "Q4_K_M"),   # the first file keeps no tensor
    (SPLIT_IN_ORDER, ["--keep-split", "--prune-layers", "5,6,7"], "Q8_0"),   # nor the last: two files
    ("llama-256", ["--keep-split"], "Q8_0"),   # not split: one file, OUT-00001-of-00001.gguf
]


def case_id(file: str, options: list[str], mix: str) -> str:
    return " ".join([file, *options, mix])


def write_file(name: str, folder: Path) -> Path:
    """Write input `name` of FILES into folder (the same bytes every time)."""
    arch, settings = FILES[name]
    settings = dict(settings)
    settings["weight_type"] = GGMLType[settings["weight_type"]]
    return write_tiny_model(arch, folder / f"{name}.gguf", **settings)


def write_split_file(name: str, folder: Path) -> list[Path]:
    """Write split input `name` of SPLIT_FILES into folder: its parts, in order."""
    source, parts, reverse = SPLIT_FILES[name]
    with GGUFFile(write_file(source, folder)) as f:
        w = GGUFWriter(version=f.version)
        for key, fl in f.fields.items():
            w.add_key_value(key, fl.value, fl.type, fl.element_type)
        tensors = list(f.tensors.values())
        for t in reversed(tensors) if reverse else tensors:
            w.add_tensor(t.name, t.data, type=t.type, ne=t.ne)
        return w.write_split(folder / name, parts)


def write_imatrix(folder: Path, dense: bool = False) -> Path:
    """An importance matrix in llama-imatrix's GGUF layout for every matrix of the llama-256
    and qwen3moe-256 files: per tensor NAME.in_sum2 (ne0 x matrices) and NAME.counts.
    dense: IMATRIX_DENSE, with llama-256's attn_output of layers 0 and 1 too."""
    rng = np.random.default_rng(7)
    entries: dict[str, tuple[int, int]] = {}
    for layer in range(8):
        for t in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"):
            entries[f"blk.{layer}.{t}.weight"] = (256, 1)
        if layer >= 2:   # qwen3moe-256's attn_output rows are 128 wide
            entries[f"blk.{layer}.attn_output.weight"] = (256, 1)
        entries[f"blk.{layer}.ffn_down.weight"] = (256, 1)
    entries["output.weight"] = (256, 1)
    for layer in range(2):
        for t in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            entries[f"blk.{layer}.{t}.weight"] = (256, 8)
    if dense:
        entries.update({f"blk.{layer}.attn_output.weight": (256, 1) for layer in range(2)})
    sums = {}
    for name, (n, mats) in entries.items():
        counts = rng.integers(0, 40, mats).astype(np.float32) * 512
        sums[name] = ((rng.random((mats, n)) * 100).astype(np.float32), counts)
    return write_imatrix_file(folder / (IMATRIX_DENSE if dense else IMATRIX), sums, ["tiny.txt"], 3, 512)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def written(folder: Path) -> dict[str, str]:
    """Every file in folder (the outputs of one case) by name, with its sha256."""
    return {p.name: sha256(p) for p in sorted(folder.iterdir())}


def expected_outputs(vector: dict[str, Any]) -> dict[str, str]:
    """A case's files by name (OUT is out.gguf): one file's sha256, or each of several."""
    return vector["outputs"] if "outputs" in vector else {"out.gguf": vector["sha256"]}
