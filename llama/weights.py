"""Tensor tables: what tensors an architecture expects, checked against the file.

A model file declares its tensors like llama_model::load_tensors does (`create_tensor` with
an expected shape, optional or not); `TensorTable.resolve` checks every one against the
GGUF and hands back `WeightRef`s grouped like llama.cpp's `model.layers[il].wq`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from types import SimpleNamespace
from typing import Mapping

from ggmlpy.gguf import TensorInfo
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import dequantizable_types
from llama.arch import UnsupportedModel
from llama.hparams import HParams


class TensorLoadError(ValueError):
    """A tensor is missing, misshapen, or unexpected."""


class UnsupportedTensorType(UnsupportedModel):
    """A tensor's type is one the engine cannot compute (no dequantisation for it)."""


def check_tensor_types(tensors: Mapping[str, TensorInfo]) -> None:
    """Refuse a file with a tensor of a type the engine cannot compute, naming the tensor.

    Every backend falls back to the reference backend, which computes any type the quants
    package dequantises; a type outside that set (IQ4_NL, say, from llama-quantize) would
    otherwise load and fail deep inside the first decode."""
    supported = frozenset(dequantizable_types())
    bad = [info for info in tensors.values() if info.type not in supported]
    if not bad:
        return
    first = bad[0]
    others = sorted({info.type.name for info in bad})
    more = f"; {len(bad) - 1} more tensors of such types ({', '.join(others)})" if len(bad) > 1 else ""
    raise UnsupportedTensorType(
        f"tensor {first.name!r} has type {first.type.name}, which this engine cannot compute{more} "
        f"(supported types: {', '.join(t.name for t in sorted(supported))})")


@dataclass(frozen=True)
class WeightRef:
    """A model weight: the name the graph binds and the file tensor behind it."""

    name: str
    type: GGMLType
    ne: tuple[int, ...]


class Need(Enum):
    """How an architecture expects a tensor, as llama.cpp's create_tensor flags.

    UNUSED: the architecture has no such tensor; its attribute reads None, like a null
    field of llama.cpp's llama_layer, so shared builders test it instead of probing.
    """

    REQUIRED = "required"
    OPTIONAL = "optional"  # TENSOR_NOT_REQUIRED
    UNUSED = "unused"


@dataclass
class _Spec:
    attr: str
    name: str
    ne: tuple[int, ...]
    need: Need


