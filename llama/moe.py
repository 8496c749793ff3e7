"""A mixture-of-experts feed-forward block, as llama.cpp's llm_graph_context::build_moe_ffn:
a router scores every expert for each token, the top n_expert_used are run, and their
outputs are summed weighted by the router's probabilities.

    logits  = gate_inp · x (+ gate_inp_b)      [n_expert, n_tokens]
    probs   = gating(logits)                    softmax, sigmoid, or the logits themselves
    chosen  = argsort_top_k(probs (+ probs_b), n_used)    [n_used, n_tokens]
    weights = probs[chosen]                     (softmax over the chosen with SOFTMAX_WEIGHT;
                                                 normalised to sum 1 with norm_w; times w_scale)
    out     = Σ_e weights[e] · (down_e(act(gate_e · x + gate_b_e) * (up_e · x + up_b_e)) + down_b_e)

Each expert product is one mul_mat_id over the [n_embd, n_ff, n_expert] weights of all
experts; the experts' biases are added with add_id. The tensors are the layer's attributes
from TensorTable.add_moe_ffn. The nodes are named as llama.cpp names them (ffn_moe_logits,
ffn_moe_probs, ...).
"""
from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from ggmlpy.ir import Tensor
from llama.graph import FfnOp, NormType, ffn_activation
from llama.hparams import HParamsError, MetadataReader
from llama.weights import TensorLoadError

if TYPE_CHECKING:
    from types import SimpleNamespace

    from llama.graph import LlmGraph

# llama.cpp clamps the sum of the selected weights to the smallest normal f16 before dividing
WEIGHTS_SUM_MIN = 6.103515625e-5

# the activation's node name, with a gate and without (llama.cpp's names)
_ACT_NAMES = {FfnOp.SILU: ("ffn_moe_swiglu", "ffn_moe_silu"), FfnOp.GELU: ("ffn_moe_geglu", "ffn_moe_gelu"),
              FfnOp.RELU: ("ffn_moe_reglu", "ffn_moe_relu"), FfnOp.SWIGLU_OAI: ("ffn_moe_swiglu_oai", "")}


class Gating(Enum):
    """How the router's logits become expert probabilities (llama_expert_gating_func_type;
    the value is the number a file's `{arch}.expert_gating_func` gives)."""

    SOFTMAX = 1
    SIGMOID = 2
    SOFTMAX_WEIGHT = 3   # pick by the raw logits, softmax over the picked (gpt-oss)
    SQRT_SOFTPLUS = 4    # sqrt(softplus(logits))


def read_gating(r: MetadataReader, default: Gating) -> Gating:
    """The file's `expert_gating_func` (0 or absent: `default`), refused by name when it is
    none of llama.cpp's."""
    value = r.int("expert_gating_func", 0) or default.value
    try:
        return Gating(value)
    except ValueError:
        raise HParamsError(f"{r.key('expert_gating_func')} {value} is not a gating function "
                           f"(1 softmax, 2 sigmoid, 3 softmax over the chosen, 4 sqrt-softplus)") from None


