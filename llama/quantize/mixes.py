"""llama-quantize's named mixes (its QUANT_OPTIONS) and the ggml types they start from.

A mix is an `llama_ftype`: the number written to general.file_type and the default type of
its tensors (`llama_ftype_get_default_type`); the per-tensor refinements live in rules.py.
Names and ids are llama.cpp's, so `ggmlpy quantize IN OUT 15` means what `llama-quantize IN
OUT 15` does. The table order is llama-quantize's, which decides what an id resolves to
(COPY shares F32's id 0 and comes after it, so 0 means F32).
"""
from __future__ import annotations

from dataclasses import dataclass

from ggmlpy.ir.types import GGMLType

T = GGMLType

# llama_ftype values (include/llama.h); the ones no mix names are left out
ALL_F32, MOSTLY_F16, MOSTLY_Q4_0, MOSTLY_Q4_1 = 0, 1, 2, 3
MOSTLY_Q8_0, MOSTLY_Q5_0, MOSTLY_Q5_1 = 7, 8, 9
MOSTLY_Q2_K, MOSTLY_Q3_K_S, MOSTLY_Q3_K_M, MOSTLY_Q3_K_L = 10, 11, 12, 13
MOSTLY_Q4_K_S, MOSTLY_Q4_K_M, MOSTLY_Q5_K_S, MOSTLY_Q5_K_M, MOSTLY_Q6_K = 14, 15, 16, 17, 18
MOSTLY_IQ2_XXS, MOSTLY_IQ2_XS, MOSTLY_Q2_K_S, MOSTLY_IQ3_XS, MOSTLY_IQ3_XXS = 19, 20, 21, 22, 23
MOSTLY_IQ1_S, MOSTLY_IQ4_NL, MOSTLY_IQ3_S, MOSTLY_IQ3_M, MOSTLY_IQ2_S, MOSTLY_IQ2_M = 24, 25, 26, 27, 28, 29
MOSTLY_IQ4_XS, MOSTLY_IQ1_M, MOSTLY_BF16 = 30, 31, 32
MOSTLY_TQ1_0, MOSTLY_TQ2_0, MOSTLY_MXFP4_MOE, MOSTLY_NVFP4, MOSTLY_Q1_0, MOSTLY_Q2_0 = 36, 37, 38, 39, 40, 41
FTYPE_GUESSED = 1024   # or-ed into a file type llama.cpp guessed from the tensor types


@dataclass(frozen=True)
class Mix:
    """One entry of llama-quantize's list: its name, file type and one-line description."""

    name: str
    ftype: int
    desc: str


