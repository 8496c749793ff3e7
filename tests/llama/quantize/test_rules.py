"""llama-quantize's type choices in isolation: the mix table, names and categories, the
counters of the per-layer rules, the fallbacks and the importance-matrix requirement.
test_llama_cpp_identity.py checks whole files against llama.cpp; these pin the rules that
its tiny files cannot reach (70B, Falcon, 8 experts' attn_k, MXFP4_MOE on dense models)."""
from __future__ import annotations

import pytest

from ggmlpy.ir.types import GGMLType as T
from llama.quantize import mixes as F
from llama.quantize.choose import tensor_type, use_more_bits
from llama.quantize.mixes import ggml_name, mix_help, parse_ggml_type, parse_mix
from llama.quantize.names import allows_quantization, category, n_dims, sort_key
from llama.quantize.rules import ModelInfo, Params, State, fallback, requires_imatrix
from llama.quantize import names as N


def types_of(arch: str, ftype: int, tensors: dict[str, tuple[int, ...]], **info) -> dict[str, T]:
    """Every tensor's type for a model of `tensors` (all F16), in the loader's order."""
    state = State(ModelInfo(arch=arch, n_layer_all=info.pop("n_layer", 8), **info), Params(ftype=ftype))
    order = sorted(tensors, key=sort_key)
    state.count(order)
    return {n: tensor_type(state, n, tensors[n], T.F16, F.DEFAULT_TYPES[ftype]) for n in order}


def dense(n_layer: int, width: int = 256) -> dict[str, tuple[int, ...]]:
    t = {"token_embd.weight": (width, 1000), "output.weight": (width, 1000), "output_norm.weight": (width,)}
    for i in range(n_layer):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up"):
            t[f"blk.{i}.{name}.weight"] = (width, width)
        t[f"blk.{i}.ffn_down.weight"] = (width, width)
        t[f"blk.{i}.attn_norm.weight"] = (width,)
    return t


def test_mix_names_and_numbers_resolve_as_llama_quantize():
    assert parse_mix("q4_k_m").ftype == F.MOSTLY_Q4_K_M
    assert parse_mix("15").name == "Q4_K"           # the first entry with that id (an alias)
    assert parse_mix("0").name == "F32" and parse_mix("COPY").ftype == F.ALL_F32
    assert parse_mix(" 7").name == "Q8_0"
    assert parse_mix("Q4_K_X") is None and parse_mix("99") is None
    assert "  15  or  Q4_K_M  :  4.58G, +0.1754 ppl @ Llama-3-8B" in mix_help().splitlines()
    assert mix_help().splitlines()[-1] == "          COPY    : only copy tensors, no quantizing"


def test_ggml_type_names():
    assert parse_ggml_type("Q4_K") == T.Q4_K and parse_ggml_type("iq4_nl") == T.IQ4_NL
    assert ggml_name(T.Q6_K) == "q6_K" and ggml_name(T.BF16) == "bf16"
    with pytest.raises(ValueError, match="invalid ggml_type 'q9_0'"):
        parse_ggml_type("q9_0")


def test_loader_order_and_categories():
    names = ["output.weight", "blk.10.attn_q.weight", "blk.2.ffn_up.weight", "blk.2.attn_k.weight", "token_embd.weight"]
    assert sorted(names, key=sort_key) == ["output.weight", "token_embd.weight", "blk.2.attn_k.weight",
                                           "blk.2.ffn_up.weight", "blk.10.attn_q.weight"]
    assert category("blk.0.ffn_down_exps.weight") == N.FFN_DOWN
    assert category("blk.0.attn_qkv.weight") == N.ATTN_QKV
    assert category("per_layer_token_embd.weight") == N.TOKEN_EMBD
    assert n_dims((256, 1, 1)) == 1 and n_dims((256, 4, 1)) == 2 and n_dims((1, 1, 8)) == 3


@pytest.mark.parametrize("name,ne,ok", [
    ("blk.0.attn_q.weight", (256, 256), True),
    ("blk.0.attn_norm.weight", (256, 256), False),       # a norm, even 2-D
    ("blk.0.attn_q.bias", (256, 256), False),            # not a weight
    ("blk.0.ffn_gate_inp.weight", (256, 8), False),      # the router
    ("blk.0.ssm_conv1d.weight", (4, 256), False),
    ("position_embd.weight", (256, 512), False),
    ("blk.0.attn_q.weight", (256, 1), False),            # 1-D as ggml counts dimensions
    ("blk.0.ffn_up_exps.weight", (256, 256, 8), True),
])
def test_what_is_never_quantised(name, ne, ok):
    assert allows_quantization(Params(ftype=F.MOSTLY_Q4_0), "llama", name, ne) is ok


def test_leave_output_tensor_and_copy():
    assert not allows_quantization(Params(ftype=1, quantize_output_tensor=False), "llama", "output.weight", (256, 9))
    assert not allows_quantization(Params(ftype=0, only_copy=True), "llama", "blk.0.attn_q.weight", (256, 9))


def test_use_more_bits_layers():
    assert [i for i in range(8) if use_more_bits(i, 8)] == [0, 3, 6, 7]
    assert [i for i in range(30) if use_more_bits(i, 30)][:6] == [0, 1, 2, 5, 8, 11]


