"""Shared graph builders, as llama.cpp's llm_graph_context: inputs, norms, FFN, attention.

Architecture files (llama/models/*.py) compose these the way src/models/*.cpp compose
build_norm, build_ffn and build_attn, so a reader of llama.cpp finds the same structure.
Every tensor gets a layer-indexed name (`attn_norm-3`) so dumps read well.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from types import SimpleNamespace
from typing import TYPE_CHECKING, Callable

from ggmlpy.ir import N_KV, N_OUTPUTS, N_TOKENS, GGMLType, Graph, GraphBuilder, Tensor
from ggmlpy.ir.symbolic import N_KV_SWA
from llama.graph_inputs import (
    GraphInput, GraphParams, InpAttnKV, InpEmbd, InpOutIds, InpPos, InpRS, InpTokens,
)
from llama.hparams import HParams
from llama.kv_attention import build_kv_attn
from llama.lora_scales import InpLoraScale, LoraScales, output_leaf, token_leaf
from llama.weights import TensorLoadError, WeightRef

if TYPE_CHECKING:
    from llama.model import Model


class NormType(Enum):
    """build_norm's normalisation, llama.cpp's llm_norm_type."""

    NORM = "norm"  # LLM_NORM: layer norm (mean and variance)
    RMS = "rms"    # LLM_NORM_RMS


class FfnOp(Enum):
    """build_ffn's activation, llama.cpp's llm_ffn_op_type; the value names the GLU node
    (`ffn_siluglu`, `ffn_geluglu`)."""

    SILU = "silu"
    GELU = "gelu"  # tanh approximation, as ggml_gelu
    RELU = "relu"
    SWIGLU_OAI = "swiglu_oai"  # gpt-oss's clamped SwiGLU (gated only)


# gpt-oss's SwiGLU constants (llama.cpp's build_moe_ffn has them inline too)
SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0


def ffn_activation(b: GraphBuilder, act: FfnOp, up: Tensor, gate: Tensor | None = None) -> Tensor:
    """act(gate) * up with a gate (the GLU ops), act(up) without."""
    if gate is not None:
        if act is FfnOp.SWIGLU_OAI:
            return b.swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT)
        return {FfnOp.SILU: b.swiglu, FfnOp.GELU: b.geglu}[act](gate, up)
    if act is FfnOp.SWIGLU_OAI:
        raise ValueError("the SwiGLU-OAI activation needs a gate")
    return {FfnOp.SILU: b.silu, FfnOp.GELU: b.gelu, FfnOp.RELU: b.relu}[act](up)


@dataclass
class KVLayout:
    """The KV cache as the graph sees it: cell count and element types.

    kv_size_swa > 0: the sliding-window layers have their own cache of that many cells
    (llama.cpp's llama_kv_cache_iswa), with its own write indices, mask and `n_kv_swa`.
    """

    kv_size: int
    type_k: GGMLType = GGMLType.F16
    type_v: GGMLType = GGMLType.F16
    kv_size_swa: int = 0
    rs_rows: int = 0   # rows of each recurrent state buffer (hybrid models)
    rot_k: int = 0     # Hadamard rotation of Q and K, V (0: none; llama/kv_types.py)
    rot_v: int = 0

    def separate_swa(self, hp: HParams, il: int) -> bool:
        """Whether layer il lives in the separate sliding-window cache."""
        return bool(self.kv_size_swa) and hp.is_swa(il)

    def size_of(self, hp: HParams, il: int) -> int:
        return self.kv_size_swa if self.separate_swa(hp, il) else self.kv_size


@dataclass
class BuiltGraph:
    graph: Graph
    output: Tensor  # the logits; t_embd in an embeddings graph (params.embeddings)
    inputs: list[GraphInput]
    params: GraphParams


@dataclass
class LlmGraph:
    model: "Model"
    kv: KVLayout
    params: GraphParams
    b: GraphBuilder = field(default_factory=GraphBuilder)
    inputs: list[GraphInput] = field(default_factory=list)
    _leaves: dict[str, Tensor] = field(default_factory=dict)
    t_embd: Tensor | None = None  # the final normed hidden states, as llama.cpp's res->t_embd
    # the context's adapter scales; the graph adapts the products of params.loras' adapters
    lora_scales: LoraScales | None = None
    _lora_inputs: dict[int, InpLoraScale] = field(default_factory=dict)
    # nodes the graph runs for their writes alone (recurrent states stored for the next
    # ubatch), as llama.cpp's ggml_build_forward_expand of a copy nothing reads
    side_effects: list[Tensor] = field(default_factory=list)
    # each cache layer's K and V after this ubatch's write (what later layers that share it read)
    kv_stored: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)
    # nodes to order first (as llama.cpp's early ggml_build_forward_expand): host lookups that
    # would otherwise split a device's work in two where a later layer first reads them
    first: list[Tensor] = field(default_factory=list)
    inp_tokens: Tensor | None = None   # the token ids, in a graph of tokens (build_inp_embd)

    @property
    def hp(self) -> HParams:
        return self.model.hparams

    # weights ---------------------------------------------------------------------------------
    def w(self, ref: WeightRef | None) -> Tensor | None:
        """The graph leaf for a model weight (None stays None: optional tensors)."""
        if ref is None:
            return None
        t = self._leaves.get(ref.name)
        if t is None:
            t = self.b.weight(ref.name, ref.type, ref.ne, file_layout=not self.model.repack)
            self._leaves[ref.name] = t
        return t

    def cb(self, t: Tensor, name: str, il: int = -1) -> Tensor:
        """Name t. "result_norm" (the output norm, before the projection) is also recorded as
        t_embd, as every llama.cpp model file does right after naming it."""
        if name == "result_norm":
            self.t_embd = t
        return self.b.name(t, name, il)

    # inputs ----------------------------------------------------------------------------------
    def build_inp_embd(self, tok_embd: WeightRef) -> Tensor:
        if self.params.use_embd:
            self.inputs.append(InpEmbd())
            return self.b.input("inp_embd", GGMLType.F32, (self.hp.n_embd, N_TOKENS))
        self.inputs.append(InpTokens())
        tokens = self.inp_tokens = self.b.input("inp_tokens", GGMLType.I32, (N_TOKENS,))
        cur = self.b.get_rows(self.w(tok_embd), tokens)
        for adapter in self.loras():
            lw = adapter.token_embd
            if lw is None:
                continue
            # the embedding's pair is stored transposed: A's rows are looked up by token
            delta = self.b.mul_mat(self.w(lw.b), self.b.get_rows(self.w(lw.a), tokens))
            cur = self.b.add(cur, self._lora_scaled(delta, adapter, lw.alpha_scale))
        return self.cb(cur, "inp_embd")

    def build_inp_pos(self) -> Tensor:
        n_pos = self.hp.n_pos_per_embd
        self.inputs.append(InpPos(n_pos))
        return self.b.input("inp_pos", GGMLType.I32, (N_TOKENS * n_pos,))

    def build_inp_rs(self) -> "RSInput":
        """The rows of the recurrent states the ubatch's sequences read and write."""
        self.inputs.append(InpRS())
        _, n_seqs = self.rs_dims()
        return RSInput(self.b.input("inp_rs_src", GGMLType.I32, (n_seqs,)),
                       self.b.input("inp_rs_dst", GGMLType.I64, (n_seqs,)))

    def rs_dims(self) -> tuple:
        """(n_seq_tokens, n_seqs) of the ubatch for the recurrent layers: one sequence of
        n_tokens, or n_tokens sequences of one token (GraphParams.rs_layout)."""
        if self.params.rs_layout == "seq":
            return N_TOKENS, 1
        if self.params.rs_layout == "tokens":
            return 1, N_TOKENS
        raise ValueError(f"{self.hp.arch}: a graph with recurrent layers needs rs_layout 'seq' or 'tokens', "
                         f"got {self.params.rs_layout!r}")

    def build_inp_out_ids(self) -> Tensor | None:
        """The rows of the last layer that reach the output; None in the one-token graph,
        whose one token is always an output (llama.cpp's "when all tokens are output, we
        could skip this": the selection would copy the row onto itself, in two launches)."""
        if self.params.tokens_class == "single":
            return None
        self.inputs.append(InpOutIds())
        return self.b.input("inp_out_ids", GGMLType.I32, (N_OUTPUTS,))

    def build_layer_inputs(self) -> "LayerInputs":
        """inp_pos, the attention's KV input and inp_out_ids, in that order: what every
        decoder layer reads besides the residual stream."""
        return LayerInputs(self.build_inp_pos(), self.build_attn_inp_kv(), self.build_inp_out_ids())

    def build_inp_embd_scaled(self, tok_embd: WeightRef, scale_input_embd: bool = False) -> Tensor:
        """The token embeddings times sqrt(n_embd), as every Gemma scales them. Embeddings
        given as input (e.g. of images) are used as they are unless scale_input_embd
        (Gemma 2 scales them too, as llama.cpp's gemma2-iswa does)."""
        return self.scale_inp_embd(self.build_inp_embd(tok_embd), scale_input_embd)

    def scale_inp_embd(self, cur: Tensor, scale_input_embd: bool = False) -> Tensor:
        """build_inp_embd_scaled's scaling of the embeddings build_inp_embd returned."""
        if self.params.use_embd and not scale_input_embd:
            return cur
        return self.cb(self.b.scale(cur, math.sqrt(self.hp.n_embd)), "inp_scaled")

    def build_attn_inp_kv(self) -> "AttnInput":
        """Write indices and masks. With a separate SWA cache (iSWA) its layers get their own
        indices and a mask over `n_kv_swa` cells; with one cache for all layers the SWA
        layers get a second mask over the same `n_kv` cells."""
        hp, b = self.hp, self.b
        iswa = bool(self.kv.kv_size_swa)
        inp = InpAttnKV(n_swa=hp.n_swa if any(hp.swa_layers) else 0,
                        swa_type=hp.extra.get("swa_type", 1), causal=hp.causal_attn, iswa=iswa)
        self.inputs.append(inp)
        k_idxs = b.input("inp_k_idxs", GGMLType.I64, (N_TOKENS,))
        mask = b.input("inp_kq_mask", GGMLType.F32, (N_KV, N_TOKENS))
        if iswa:
            k_idxs_swa = b.input("inp_k_idxs_swa", GGMLType.I64, (N_TOKENS,))
            mask_swa = b.input("inp_kq_mask_swa", GGMLType.F32, (N_KV_SWA, N_TOKENS))
            return AttnInput(k_idxs, mask, mask_swa, k_idxs_swa)
        mask_swa = b.input("inp_kq_mask_swa", GGMLType.F32, (N_KV, N_TOKENS)) if inp.n_swa else None
        return AttnInput(k_idxs, mask, mask_swa)

    # blocks ----------------------------------------------------------------------------------
    def build_norm(self, cur: Tensor, w: WeightRef | None, bias: WeightRef | None, kind: NormType,
                   il: int = -1) -> Tensor:
        hp = self.hp
        if kind is NormType.RMS:
            cur = self.b.rms_norm(cur, hp.f_norm_rms_eps)
        elif kind is NormType.NORM:
            cur = self.b.norm(cur, hp.f_norm_eps)
        else:
            raise ValueError(f"unknown norm kind {kind!r}")
        if w is not None:
            cur = self.b.mul(cur, self.w(w))
        if bias is not None:
            cur = self.b.add(cur, self.w(bias))
        return cur

    def build_lora_mm(self, w: WeightRef, cur: Tensor, bias: WeightRef | None = None) -> Tensor:
        """w·cur, plus s·B·(A·cur) for every adapter of the ubatch that adapts w (llama.cpp's
        build_lora_mm), then the bias."""
        out = self.b.mul_mat(self.w(w), cur)
        for adapter in self.loras():
            lw = adapter.matrix(w.name)
            if lw is not None:
                ab = self.b.mul_mat(self.w(lw.b), self.b.mul_mat(self.w(lw.a), cur))
                out = self.b.add(out, self._lora_scaled(ab, adapter, lw.alpha_scale))
        return self.b.add(out, self.w(bias)) if bias is not None else out

    # LoRA ------------------------------------------------------------------------------------
    def loras(self) -> list:
        """The adapters this graph applies (the ubatch's, params.loras), in id order."""
        if not self.params.loras:
            return []
        return [self.model.loras[i] for i in self.params.loras]

    def _lora_scaled(self, t: Tensor, adapter, alpha_scale: float) -> Tensor:
        """t [n, cols] times each column's token scale (an input: scales change no graph)
        and the pair's alpha/r."""
        if self.lora_scales is None:
            raise ValueError("a graph with LoRA adapters needs the context's scales (lora_scales)")
        inp = self._lora_inputs.get(adapter.id)
        if inp is None:
            inp = self._lora_inputs[adapter.id] = InpLoraScale(adapter, self.lora_scales)
            self.inputs.append(inp)
        cols = t.ne[1]
        if cols == N_TOKENS:
            name = token_leaf(adapter.id)
        elif cols == N_OUTPUTS:
            name, inp.outputs = output_leaf(adapter.id), True
        else:
            raise ValueError(f"a LoRA product over {cols} columns: expected n_tokens or n_outputs")
        leaf = self._leaves.get(name)
        if leaf is None:
            leaf = self._leaves[name] = self.b.input(name, GGMLType.F32, (1, cols))
        scaled = self.b.mul(t, leaf)
        return scaled if alpha_scale == 1.0 else self.b.scale(scaled, alpha_scale)

    def build_ffn(self, cur: Tensor, up: WeightRef, up_b: WeightRef | None, gate: WeightRef | None,
                  gate_b: WeightRef | None, down: WeightRef, down_b: WeightRef | None,
                  act: FfnOp, il: int) -> Tensor:
        """down(act(gate(x)) * up(x)) with a gate (parallel GLU), down(act(up(x))) without."""
        b = self.b
        tmp = self.cb(self.build_lora_mm(up, cur, up_b), "ffn_up", il)
        if gate is not None:
            g = self.cb(self.build_lora_mm(gate, cur, gate_b), "ffn_gate", il)
            cur = self.cb(ffn_activation(b, act, tmp, g), f"ffn_{act.value}glu", il)
        else:
            cur = ffn_activation(b, act, tmp)
        return self.cb(self.build_lora_mm(down, cur, down_b), "ffn_out", il)

    def build_qkv_rope(self, layer: SimpleNamespace, cur: Tensor, inp_pos: Tensor, rope: dict | None,
                       il: int, freq_factors: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Qcur, Kcur, Vcur of a layer (its tensors from TensorTable.add_attention), split
        into heads, Q and K RMS-normalised where the layer has q/k norms (per head, or over
        whole rows where the norm is as wide as all heads: OLMoE), then rotated with `rope`
        (hp.rope_args of the layer; None: no rotation, Granite without RoPE): the block every
        src/models/*.cpp writes out between attn_norm and build_attn.

        Returns q [head_k, n_head, n_tokens], k [head_k, n_head_kv, n_tokens] and
        v [head_v, n_head_kv, n_tokens].
        """
        b = self.b
        q, k, v = self._build_qkv(layer, cur, il)
        q = self._qk_norm(q, layer.attn_q_norm, "Qcur_normed", il)
        k = self._qk_norm(k, layer.attn_k_norm, "Kcur_normed", il)
        if rope is not None:
            q = self.cb(b.rope_ext(q, inp_pos, freq_factors, **rope), "Qcur_rope", il)
            k = self.cb(b.rope_ext(k, inp_pos, freq_factors, **rope), "Kcur_rope", il)
        return q, k, v

    def _qk_norm(self, t: Tensor, w: WeightRef | None, name: str, il: int) -> Tensor:
        """t [head, n_heads, n_tokens] RMS-normalised with w per head, or over each token's
        whole row when w is that wide."""
        if w is None:
            return t
        if w.ne[0] == t.ne[0]:
            return self.cb(self.build_norm(t, w, None, NormType.RMS, il), name, il)
        rows = self.b.reshape(t, t.ne[0] * t.ne[1], t.ne[2])
        normed = self.cb(self.build_norm(rows, w, None, NormType.RMS, il), name, il)
        return self.b.reshape(normed, t.ne[0], t.ne[1], t.ne[2])

    def _build_qkv(self, layer: SimpleNamespace, cur: Tensor, il: int) -> tuple[Tensor, Tensor, Tensor]:
        """The projections, as heads: from the fused attn_qkv when the layer has one (Q, K
        and V are then views of its rows; V is made contiguous), else from wq, wk, wv."""
        b, hp = self.b, self.hp
        hk, hv, n_head, n_head_kv = hp.head_k(il), hp.head_v(il), hp.n_head[il], hp.n_head_kv[il]
        if layer.wqkv is not None:
            return self.split_fused_qkv(self.cb(self.build_lora_mm(layer.wqkv, cur), "wqkv", il), il)
        if layer.wq is None or layer.wk is None or layer.wv is None:
            raise TensorLoadError(f"{hp.arch} layer {il}: the file has neither blk.{il}.attn_qkv.weight "
                                  f"nor all of blk.{il}.attn_q/k/v.weight")
        q = self.cb(self.build_lora_mm(layer.wq, cur, layer.bq), "Qcur", il)
        k = self.cb(self.build_lora_mm(layer.wk, cur, layer.bk), "Kcur", il)
        v = self.cb(self.build_lora_mm(layer.wv, cur, layer.bv), "Vcur", il)
        n_tokens = q.ne[1]
        return (b.reshape(q, hk, n_head, n_tokens), b.reshape(k, hk, n_head_kv, n_tokens),
                b.reshape(v, hv, n_head_kv, n_tokens))

    def split_fused_qkv(self, qkv: Tensor, il: int) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K and V as heads viewing the rows [Q | K | V] of a fused attn_qkv product, so no
        copy is made of Q and K; V is made contiguous, as the cache's V writer needs."""
        b, hp = self.b, self.hp
        hk, hv, n_head, n_head_kv = hp.head_k(il), hp.head_v(il), hp.n_head[il], hp.n_head_kv[il]
        n_tokens, esz, row = qkv.ne[1], qkv.nb[0], qkv.nb[1]
        n_q, n_k = hk * n_head, hp.n_embd_k_gqa(il)
        q = b.view(qkv, (hk, n_head, n_tokens), (esz * hk, row), 0)
        k = b.view(qkv, (hk, n_head_kv, n_tokens), (esz * hk, row), esz * n_q)
        v = b.view(qkv, (hv, n_head_kv, n_tokens), (esz * hv, row), esz * (n_q + n_k))
        return q, k, b.cont(v, hv, n_head_kv, n_tokens)

    def select_out_rows(self, cur: Tensor, residual: Tensor, inp_out_ids: Tensor | None,
                        il: int) -> tuple[Tensor, Tensor]:
        """In the last layer, keep only the rows that reach the output, of the attention
        output and of its residual: the rest of the layer then runs on n_outputs rows
        (llama.cpp's get_rows by inp_out_ids, in every model file)."""
        if il != self.hp.n_layer - 1 or inp_out_ids is None:
            return cur, residual
        return self.b.get_rows(cur, inp_out_ids), self.b.get_rows(residual, inp_out_ids)

    def build_attn_block(self, inp: "LayerInputs", layer: SimpleNamespace, x: Tensor, rope: dict,
                         kq_scale: float, il: int, freq_factors: Tensor | None = None,
                         q_scale: float | None = None, softcap: float = 0.0,
                         post_norm: WeightRef | None = None, name: str = "ffn_inp") -> Tensor:
        """The attention half of a pre-norm decoder layer: attn_norm, Q/K/V with RoPE (Q then
        scaled by q_scale where given), attention with the layer's output bias, in the last
        layer only the output rows, the output RMS-normalised again with post_norm (Gemma 2
        and 3), and the residual add, named `name`."""
        cur = self.cb(self.build_norm(x, layer.attn_norm, None, NormType.RMS, il), "attn_norm", il)
        q, k, v = self.build_qkv_rope(layer, cur, inp.pos, rope, il, freq_factors)
        if q_scale is not None:
            q = self.cb(self.b.scale(q, q_scale), "Qcur_scaled", il)
        cur = self.build_attn(inp.attn, layer.wo, layer.bo, q, k, v, kq_scale, il, softcap=softcap)
        cur, x = self.select_out_rows(cur, x, inp.out_ids, il)
        if post_norm is not None:
            cur = self.cb(self.build_norm(cur, post_norm, None, NormType.RMS, il), "attn_post_norm", il)
        return self.cb(self.b.add(cur, x), name, il)

    def build_ffn_block(self, layer: SimpleNamespace, x: Tensor, act: FfnOp, il: int,
                        post_norm: WeightRef | None = None) -> Tensor:
        """The FFN half of a pre-norm decoder layer: ffn_norm, the gated FFN of the layer's
        ffn_gate/up/down, the output RMS-normalised again with post_norm (Gemma 2 and 3),
        and the residual add (`l_out`)."""
        cur = self.cb(self.build_norm(x, layer.ffn_norm, None, NormType.RMS, il), "ffn_norm", il)
        cur = self.build_ffn(cur, layer.ffn_up, None, layer.ffn_gate, None, layer.ffn_down, None, act, il)
        if post_norm is not None:
            cur = self.cb(self.build_norm(cur, post_norm, None, NormType.RMS, il), "ffn_post_norm", il)
        return self.cb(self.b.add(cur, x), "l_out", il)

    def build_decoder(self, ffn: Callable[[SimpleNamespace, Tensor, int], Tensor]) -> Tensor:
        """The logits of a pre-norm decoder whose layers are LLaMA's attention block
        (build_attn_block: whatever biases and q/k norms the layer has, the layer's RoPE)
        followed by `ffn(layer, ffn_inp, il)`, which returns the layer's output: the loop the
        mixture-of-experts model files share. The output projection is output.weight, or the
        embedding where the file ties them."""
        hp, m = self.hp, self.model
        inp_l = self.build_inp_embd(m.w.tok_embd)
        inp = self.build_layer_inputs()
        kq_scale = self.default_kq_scale(hp)
        for il, layer in enumerate(m.layers):
            ffn_inp = self.build_attn_block(inp, layer, inp_l, hp.rope_args(il), kq_scale, il)
            inp_l = ffn(layer, ffn_inp, il)
        return self.build_output(inp_l, m.w.output_norm, m.w.output or m.w.tok_embd)

    def build_output(self, x: Tensor, output_norm: WeightRef, output: WeightRef,
                     output_b: WeightRef | None = None) -> Tensor:
        """The logits: the final RMS norm (`result_norm`, also t_embd), then the output
        projection and its bias."""
        cur = self.cb(self.build_norm(x, output_norm, None, NormType.RMS), "result_norm")
        return self.build_lora_mm(output, cur, output_b)

    def build_softcap(self, t: Tensor, cap: float) -> Tensor:
        """tanh(t / cap) * cap: Gemma's soft-capping of the final logits."""
        return self.b.scale(self.b.tanh(self.b.scale(t, 1.0 / cap)), cap)

    def build_attn(self, inp: "AttnInput", wo: WeightRef | None, wo_b: WeightRef | None, q_cur: Tensor,
                   k_cur: Tensor | None, v_cur: Tensor | None, kq_scale: float, il: int,
                   softcap: float = 0.0, sinks: WeightRef | None = None,
                   v_mla: WeightRef | None = None) -> Tensor:
        """Store K and V for this ubatch in the cache, attend over the n_kv cells read back
        (llama/kv_attention.py, whatever the cache's type); with `sinks` (gpt-oss), one more
        logit per head joins each softmax. Without `wo` the heads' outputs are returned
        unprojected [head_v * n_head, n_tokens] (Qwen3.5 gates them first).

        q_cur [head_dim, n_head, n_tokens]; k_cur, v_cur [head_dim, n_head_kv, n_tokens], or
        None in a layer that reads an earlier layer's cache (hp.kv_layer). With MLA
        (hp.is_mla) only K is cached; `v_mla` decompresses the heads' outputs.
        """
        cur = build_kv_attn(self, inp, q_cur, k_cur, v_cur, kq_scale, il, softcap=softcap, sinks=sinks,
                            v_mla=v_mla)
        if wo is None:
            return cur
        return self.cb(self.build_lora_mm(wo, cur, wo_b), "attn_out", il)

    def finish(self, logits: Tensor) -> BuiltGraph:
        """The graph of the logits, or in an embeddings graph of t_embd alone: the output
        projection is then left out (llama.cpp extracts no logits for embeddings), which
        for a large vocabulary is the biggest product of the graph."""
        self.cb(logits, "result_output")
        out = logits
        if self.params.embeddings:
            if self.t_embd is None:
                raise ValueError(f"{self.hp.arch}: the graph names no 'result_norm' tensor, "
                                 "so it has no embeddings output")
            out = self.t_embd
        extra = []
        if self.params.nextn and not self.params.embeddings:
            if self.t_embd is None:
                raise ValueError(f"{self.hp.arch}: the graph names no 'result_norm' tensor, "
                                 "so it has no hidden states for a drafter")
            extra.append(self.t_embd)
        graph = self.b.build([out, *extra, *self.side_effects], first=self.first)
        graph.hints["tokens"] = self.params.tokens_class
        return BuiltGraph(graph, out, self.inputs, self.params)

    @staticmethod
    def default_kq_scale(hp: HParams) -> float:
        return 1.0 / math.sqrt(hp.n_embd_head_k)


@dataclass
class AttnInput:
    k_idxs: Tensor
    mask: Tensor
    mask_swa: Tensor | None = None
    k_idxs_swa: Tensor | None = None  # only with a separate SWA cache


@dataclass
class RSInput:
    src: Tensor   # I32 [n_seqs]: the state rows read
    dst: Tensor   # I64 [n_seqs]: the rows the new states go to


@dataclass
class LayerInputs:
    """The inputs every decoder layer reads (LlmGraph.build_layer_inputs)."""

    pos: Tensor
    attn: AttnInput
    out_ids: Tensor | None