MIXES: tuple[Mix, ...] = (
    Mix("Q1_0", MOSTLY_Q1_0, " 1.125 bpw quantization"),
    Mix("Q2_0", MOSTLY_Q2_0, " 2.25 bpw quantization (group 64)"),
    Mix("Q4_0", MOSTLY_Q4_0, " 4.34G, +0.4685 ppl @ Llama-3-8B"),
    Mix("Q4_1", MOSTLY_Q4_1, " 4.78G, +0.4511 ppl @ Llama-3-8B"),
    Mix("MXFP4_MOE", MOSTLY_MXFP4_MOE, " MXFP4 MoE"),
    Mix("Q5_0", MOSTLY_Q5_0, " 5.21G, +0.1316 ppl @ Llama-3-8B"),
    Mix("Q5_1", MOSTLY_Q5_1, " 5.65G, +0.1062 ppl @ Llama-3-8B"),
    Mix("IQ2_XXS", MOSTLY_IQ2_XXS, " 2.06 bpw quantization"),
    Mix("IQ2_XS", MOSTLY_IQ2_XS, " 2.31 bpw quantization"),
    Mix("IQ2_S", MOSTLY_IQ2_S, " 2.5  bpw quantization"),
    Mix("IQ2_M", MOSTLY_IQ2_M, " 2.7  bpw quantization"),
    Mix("IQ1_S", MOSTLY_IQ1_S, " 1.56 bpw quantization"),
    Mix("IQ1_M", MOSTLY_IQ1_M, " 1.75 bpw quantization"),
    Mix("TQ1_0", MOSTLY_TQ1_0, " 1.69 bpw ternarization"),
    Mix("TQ2_0", MOSTLY_TQ2_0, " 2.06 bpw ternarization"),
    Mix("Q2_K", MOSTLY_Q2_K, " 2.96G, +3.5199 ppl @ Llama-3-8B"),
    Mix("Q2_K_S", MOSTLY_Q2_K_S, " 2.96G, +3.1836 ppl @ Llama-3-8B"),
    Mix("IQ3_XXS", MOSTLY_IQ3_XXS, " 3.06 bpw quantization"),
    Mix("IQ3_S", MOSTLY_IQ3_S, " 3.44 bpw quantization"),
    Mix("IQ3_M", MOSTLY_IQ3_M, " 3.66 bpw quantization mix"),
    Mix("Q3_K", MOSTLY_Q3_K_M, "alias for Q3_K_M"),
    Mix("IQ3_XS", MOSTLY_IQ3_XS, " 3.3 bpw quantization"),
    Mix("Q3_K_S", MOSTLY_Q3_K_S, " 3.41G, +1.6321 ppl @ Llama-3-8B"),
    Mix("Q3_K_M", MOSTLY_Q3_K_M, " 3.74G, +0.6569 ppl @ Llama-3-8B"),
    Mix("Q3_K_L", MOSTLY_Q3_K_L, " 4.03G, +0.5562 ppl @ Llama-3-8B"),
    Mix("IQ4_NL", MOSTLY_IQ4_NL, " 4.50 bpw non-linear quantization"),
    Mix("IQ4_XS", MOSTLY_IQ4_XS, " 4.25 bpw non-linear quantization"),
    Mix("Q4_K", MOSTLY_Q4_K_M, "alias for Q4_K_M"),
    Mix("Q4_K_S", MOSTLY_Q4_K_S, " 4.37G, +0.2689 ppl @ Llama-3-8B"),
    Mix("Q4_K_M", MOSTLY_Q4_K_M, " 4.58G, +0.1754 ppl @ Llama-3-8B"),
    Mix("Q5_K", MOSTLY_Q5_K_M, "alias for Q5_K_M"),
    Mix("Q5_K_S", MOSTLY_Q5_K_S, " 5.21G, +0.1049 ppl @ Llama-3-8B"),
    Mix("Q5_K_M", MOSTLY_Q5_K_M, " 5.33G, +0.0569 ppl @ Llama-3-8B"),
    Mix("Q6_K", MOSTLY_Q6_K, " 6.14G, +0.0217 ppl @ Llama-3-8B"),
    Mix("Q8_0", MOSTLY_Q8_0, " 7.96G, +0.0026 ppl @ Llama-3-8B"),
    Mix("F16", MOSTLY_F16, "14.00G, +0.0020 ppl @ Mistral-7B"),
    Mix("BF16", MOSTLY_BF16, "14.00G, -0.0050 ppl @ Mistral-7B"),
    Mix("F32", ALL_F32, "26.00G              @ 7B"),
    Mix("COPY", ALL_F32, "only copy tensors, no quantizing"),
)

# llama_ftype_get_default_type: the type every quantisable tensor starts from
DEFAULT_TYPES: dict[int, GGMLType] = {
    MOSTLY_Q4_0: T.Q4_0, MOSTLY_Q4_1: T.Q4_1, MOSTLY_Q5_0: T.Q5_0, MOSTLY_Q5_1: T.Q5_1,
    MOSTLY_Q8_0: T.Q8_0, MOSTLY_F16: T.F16, MOSTLY_BF16: T.BF16, ALL_F32: T.F32,
    MOSTLY_Q1_0: T.Q1_0, MOSTLY_Q2_0: T.Q2_0, MOSTLY_MXFP4_MOE: T.MXFP4,
    MOSTLY_Q2_K_S: T.Q2_K, MOSTLY_Q2_K: T.Q2_K, MOSTLY_IQ3_XS: T.IQ3_S,
    MOSTLY_Q3_K_S: T.Q3_K, MOSTLY_Q3_K_M: T.Q3_K, MOSTLY_Q3_K_L: T.Q3_K,
    MOSTLY_Q4_K_S: T.Q4_K, MOSTLY_Q4_K_M: T.Q4_K, MOSTLY_Q5_K_S: T.Q5_K, MOSTLY_Q5_K_M: T.Q5_K,
    MOSTLY_Q6_K: T.Q6_K, MOSTLY_TQ1_0: T.TQ1_0, MOSTLY_TQ2_0: T.TQ2_0,
    MOSTLY_IQ2_XXS: T.IQ2_XXS, MOSTLY_IQ2_XS: T.IQ2_XS, MOSTLY_IQ2_S: T.IQ2_XS, MOSTLY_IQ2_M: T.IQ2_S,
    MOSTLY_IQ3_XXS: T.IQ3_XXS, MOSTLY_IQ1_S: T.IQ1_S, MOSTLY_IQ1_M: T.IQ1_M,
    MOSTLY_IQ4_NL: T.IQ4_NL, MOSTLY_IQ4_XS: T.IQ4_XS, MOSTLY_IQ3_S: T.IQ3_S, MOSTLY_IQ3_M: T.IQ3_S,
}

