"""Model hyperparameters read from GGUF metadata, as llama_model::load_hparams does.

Common keys first (`{arch}.context_length`, `embedding_length`, ...; head counts may be
per-layer arrays), then the architecture's own keys (its `load_hparams`), rope type last.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ggmlpy.ir.ops.rope import ROPE_MULTI_MODES, ROPE_TYPE_NORM


class HParamsError(ValueError):
    """A required hyperparameter is missing or has an impossible value."""


@dataclass
class HParams:
    arch: str
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: list[int]
    n_head: list[int]
    n_head_kv: list[int]
    n_embd_head_k: int
    n_embd_head_v: int
    n_rot: int
    n_vocab: int
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    rope_scaling_type: str = "none"
    rope_attn_factor: float = 1.0   # rope.scaling.attn_factor
    rope_yarn_log_mul: float = 0.0  # rope.scaling.yarn_log_multiplier (DeepSeek's mscale_all_dim)
    rope_yarn_mscale: float = 1.0   # YaRN's mscale (DeepSeek V2 sets it to mscale_all_dim)
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    n_ctx_orig_yarn: int = 0
    rope_type: int = ROPE_TYPE_NORM  # or ROPE_TYPE_NEOX (ggmlpy/ir/ops/rope.py)
    f_norm_eps: float = 0.0
    f_norm_rms_eps: float = 0.0
    causal_attn: bool = True
    n_swa: int = 0
    swa_layers: list[bool] = field(default_factory=list)
    rope_freq_base_swa: float = 10000.0
    rope_freq_scale_swa: float = 1.0
    f_attn_logit_softcapping: float = 0.0
    f_final_logit_softcapping: float = 0.0
    f_attention_scale: float = 0.0  # Q scale some architectures apply before attention (0: unset)
    n_expert: int = 0               # mixture of experts: experts per layer (0: a dense model)
    n_expert_used: int = 0          # experts each token runs
    n_ff_exp: int = 0               # an expert's feed-forward width
    expert_weights_scale: float = 0.0  # times the selected experts' weights (0: not applied)
    n_expert_groups: int = 0        # DeepSeek V3's grouped routing: expert groups (<= 1: none)
    n_group_used: int = 0           # the groups a token's experts come from
    # recurrent layers (gated delta-net, Mamba): the `ssm.*` keys, which layers they are
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_dt_rank: int = 0
    ssm_n_group: int = 0
    recurrent_layers: list[bool] = field(default_factory=list)
    rope_sections: tuple[int, int, int, int] = (0, 0, 0, 0)  # multi-section RoPE (rope.dimension_sections)
    # the sliding-window layers' own head sizes and rotary dims (key_length_swa,
    # value_length_swa, rope.dimension_count_swa; 0: the same as the global layers')
    n_embd_head_k_swa: int = 0
    n_embd_head_v_swa: int = 0
    n_rot_swa: int = 0
    # layers from this one on own no KV cache and read an earlier layer's (Gemma 3n/4's
    # shared_kv_layers; -1: every layer has its own)
    n_layer_kv_from_start: int = -1
    n_embd_per_layer: int = 0       # per-layer embedding inputs' width (Gemma 4; 0: none)
    rope_freqs_swa: bool = True     # the sliding-window layers rotate with rope_freqs too (not Gemma 4's)
    # multi-head latent attention (DeepSeek V2/V3): the compressed K/V's and Q's ranks and the
    # heads' sizes once decompressed (key_length_mla, value_length_mla; 0: not MLA, K and V
    # cached per head). With both MLA sizes the cache holds one compressed row per token
    # whose first value_length values are V too (llama.cpp's K-only cache)
    n_lora_q: int = 0
    n_lora_kv: int = 0
    n_embd_head_k_mla: int = 0
    n_embd_head_v_mla: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def head_k(self, il: int) -> int:
        """Layer il's key head size (llama_hparams::n_embd_head_k(il))."""
        return self.n_embd_head_k_swa if self.n_embd_head_k_swa and self.is_swa(il) else self.n_embd_head_k

    def head_v(self, il: int) -> int:
        return self.n_embd_head_v_swa if self.n_embd_head_v_swa and self.is_swa(il) else self.n_embd_head_v

    def rot(self, il: int) -> int:
        """Layer il's rotated dims (llama_hparams::n_rot(il))."""
        return self.n_rot_swa if self.n_rot_swa and self.is_swa(il) else self.n_rot

    def n_embd_k_gqa(self, il: int) -> int:
        return self.head_k(il) * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return self.head_v(il) * self.n_head_kv[il]

    @property
    def is_mla(self) -> bool:
        """Whether attention is MLA with its absorbed form: V is read from K's cache."""
        return bool(self.n_embd_head_k_mla and self.n_embd_head_v_mla)

    def n_embd_v_cache(self, il: int) -> int:
        """Layer il's V cache row: none where V is read from K's cache (MLA)."""
        return 0 if self.is_mla else self.n_embd_v_gqa(il)

    def rope_k_offset(self, il: int) -> int:
        """Where the rotated dims of a cached key head start: after the unrotated ones in
        MLA's keys (compressed or decompressed, K = [nope | rope]), else at 0 (llama.cpp's
        K-shift view)."""
        return self.head_k(il) - self.rot(il) if self.n_lora_kv else 0

    def uses_rope_freqs(self, il: int) -> bool:
        """Whether layer il rotates with the file's frequency factors (rope_freqs.weight),
        where it has them: every layer, or only the global ones (Gemma 4)."""
        return self.rope_freqs_swa or not self.is_swa(il)

    def has_kv(self, il: int) -> bool:
        """Whether layer il stores K and V (llama_hparams::has_kv)."""
        return self.n_layer_kv_from_start < 0 or il < self.n_layer_kv_from_start

    def kv_layer(self, il: int) -> int:
        """The layer whose cache layer il attends over: its own, or for a layer past
        n_layer_kv_from_start the last earlier layer of its kind (the last sliding-window
        one or the last global one), as llama.cpp's layer_reuse callback for Gemma 3n/4."""
        if self.has_kv(il):
            return il
        return self.n_layer_kv_from_start - (2 if self.is_swa(il) else 1)

    def is_recurrent(self, il: int) -> bool:
        return bool(self.recurrent_layers) and self.recurrent_layers[il]

    @property
    def n_embd_r(self) -> int:
        """A recurrent layer's convolution state per sequence: the last d_conv - 1 inputs of
        every channel (llama_hparams::n_embd_r)."""
        return max(self.ssm_d_conv - 1, 0) * (self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state)

    @property
    def n_embd_s(self) -> int:
        """A recurrent layer's state per sequence (llama_hparams::n_embd_s)."""
        return self.ssm_d_state * self.ssm_d_inner

    @property
    def n_pos_per_embd(self) -> int:
        """Positions per token: 4 with multi-section RoPE (t, h, w and an extra one), else 1."""
        return 4 if self.rope_type in ROPE_MULTI_MODES else 1

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers) and self.swa_layers[il]

    def rope_args(self, il: int = 0) -> dict:
        """ggml_rope_ext's parameters for layer il (windowed layers may have their own base).
        A YaRN file (rope.scaling.type yarn) gets llama_context's derivation: ext_factor 1,
        beta fast/slow 32/1, and attn_factor the YaRN magnitude scale over the one ggml's
        rope applies itself (1 + 0.1 ln(1/freq_scale)), times rope.scaling.attn_factor."""
        swa = self.is_swa(il)
        freq_scale = self.rope_freq_scale_swa if swa else self.rope_freq_scale
        ext_factor, attn_factor = 0.0, 1.0
        if self.rope_scaling_type == "yarn":
            ext_factor = 1.0
            factor = 1.0 / freq_scale

            def mscale(scale: float, m: float) -> float:
                return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0
            attn_factor = (mscale(factor, self.rope_yarn_mscale) / mscale(factor, self.rope_yarn_log_mul)
                           if self.rope_yarn_log_mul else mscale(factor, 1.0))
            attn_factor /= 1.0 + 0.1 * math.log(factor)
        return dict(n_dims=self.rot(il), mode=self.rope_type, n_ctx_orig=self.n_ctx_orig_yarn,
                    freq_base=self.rope_freq_base_swa if swa else self.rope_freq_base, freq_scale=freq_scale,
                    ext_factor=ext_factor, attn_factor=float(np.float32(attn_factor * self.rope_attn_factor)),
                    beta_fast=self.yarn_beta_fast, beta_slow=self.yarn_beta_slow)

    def with_rope(self, freq_base: float = 0.0, freq_scale: float = 0.0) -> "HParams":
        """These hparams with a context's RoPE overrides (llama.cpp's cparams.rope_freq_base
        and rope_freq_scale; 0 keeps the model's value). As llama_model::get_rope_freq_base
        does, only the dense layers take them: sliding-window layers keep their own base
        and scale. self when nothing changes; otherwise a copy (the model is shared)."""
        for name, value in (("rope_freq_base", freq_base), ("rope_freq_scale", freq_scale)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0 (0: the model's), got {value!r}")
        base = float(freq_base) or self.rope_freq_base
        scale = float(freq_scale) or self.rope_freq_scale
        if base == self.rope_freq_base and scale == self.rope_freq_scale:
            return self
        return dataclasses.replace(self, rope_freq_base=base, rope_freq_scale=scale,
                                   extra=dict(self.extra))

    def set_swa_pattern(self, n_pattern: int, dense_first: bool = False) -> None:
        """Every n_pattern-th layer is global (dense), the others use the sliding window
        (llama.cpp's llama_hparams::set_swa_pattern): the last of each group of n_pattern
        layers is dense, or the first with `dense_first`. n_pattern 0: every layer SWA,
        1: none."""
        if n_pattern < 0:
            raise HParamsError(f"SWA pattern must be >= 0, got {n_pattern}")
        if n_pattern == 0:
            self.swa_layers = [True] * self.n_layer
        elif dense_first:
            self.swa_layers = [il % n_pattern != 0 for il in range(self.n_layer)]
        else:
            self.swa_layers = [il % n_pattern < n_pattern - 1 for il in range(self.n_layer)]


class MetadataReader:
    """Typed access to `{arch}.*` keys with errors that name the key."""

    def __init__(self, metadata: Mapping[str, Any], arch: str):
        self.md = metadata
        self.arch = arch

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def has(self, suffix: str) -> bool:
        return self.key(suffix) in self.md

    def get(self, suffix: str, default: Any = None, *, required: bool = False) -> Any:
        k = self.key(suffix)
        if k not in self.md:
            if required:
                raise HParamsError(f"required key {k} is missing from the model file")
            return default
        return self.md[k]

    def int(self, suffix: str, default: int | None = None, *, required: bool = False) -> int:
        v = self.get(suffix, default, required=required)
        if v is None:
            return None  # type: ignore[return-value]
        if isinstance(v, np.ndarray) or isinstance(v, (list, tuple)):
            raise HParamsError(f"{self.key(suffix)} is an array, a single integer was expected")
        return int(v)

    def per_layer(self, suffix: str, n_layer: int, default: int | None = None, *,
                  required: bool = False) -> list[int]:
        """A scalar for every layer, or an array with one value per layer."""
        v = self.get(suffix, default, required=required)
        if isinstance(v, (np.ndarray, list, tuple)):
            if len(v) != n_layer:
                raise HParamsError(f"{self.key(suffix)} has {len(v)} entries for {n_layer} layers")
            return [int(x) for x in v]
        return [int(v)] * n_layer


def require_rms_eps(r: MetadataReader, hp: HParams) -> None:
    """The RMS-norm epsilon is a required key for the architectures that use RMS norms
    (llama.cpp's ml.get_key without a default); LLaMA alone falls back to 1e-5."""
    if not hp.f_norm_rms_eps:
        raise HParamsError(f"required key {r.key('attention.layer_norm_rms_epsilon')} is missing")


def load_nextn(r: MetadataReader, hp: HParams) -> None:
    """The file's last `nextn_predict_layers` blocks are a multi-token-prediction head, not
    part of the model's graph (llama_hparams::n_layer() = block_count - n_layer_nextn):
    hp.n_layer counts the others, hp.extra["n_layer_all"] all of them."""
    n_nextn = r.int("nextn_predict_layers", 0)
    if not 0 <= n_nextn < hp.n_layer:
        raise HParamsError(f"{r.key('nextn_predict_layers')} {n_nextn} is not below block_count {hp.n_layer}")
    hp.extra["n_layer_all"] = hp.n_layer
    hp.n_layer -= n_nextn


def load_experts(r: MetadataReader, hp: HParams) -> None:
    """The mixture-of-experts keys, checked as llama.cpp's load_hparams checks them."""
    hp.n_expert = r.int("expert_count", 0)
    hp.n_expert_used = r.int("expert_used_count", 0)
    hp.n_ff_exp = r.int("expert_feed_forward_length", 0)
    hp.expert_weights_scale = float(r.get("expert_weights_scale", 0.0))
    if hp.n_expert <= 0 or hp.n_expert_used <= 0:
        raise HParamsError(f"{r.key('expert_count')} ({hp.n_expert}) and {r.key('expert_used_count')} "
                           f"({hp.n_expert_used}) must be positive for {hp.arch}")
    if hp.n_expert_used > hp.n_expert:
        raise HParamsError(f"{r.key('expert_used_count')} {hp.n_expert_used} exceeds "
                           f"{r.key('expert_count')} {hp.n_expert}")
    hp.n_expert_groups = r.int("expert_group_count", 0)
    hp.n_group_used = r.int("expert_group_used_count", 0)
    if hp.n_expert_groups > 1 and (hp.n_expert % hp.n_expert_groups or not 0 < hp.n_group_used < hp.n_expert_groups
                                   or hp.n_group_used * (hp.n_expert // hp.n_expert_groups) < hp.n_expert_used):
        raise HParamsError(f"{r.key('expert_group_count')} {hp.n_expert_groups} and "
                           f"{r.key('expert_group_used_count')} {hp.n_group_used} do not group "
                           f"{hp.n_expert} experts of which {hp.n_expert_used} are used")


def load_common(md: Mapping[str, Any], arch: str) -> HParams:
    r = MetadataReader(md, arch)
    n_layer = r.int("block_count", required=True)
    n_embd = r.int("embedding_length", required=True)
    if n_layer <= 0 or n_embd <= 0:
        raise HParamsError(f"{arch}: block_count {n_layer} and embedding_length {n_embd} must be positive")
    n_head = r.per_layer("attention.head_count", n_layer, required=True)
    n_head_kv = r.per_layer("attention.head_count_kv", n_layer, default=None) if r.has(
        "attention.head_count_kv") else list(n_head)
    if n_head[0] <= 0 or any(h <= 0 for h in n_head_kv) or any(h % kv for h, kv in zip(n_head, n_head_kv)):
        raise HParamsError(f"{arch}: head counts {n_head[0]} / {n_head_kv[0]} are not a valid grouping")
    head_k = r.int("attention.key_length", n_embd // n_head[0])
    head_v = r.int("attention.value_length", n_embd // n_head[0])
    n_vocab = r.int("vocab_size", 0)
    if not n_vocab and "tokenizer.ggml.tokens" in md:
        n_vocab = len(md["tokenizer.ggml.tokens"])
    hp = HParams(
        arch=arch,
        n_ctx_train=r.int("context_length", required=True),
        n_embd=n_embd,
        n_layer=n_layer,
        n_ff=r.per_layer("feed_forward_length", n_layer, 0),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd_head_k=head_k,
        n_embd_head_v=head_v,
        n_rot=r.int("rope.dimension_count", head_k),
        n_vocab=n_vocab,
        rope_freq_base=float(r.get("rope.freq_base", 10000.0)),
        f_norm_eps=float(r.get("attention.layer_norm_epsilon", 0.0)),
        f_norm_rms_eps=float(r.get("attention.layer_norm_rms_epsilon", 0.0)),
        causal_attn=bool(r.get("attention.causal", True)),
    )
    scaling = r.get("rope.scaling.type", "none")
    hp.rope_scaling_type = str(scaling)
    factor = float(r.get("rope.scaling.factor", 0.0))
    if factor and scaling != "none":
        hp.rope_freq_scale = 1.0 / factor
    hp.n_ctx_orig_yarn = r.int("rope.scaling.original_context_length", hp.n_ctx_train)
    hp.rope_attn_factor = float(r.get("rope.scaling.attn_factor", 1.0))
    hp.rope_yarn_log_mul = float(r.get("rope.scaling.yarn_log_multiplier", 0.0))
    hp.n_embd_head_k_swa = r.int("attention.key_length_swa", 0)
    hp.n_embd_head_v_swa = r.int("attention.value_length_swa", 0)
    hp.n_rot_swa = r.int("rope.dimension_count_swa", 0)
    return hp
