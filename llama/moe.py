"""A mixture-of-experts feed-forward block, as llama.cpp's llm_graph_context::build_moe_ffn:
a router scores every expert for each token, the top n_expert_used are run, and their
outputs are summed weighted by the router's probabilities.

    logits  = gate_inp · x                     [n_expert, n_tokens]
    probs   = softmax(logits)                   (the gating function)
    chosen  = argsort_top_k(probs, n_used)      [n_used, n_tokens]
    weights = probs[chosen]                     (normalised to sum 1 with norm_w; times w_scale)
    out     = Σ_e weights[e] · down_e(act(gate_e · x) * (up_e · x))

Each expert product is one mul_mat_id over the [n_embd, n_ff, n_expert] weights of all
experts. The nodes are named as llama.cpp names them (ffn_moe_logits, ffn_moe_probs, ...).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ggmlpy.ir import Tensor
from llama.graph import FfnOp, NormType, ffn_activation

if TYPE_CHECKING:
    from llama.graph import LlmGraph
    from llama.weights import WeightRef

# llama.cpp clamps the sum of the selected weights to the smallest normal f16 before dividing
WEIGHTS_SUM_MIN = 6.103515625e-5


def build_moe_block(g: "LlmGraph", layer, x: Tensor, act: FfnOp, norm_w: bool, il: int) -> Tensor:
    """The FFN half of a pre-norm decoder layer with experts: ffn_norm, the experts of the
    layer's ffn_gate_inp / ffn_{gate,up,down}_exps, and the residual add (`l_out`)."""
    hp = g.hp
    cur = g.cb(g.build_norm(x, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
    cur = build_moe_ffn(g, cur, layer.ffn_gate_inp, layer.ffn_up_exps, layer.ffn_gate_exps, layer.ffn_down_exps,
                        hp.n_expert, hp.n_expert_used, act, norm_w, hp.expert_weights_scale, il)
    return g.cb(g.b.add(cur, x), "l_out", il)


def build_moe_ffn(g: "LlmGraph", cur: Tensor, gate_inp: "WeightRef", up_exps: "WeightRef",
                  gate_exps: "WeightRef | None", down_exps: "WeightRef", n_expert: int, n_expert_used: int,
                  act: FfnOp, norm_w: bool, w_scale: float, il: int) -> Tensor:
    """The block's output [n_embd, n_tokens] for its input cur [n_embd, n_tokens]. The
    router's gating function is softmax (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX,
    what these architectures use; DeepSeek's sigmoid is not here yet)."""
    b = g.b
    n_embd, n_tokens = cur.ne[0], cur.ne[1]
    logits = g.cb(g.build_lora_mm(gate_inp, cur), "ffn_moe_logits", il)           # [n_expert, n_tokens]
    probs = g.cb(b.soft_max(logits), "ffn_moe_probs", il)
    selected = b.argsort_top_k(probs, n_expert_used)                               # [n_used, n_tokens]
    g.cb(selected.src[0], "ffn_moe_argsort", il)
    selected = g.cb(selected, "ffn_moe_topk", il)
    weights = b.get_rows(b.reshape(probs, 1, n_expert, n_tokens), selected)       # [1, n_used, n_tokens]
    weights = g.cb(weights, "ffn_moe_weights", il)
    if norm_w:
        w2 = b.reshape(weights, n_expert_used, n_tokens)
        total = b.clamp(b.sum_rows(w2), WEIGHTS_SUM_MIN, float(np.finfo(np.float32).max))
        weights = b.reshape(b.div(w2, total), 1, n_expert_used, n_tokens)
        weights = g.cb(weights, "ffn_moe_weights_norm", il)
    if w_scale not in (0.0, 1.0):
        weights = g.cb(b.scale(weights, w_scale), "ffn_moe_weights_scaled", il)

    x = b.reshape(cur, n_embd, 1, n_tokens)
    up = g.cb(b.mul_mat_id(g.w(up_exps), x, selected), "ffn_moe_up", il)          # [n_ff, n_used, n_tokens]
    if gate_exps is not None:
        gate = g.cb(b.mul_mat_id(g.w(gate_exps), x, selected), "ffn_moe_gate", il)
        h = g.cb(ffn_activation(b, act, up, gate), f"ffn_moe_{act.value}glu", il)
    else:
        h = g.cb(ffn_activation(b, act, up), f"ffn_moe_{act.value}", il)
    experts = g.cb(b.mul_mat_id(g.w(down_exps), h, selected), "ffn_moe_down", il)  # [n_embd, n_used, n_tokens]
    experts = g.cb(b.mul(experts, weights), "ffn_moe_weighted", il)

    # the sum over the selected experts, one view of `experts` each, added in order
    views = [b.view(experts, (n_embd, n_tokens), (experts.nb[2],), i * experts.nb[1]) for i in range(n_expert_used)]
    out = views[0]
    for v in views[1:]:
        out = b.add(out, v)
    if n_expert_used == 1:
        out = b.cont(out)
    return g.cb(out, "ffn_moe_out", il)