@dataclass
class TensorTable:
    globals: list[_Spec] = field(default_factory=list)
    layers: list[list[_Spec]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)   # name prefixes the file may have, unused

    def ignore(self, prefix: str) -> None:
        """Tensors whose names start with prefix are known and left unused (GLM-4.5's
        multi-token-prediction layer), not refused as unknown."""
        self.ignored.append(prefix)

    def ignore_nextn(self, hp: HParams) -> None:
        """The blocks of a multi-token-prediction head (hparams.load_nextn) are left unused."""
        for il in range(hp.n_layer, hp.extra.get("n_layer_all", hp.n_layer)):
            self.ignore(f"blk.{il}.")

    def add(self, attr: str, name: str, ne: tuple[int, ...], optional: bool = False) -> None:
        self.globals.append(_Spec(attr, name, tuple(ne), Need.OPTIONAL if optional else Need.REQUIRED))

    def add_layer(self, il: int, attr: str, name: str, ne: tuple[int, ...], optional: bool = False) -> None:
        self._add_layer(il, attr, name, ne, Need.OPTIONAL if optional else Need.REQUIRED)

    def _add_layer(self, il: int, attr: str, name: str, ne: tuple[int, ...], need: Need) -> None:
        while len(self.layers) <= il:
            self.layers.append([])
        self.layers[il].append(_Spec(attr, f"blk.{il}.{name}", tuple(ne), need))

    def add_attention(self, il: int, hp: HParams, qkv: Need = Need.REQUIRED,
                      fused_qkv: Need = Need.UNUSED, qkv_bias: Need = Need.UNUSED,
                      out_bias: Need = Need.UNUSED, qk_norm: Need = Need.UNUSED,
                      qk_norm_rows: bool = False) -> None:
        """The attention tensors of layer il: wqkv, wq, wk, wv, wo, bq, bk, bv, bo,
        attn_q_norm and attn_k_norm, every one an attribute of the layer (None where UNUSED
        or absent), so LlmGraph.build_qkv_rope reads any architecture's layer the same way.
        A file with `fused_qkv` and `qkv` both OPTIONAL may have either (phi3); the graph
        checks that one of them is there. The q/k norms are one head wide, or with
        `qk_norm_rows` as wide as all of Q's and K's heads (OLMoE normalises whole rows)."""
        n_embd, head_k = hp.n_embd, hp.head_k(il)
        n_q, n_k, n_v = head_k * hp.n_head[il], hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
        n_out = hp.head_v(il) * hp.n_head[il]  # the attention output's width
        self._add_layer(il, "wqkv", "attn_qkv.weight", (n_embd, n_q + n_k + n_v), fused_qkv)
        self._add_layer(il, "wq", "attn_q.weight", (n_embd, n_q), qkv)
        self._add_layer(il, "wk", "attn_k.weight", (n_embd, n_k), qkv)
        self._add_layer(il, "wv", "attn_v.weight", (n_embd, n_v), qkv)
        self._add_layer(il, "wo", "attn_output.weight", (n_out, n_embd), Need.REQUIRED)
        self._add_layer(il, "bq", "attn_q.bias", (n_q,), qkv_bias)
        self._add_layer(il, "bk", "attn_k.bias", (n_k,), qkv_bias)
        self._add_layer(il, "bv", "attn_v.bias", (n_v,), qkv_bias)
        self._add_layer(il, "bo", "attn_output.bias", (n_embd,), out_bias)
        self._add_layer(il, "attn_q_norm", "attn_q_norm.weight", (n_q if qk_norm_rows else head_k,), qk_norm)
        self._add_layer(il, "attn_k_norm", "attn_k_norm.weight", (n_k if qk_norm_rows else head_k,), qk_norm)

    def add_gated_ffn(self, il: int, n_embd: int, n_ff: int) -> None:
        """The gate, up and down projections of a GLU feed-forward block."""
        self.add_layer(il, "ffn_gate", "ffn_gate.weight", (n_embd, n_ff))
        self.add_layer(il, "ffn_up", "ffn_up.weight", (n_embd, n_ff))
        self.add_layer(il, "ffn_down", "ffn_down.weight", (n_ff, n_embd))

    def add_shared_experts(self, il: int, n_embd: int, n_ff_shexp: int) -> None:
        """The shared experts beside a mixture of experts, one GLU block every token runs
        (ffn_{gate,up,down}_shexp)."""
        self.add_layer(il, "ffn_gate_shexp", "ffn_gate_shexp.weight", (n_embd, n_ff_shexp))
        self.add_layer(il, "ffn_up_shexp", "ffn_up_shexp.weight", (n_embd, n_ff_shexp))
        self.add_layer(il, "ffn_down_shexp", "ffn_down_shexp.weight", (n_ff_shexp, n_embd))

    def add_moe_ffn(self, il: int, n_embd: int, n_ff_exp: int, n_expert: int, gate: Need = Need.REQUIRED,
                    biases: Need = Need.UNUSED, probs_bias: Need = Need.UNUSED, gate_up: Need = Need.UNUSED,
                    down_scale: Need = Need.UNUSED, present: Need = Need.REQUIRED) -> None:
        """A mixture-of-experts block: the router and every expert's gate (optional in
        Mixtral's files: then act(up)), up and down projections, stacked [n_in, n_out,
        n_expert]; with `biases` the router's and every expert's biases (gpt-oss; an
        expert's bias row is column e of [n_out, n_expert]), with `probs_bias` the bias added
        to the router's scores for choosing experts only (DeepSeek V3's exp_probs_b). With
        `gate_up` a file may stack each expert's gate and up rows in one ffn_gate_up_exps
        (then the separate ones are optional: Gemma 4); `down_scale` is a scale per expert
        on its down projection's output (ffn_down_exps.scale). With `present` OPTIONAL the
        layer may have no experts at all (Gemma 4 decides per layer by the router's
        presence): nothing here is then required, and the graph checks a layer that has a
        router. Every one is an attribute of the layer (None where UNUSED), as build_moe_ffn
        reads them."""
        def need(n: Need) -> Need:
            return Need.OPTIONAL if present is Need.OPTIONAL and n is Need.REQUIRED else n

        split = Need.OPTIONAL if gate_up is not Need.UNUSED else Need.REQUIRED
        self._add_layer(il, "ffn_gate_inp", "ffn_gate_inp.weight", (n_embd, n_expert), need(Need.REQUIRED))
        self._add_layer(il, "ffn_gate_up_exps", "ffn_gate_up_exps.weight", (n_embd, 2 * n_ff_exp, n_expert), gate_up)
        self._add_layer(il, "ffn_gate_exps", "ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert),
                        need(Need.OPTIONAL if gate is Need.REQUIRED and split is Need.OPTIONAL else gate))
        self._add_layer(il, "ffn_up_exps", "ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), need(split))
        self._add_layer(il, "ffn_down_exps_s", "ffn_down_exps.scale", (n_expert,), down_scale)
        self._add_layer(il, "ffn_down_exps", "ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), need(Need.REQUIRED))
        self._add_layer(il, "ffn_gate_inp_b", "ffn_gate_inp.bias", (n_expert,), need(biases))
        self._add_layer(il, "ffn_gate_exps_b", "ffn_gate_exps.bias", (n_ff_exp, n_expert), need(biases))
        self._add_layer(il, "ffn_up_exps_b", "ffn_up_exps.bias", (n_ff_exp, n_expert), need(biases))
        self._add_layer(il, "ffn_down_exps_b", "ffn_down_exps.bias", (n_embd, n_expert), need(biases))
        self._add_layer(il, "ffn_exp_probs_b", "exp_probs_b.bias", (n_expert,), need(probs_bias))

    def resolve(self, tensors: Mapping[str, TensorInfo], strict: bool = True
                ) -> tuple[SimpleNamespace, list[SimpleNamespace]]:
        used: set[str] = set()

        def one(spec: _Spec) -> WeightRef | None:
            if spec.need is Need.UNUSED:
                return None  # a file tensor of that name stays unused: strict rejects it
            info = tensors.get(spec.name)
            if info is None:
                if spec.need is Need.OPTIONAL:
                    return None
                raise TensorLoadError(f"missing tensor {spec.name!r}")
            ne = tuple(info.ne) + (1,) * (len(spec.ne) - len(info.ne))
            if ne[: len(spec.ne)] != spec.ne or any(n != 1 for n in ne[len(spec.ne):]):
                raise TensorLoadError(f"tensor {spec.name!r} has shape {list(info.ne)}, "
                                      f"expected {list(spec.ne)}")
            used.add(spec.name)
            return WeightRef(spec.name, info.type, tuple(info.ne))

        top = SimpleNamespace(**{s.attr: one(s) for s in self.globals})
        layers = [SimpleNamespace(**{s.attr: one(s) for s in specs}) for specs in self.layers]
        extra = sorted(n for n in set(tensors) - used if not n.startswith(tuple(self.ignored)))
        if strict and extra:
            raise TensorLoadError(f"the file has {len(extra)} tensors this architecture does not "
                                  f"use: {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
        return top, layers