def build_moe_block(g: "LlmGraph", layer: "SimpleNamespace", x: Tensor, act: FfnOp, norm_w: bool, il: int,
                    gating: Gating = Gating.SOFTMAX) -> Tensor:
    """The FFN half of a pre-norm decoder layer with experts: ffn_norm, the experts of the
    layer, and the residual add (`l_out`)."""
    cur = g.cb(g.build_norm(x, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
    cur = build_moe_ffn(g, cur, layer, act, norm_w, il, gating)
    return g.cb(g.b.add(cur, x), "l_out", il)


def mask_unused_groups(g: "LlmGraph", selection: Tensor, il: int) -> Tensor:
    """DeepSeek V3's grouped routing (llama.cpp's n_expert_groups): the experts form
    hp.n_expert_groups equal groups, each scored by the sum of its two best experts; the
    experts outside the n_group_used best groups get -inf, so the top-k picks none of them.
    llama.cpp fills with ggml_fill; x * 0 - inf is the same for the finite scores."""
    b, hp = g.b, g.hp
    n_groups = hp.n_expert_groups
    n_tokens = selection.ne[1]
    groups = b.reshape(selection, hp.n_expert // n_groups, n_groups, n_tokens)   # [per group, groups, tokens]
    best2 = b.argsort_top_k(groups, 2)                                            # [2, groups, tokens]
    best2 = b.get_rows(b.reshape(groups, 1, groups.ne[0], n_groups, n_tokens), best2)
    scores = b.reshape(b.sum_rows(b.reshape(best2, 2, n_groups, n_tokens)), n_groups, n_tokens)
    chosen = g.cb(b.argsort_top_k(scores, hp.n_group_used), "ffn_moe_group_topk", il)  # [used, tokens]
    kept = b.get_rows(groups, chosen)                                             # [per group, used, tokens]
    masked = b.set_rows(b.scale_bias(groups, 0.0, float("-inf")), kept, chosen)
    return g.cb(b.reshape(masked, hp.n_expert, n_tokens), "ffn_moe_probs_masked", il)


def build_moe_ffn(g: "LlmGraph", cur: Tensor, layer: "SimpleNamespace", act: FfnOp, norm_w: bool, il: int,
                  gating: Gating = Gating.SOFTMAX, logits: Tensor | None = None) -> Tensor:
    """The block's output [n_embd, n_tokens] for its input cur [n_embd, n_tokens], from the
    layer's router and experts (ffn_gate_inp, ffn_{gate,up,down}_exps and their optional
    biases); n_expert, n_expert_used and the weights' scale are the model's. `logits`: the
    router's scores when the model computes them itself from another input (Gemma 4's
    probs_in), instead of ffn_gate_inp · cur."""
    b, hp = g.b, g.hp
    n_expert, n_used = hp.n_expert, hp.n_expert_used
    n_embd, n_tokens = cur.ne[0], cur.ne[1]
    if logits is None:
        logits = g.cb(g.build_lora_mm(layer.ffn_gate_inp, cur), "ffn_moe_logits", il)   # [n_expert, n_tokens]
    if layer.ffn_gate_inp_b is not None:
        logits = g.cb(b.add(logits, g.w(layer.ffn_gate_inp_b)), "ffn_moe_logits_biased", il)
    probs = {Gating.SOFTMAX: b.soft_max, Gating.SIGMOID: b.sigmoid, Gating.SOFTMAX_WEIGHT: lambda t: t,
             Gating.SQRT_SOFTPLUS: lambda t: b.sqrt(b.softplus(t))}[gating](logits)
    probs = g.cb(probs, "ffn_moe_probs", il)
    selection = probs
    if layer.ffn_exp_probs_b is not None:   # biases the choice, not the weights
        selection = g.cb(b.add(probs, g.w(layer.ffn_exp_probs_b)), "ffn_moe_probs_biased", il)
    if hp.n_expert_groups > 1:
        selection = mask_unused_groups(g, selection, il)
    selected = b.argsort_top_k(selection, n_used)                                 # [n_used, n_tokens]
    g.cb(selected.src[0], "ffn_moe_argsort", il)
    selected = g.cb(selected, "ffn_moe_topk", il)
    weights = b.get_rows(b.reshape(probs, 1, n_expert, n_tokens), selected)       # [1, n_used, n_tokens]
    weights = g.cb(weights, "ffn_moe_weights", il)
    if gating is Gating.SOFTMAX_WEIGHT:
        weights = b.reshape(b.soft_max(b.reshape(weights, n_used, n_tokens)), 1, n_used, n_tokens)
        weights = g.cb(weights, "ffn_moe_weights_softmax", il)
    if norm_w:
        w2 = b.reshape(weights, n_used, n_tokens)
        total = b.clamp(b.sum_rows(w2), WEIGHTS_SUM_MIN, float(np.finfo(np.float32).max))
        weights = b.reshape(b.div(w2, total), 1, n_used, n_tokens)
        weights = g.cb(weights, "ffn_moe_weights_norm", il)
    if hp.expert_weights_scale not in (0.0, 1.0):
        weights = g.cb(b.scale(weights, hp.expert_weights_scale), "ffn_moe_weights_scaled", il)

    def experts(w, bias, x: Tensor, name: str) -> Tensor:
        out = g.cb(b.mul_mat_id(g.w(w), x, selected), name, il)                  # [n_out, n_used, n_tokens]
        if bias is not None:
            out = g.cb(b.add_id(out, g.w(bias), selected), name + "_biased", il)
        return out

    x = b.reshape(cur, n_embd, 1, n_tokens)
    gated, plain = _ACT_NAMES[act]
    if layer.ffn_gate_up_exps is not None:   # one product, then the gate's and up's rows apart
        gate_up = experts(layer.ffn_gate_up_exps, None, x, "ffn_moe_gate_up")
        n_ff = gate_up.ne[0] // 2
        gate, up = (b.cont(b.view(gate_up, (n_ff, n_used, n_tokens), gate_up.nb[1:3], off * gate_up.nb[0]))
                    for off in (0, n_ff))
        h = g.cb(ffn_activation(b, act, up, gate), gated, il)
    elif layer.ffn_up_exps is None:
        raise TensorLoadError(f"{hp.arch} layer {il}: the file has neither blk.{il}.ffn_gate_up_exps.weight "
                              f"nor blk.{il}.ffn_up_exps.weight")
    elif layer.ffn_gate_exps is not None:
        up = experts(layer.ffn_up_exps, layer.ffn_up_exps_b, x, "ffn_moe_up")
        gate = experts(layer.ffn_gate_exps, layer.ffn_gate_exps_b, x, "ffn_moe_gate")
        h = g.cb(ffn_activation(b, act, up, gate), gated, il)
    else:
        up = experts(layer.ffn_up_exps, layer.ffn_up_exps_b, x, "ffn_moe_up")
        h = g.cb(ffn_activation(b, act, up), plain, il)
    down = experts(layer.ffn_down_exps, layer.ffn_down_exps_b, h, "ffn_moe_down")  # [n_embd, n_used, n_tokens]
    if layer.ffn_down_exps_s is not None:
        # each selected expert's scale [1, n_used, n_tokens], gathered as the weights are from
        # the scales repeated over the tokens (llama.cpp's repeat_4d: here 0 * probs + s,
        # exact since the probabilities are finite)
        per_token = b.add(b.scale(b.reshape(probs, 1, n_expert, n_tokens), 0.0),
                          b.reshape(g.w(layer.ffn_down_exps_s), 1, n_expert, 1))
        down = g.cb(b.mul(down, b.get_rows(per_token, selected)), "ffn_moe_down_scaled", il)
    down = g.cb(b.mul(down, weights), "ffn_moe_weighted", il)

    # the sum over the selected experts, one view of `down` each, added in order
    views = [b.view(down, (n_embd, n_tokens), (down.nb[2],), i * down.nb[1]) for i in range(n_used)]
    out = views[0]
    for v in views[1:]:
        out = b.add(out, v)
    if n_used == 1:
        out = b.cont(out)
    return g.cb(out, "ffn_moe_out", il)
