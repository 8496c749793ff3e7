"""The state behind llama.cpp's per-tensor type choice (quantize_state_impl), and the two
shape- and mix-independent rules: the fallback for rows that a type's block does not divide
(tensor_type_fallback) and which targets need an importance matrix (tensor_requires_imatrix).

The choice itself is in choose.py; the state is apart because the choice for one tensor
depends on how many of its kind came before (i_attention_wv, i_ffn_down, ...) in the
loader's tensor order, and those counters must advance exactly as llama.cpp's do.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ggmlpy.ir.types import GGMLType, block_size
from llama.quantize import mixes as F
from llama.quantize.mixes import ggml_name
from llama.quantize.names import ATTN_V_LIKE, OUTPUT, category

T = GGMLType

# the blocks of 256 that fall back when a row is not a multiple of 256 (tensor_type_fallback)
_FALLBACK = {
    **{t: T.IQ4_NL for t in (T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ4_XS)},
    **{t: T.Q4_0 for t in (T.Q2_0, T.Q2_K, T.Q3_K, T.TQ1_0, T.TQ2_0)},
    T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0,
}
# types that cannot be written without an importance matrix (tensor_requires_imatrix)
_NEEDS_IMATRIX = (T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_M, T.IQ1_S)
# llama.cpp's models whose 80 (Jais 2: 68) layers make LLM_TYPE_70B (an attn_v rule in choose.py)
_70B_LAYERS = {"qwen2": 80, "deci": 80, "olmo": 80, "jais2": 68}


@dataclass(frozen=True)
class ModelInfo:
    """The hyperparameters the rules read (llama_model's arch, type and hparams)."""

    arch: str
    n_layer_all: int        # block_count, MTP layers included
    n_layer_nextn: int = 0
    n_head: int = 0         # of layer 0, as hparams.n_gqa() reads it
    n_head_kv: int = 0
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        """llama.cpp's LLM_TYPE_70B (from each arch's load_arch_hparams)."""
        n_layer = self.n_layer_all - self.n_layer_nextn
        if self.arch == "llama":
            return self.n_expert != 8 and n_layer == 80 and self.n_head != self.n_head_kv
        return _70B_LAYERS.get(self.arch) == n_layer


@dataclass
class Params:
    """llama_model_quantize_params, the parts that choose types."""

    ftype: int
    output_tensor_type: GGMLType | None = None
    token_embedding_type: GGMLType | None = None
    quantize_output_tensor: bool = True
    only_copy: bool = False
    pure: bool = False
    tensor_types: list[tuple[str, GGMLType]] = field(default_factory=list)   # (regex, type)


@dataclass
class State:
    """quantize_state_impl: counters over the tensors seen so far, and the compiled patterns."""

    model: ModelInfo
    params: Params
    has_imatrix: bool = False
    has_tied_embeddings: bool = True
    n_attention_wv: int = 0
    i_attention_wv: int = 0
    n_ffn_down: int = 0
    i_ffn_down: int = 0
    n_ffn_gate: int = 0
    i_ffn_gate: int = 0
    n_ffn_up: int = 0
    i_ffn_up: int = 0
    n_fallback: int = 0
    warnings: list[str] = field(default_factory=list)
    patterns: list[tuple[re.Pattern[str], GGMLType]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.patterns = []
        for pattern, qtype in self.params.tensor_types:
            try:
                self.patterns.append((re.compile(pattern), qtype))
            except re.error as e:
                raise ValueError(f"--tensor-type {pattern}={ggml_name(qtype)}: bad regular expression: {e}") from None

    def count(self, names: list[str]) -> None:
        """init_quantize_state_counters: attn_v-like tensors, whether output.weight exists."""
        for name in names:
            cat = category(name)
            if cat in ATTN_V_LIKE:
                self.n_attention_wv += 1
            if cat == OUTPUT:
                self.has_tied_embeddings = False
        self.n_ffn_down = self.n_ffn_gate = self.n_ffn_up = self.model.n_layer_all

    def match(self, name: str) -> GGMLType | None:
        """The type of the first --tensor-type pattern found in name (std::regex_search)."""
        return next((qtype for pattern, qtype in self.patterns if pattern.search(name)), None)


def fallback(state: State, name: str, ne0: int, target: GGMLType) -> GGMLType:
    """tensor_type_fallback: a type whose block divides the row when the target's does not
    (a 32-block type, else F16)."""
    qk = block_size(target)
    if ne0 % qk == 0:
        return target
    state.n_fallback += 1
    if target in _FALLBACK:
        result = _FALLBACK[target]
    elif qk <= 32:
        result = target
    else:
        raise ValueError(f"tensor {name}: no tensor type fallback is defined for type {ggml_name(target)}")
    if ne0 % block_size(result):
        result = T.F16
    state.warnings.append(f"{name} - ncols {ne0} not divisible by {qk} (required for type {ggml_name(target)})"
                          f" -> falling back to {ggml_name(result)}")
    return result


def requires_imatrix(name: str, target: GGMLType, ftype: int) -> bool:
    """tensor_requires_imatrix: the very low-bit types, and Q2_K inside a Q2_K_S file."""
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    return target in _NEEDS_IMATRIX or (target == T.Q2_K and ftype == F.MOSTLY_Q2_K_S)