# the file type llama.cpp's loader guesses from a file's most common tensor type (what COPY
# writes to general.file_type when the input has none), before FTYPE_GUESSED is or-ed in
GUESSED_FTYPES: dict[GGMLType, int] = {
    T.F32: ALL_F32, T.F16: MOSTLY_F16, T.BF16: MOSTLY_BF16, T.Q4_0: MOSTLY_Q4_0, T.Q4_1: MOSTLY_Q4_1,
    T.Q5_0: MOSTLY_Q5_0, T.Q5_1: MOSTLY_Q5_1, T.Q8_0: MOSTLY_Q8_0, T.Q2_K: MOSTLY_Q2_K,
    T.Q3_K: MOSTLY_Q3_K_M, T.Q4_K: MOSTLY_Q4_K_M, T.Q5_K: MOSTLY_Q5_K_M, T.Q6_K: MOSTLY_Q6_K,
    T.TQ1_0: MOSTLY_TQ1_0, T.TQ2_0: MOSTLY_TQ2_0, T.IQ2_XXS: MOSTLY_IQ2_XXS, T.IQ2_XS: MOSTLY_IQ2_XS,
    T.IQ2_S: MOSTLY_IQ2_S, T.IQ3_XXS: MOSTLY_IQ3_XXS, T.IQ1_S: MOSTLY_IQ1_S, T.IQ1_M: MOSTLY_IQ1_M,
    T.IQ4_NL: MOSTLY_IQ4_NL, T.IQ4_XS: MOSTLY_IQ4_XS, T.IQ3_S: MOSTLY_IQ3_S, T.NVFP4: MOSTLY_NVFP4,
    T.Q1_0: MOSTLY_Q1_0, T.Q2_0: MOSTLY_Q2_0,
}

# ggml_type_name where it is not the enum name in lower case
_GGML_NAMES = {T.Q2_K: "q2_K", T.Q3_K: "q3_K", T.Q4_K: "q4_K", T.Q5_K: "q5_K", T.Q6_K: "q6_K", T.Q8_K: "q8_K"}


def ggml_name(t: GGMLType) -> str:
    """ggml_type_name(t): how llama.cpp prints a type ("q4_K", "iq4_nl", "f16")."""
    return _GGML_NAMES.get(GGMLType(t), GGMLType(t).name.lower())


def parse_mix(text: str) -> Mix | None:
    """try_parse_ftype: a mix by name (any case) or by its file type number; None if neither.
    A number resolves to the first entry with that id (0 is F32, never COPY)."""
    for mix in MIXES:
        if mix.name.lower() == text.lower():
            return mix
    try:
        number = int(text.strip())   # std::stoi: surrounding blanks and a sign are accepted
    except ValueError:
        return None
    return next((mix for mix in MIXES if mix.ftype == number), None)


def parse_ggml_type(text: str) -> GGMLType:
    """parse_ggml_type: any ggml type by its ggml name, any case ("q8_0", "Q6_K", "bf16")."""
    for t in GGMLType:
        if ggml_name(t).lower() == text.lower():
            return t
    raise ValueError(f"invalid ggml_type {text!r}")


def mix_help() -> str:
    """The 'allowed quantization types' list of llama-quantize's usage text."""
    lines = []
    for mix in MIXES:
        head = "          " if mix.name == "COPY" else f"  {mix.ftype:2d}  or  "
        lines.append(f"{head}{mix.name:<7} : {mix.desc}")
    return "\n".join(lines)