def test_q4_k_m_dense_per_layer():
    t = types_of("llama", F.MOSTLY_Q4_K_M, dense(8), n_head=4, n_head_kv=2)
    assert [t[f"blk.{i}.attn_v.weight"] for i in range(8)] == [T.Q6_K, T.Q4_K, T.Q4_K, T.Q6_K, T.Q4_K, T.Q4_K,
                                                                  T.Q6_K, T.Q6_K]
    assert t["output.weight"] == T.Q6_K and t["token_embd.weight"] == T.Q4_K
    assert t["output_norm.weight"] == T.F16   # untouched (its own type)


def test_q3_k_m_counts_attn_v_tensors_and_70b():
    t = types_of("llama", F.MOSTLY_Q3_K_M, dense(4), n_head=4, n_head_kv=2)
    assert [t[f"blk.{i}.attn_v.weight"] for i in range(4)] == [T.Q5_K, T.Q5_K, T.Q4_K, T.Q4_K]
    big = types_of("llama", F.MOSTLY_Q3_K_S, dense(80, 256), n_layer=80, n_head=64, n_head_kv=8)
    assert big["blk.5.attn_v.weight"] == T.Q5_K   # LLM_TYPE_70B: Q3_K attn_v bumped
    mha = types_of("llama", F.MOSTLY_Q3_K_S, dense(80, 256), n_layer=80, n_head=64, n_head_kv=64)
    assert mha["blk.5.attn_v.weight"] == T.Q3_K   # 65B (n_head == n_head_kv) is not 70B


def test_falcon_and_tied_output():
    t = types_of("falcon", F.MOSTLY_Q4_K_M, dense(16), n_layer=16, n_head=4, n_head_kv=4)
    assert t["output.weight"] == T.Q8_0   # Falcon's output is always Q8_0
    assert [t[f"blk.{i}.ffn_down.weight"] for i in range(5)] == [T.Q6_K, T.Q5_K, T.Q4_K, T.Q4_K, T.Q5_K]
    tied = dense(2)
    del tied["output.weight"]
    assert types_of("llama", F.MOSTLY_Q4_0, tied)["token_embd.weight"] == T.Q6_K   # the output's rule


def test_eight_experts_and_mxfp4_moe():
    moe = dense(2)
    for i in range(2):
        moe[f"blk.{i}.ffn_down_exps.weight"] = (256, 256, 8)
    t = types_of("llama", F.MOSTLY_Q4_K_M, moe, n_layer=2, n_expert=8, n_head=4, n_head_kv=4)
    assert t["blk.0.attn_v.weight"] == T.Q8_0 and t["blk.0.attn_k.weight"] == T.Q8_0
    assert t["blk.0.attn_output.weight"] == T.Q5_K
    t = types_of("llama", F.MOSTLY_MXFP4_MOE, moe, n_layer=2, n_expert=8)
    assert t["blk.0.ffn_down_exps.weight"] == T.MXFP4 and t["blk.0.ffn_down.weight"] == T.Q8_0
    assert t["output.weight"] == T.Q8_0


def test_expert_layers_come_from_names():
    state = State(ModelInfo("llama", 2, n_expert=4), Params(ftype=F.MOSTLY_Q4_K_M))
    with pytest.raises(ValueError, match="bad layer 5"):
        tensor_type(state, "blk.5.ffn_down.weight", (256, 256), T.F16, T.Q4_K)


def test_fallbacks():
    state = State(ModelInfo("llama", 1), Params(ftype=F.MOSTLY_Q4_K_M))
    assert fallback(state, "x", 576, T.Q4_K) == T.Q5_0
    assert fallback(state, "x", 160, T.IQ4_XS) == T.IQ4_NL
    assert fallback(state, "x", 200, T.Q6_K) == T.F16       # Q8_0 does not divide 200 either
    assert fallback(state, "x", 200, T.Q8_0) == T.F16
    assert fallback(state, "x", 256, T.Q2_K) == T.Q2_K and state.n_fallback == 4
    with pytest.raises(ValueError, match="no tensor type fallback is defined for type q1_0"):
        fallback(state, "x", 160, T.Q1_0)


def test_importance_matrix_requirement():
    assert requires_imatrix("blk.0.attn_q.weight", T.IQ2_XXS, F.MOSTLY_IQ2_XXS)
    assert not requires_imatrix("token_embd.weight", T.IQ2_XXS, F.MOSTLY_IQ2_XXS)
    assert requires_imatrix("blk.0.attn_q.weight", T.Q2_K, F.MOSTLY_Q2_K_S)
    assert not requires_imatrix("blk.0.attn_q.weight", T.Q2_K, F.MOSTLY_Q2_K)


def test_tensor_type_overrides():
    params = Params(ftype=F.MOSTLY_Q4_K_M, tensor_types=[(r"attn_(q|k)", T.Q8_0), ("attn", T.Q4_0)],
                    output_tensor_type=T.Q5_K, token_embedding_type=T.Q4_1)
    state = State(ModelInfo("llama", 1), params)
    state.count(["output.weight"])
    assert tensor_type(state, "blk.0.attn_k.weight", (256, 256), T.F16, T.Q4_K) == T.Q8_0
    assert tensor_type(state, "blk.0.attn_v.weight", (256, 256), T.F16, T.Q4_K) == T.Q4_0   # first match wins
    assert tensor_type(state, "output.weight", (160, 256), T.F16, T.Q4_K) == T.Q5_K   # given types: no fallback
    assert tensor_type(state, "token_embd.weight", (256, 256), T.F16, T.Q4_K) == T.Q4_1
    with pytest.raises(ValueError, match="bad regular expression"):
        State(ModelInfo("llama", 1), Params(ftype=2, tensor_types=[("attn(", T.Q8_0)]))
