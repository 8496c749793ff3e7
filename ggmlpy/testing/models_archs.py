"""Tiny random-weight GGUF files for every supported architecture (tests, like llama.cpp's
tests/test-llama-archs): `write_tiny_model("gemma2", path)`.

Each file uses llama.cpp's tensor names and hyperparameter keys for its architecture, and
the sizes are chosen so that each family's distinctive parts are exercised: a head size
different from n_embd / n_head (qwen3, gemma), partial rotary (phi3), sliding windows
shorter than a test prompt (mistral, gemma2, gemma3), enough layers for the global layers
of a window pattern to appear (gemma2: 4, gemma3: 6), soft-caps small enough to bend the
scores. Norm weights are 1 + noise, as Gemma files store them (1 + w). The vocabulary is
the byte-level BPE one of `ggmlpy.testing.models`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ggmlpy.gguf.writer import GGUFWriter, GGUFValueType
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import quantize
from ggmlpy.testing.models import add_random_matrix, add_tiny_bpe_vocab
from ggmlpy.testing.models_deepseek2 import DEEPSEEK2_MLA, deepseek2_layer
from ggmlpy.testing.models_gemma4 import GEMMA4_DENSE, gemma4_globals, gemma4_layer


@dataclass
class TinyConfig:
    """Sizes and switches of a tiny model; `None` means the architecture's default."""

    arch: str
    n_layer: int
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 96
    n_vocab: int = 320
    n_ctx_train: int = 512
    head_dim: int | None = None       # written as attention.key_length / value_length
    n_rot: int | None = None          # written as rope.dimension_count
    n_swa: int = 0                    # attention.sliding_window (0: not written)
    tied: bool = False
    fused_qkv: bool = True            # phi3, gemma4: attn_qkv.weight instead of attn_q/k/v
    rope_base: float = 10000.0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    weight_type: GGMLType = GGMLType.F32
    seed: int = 0
    n_expert: int = 0                 # mixture of experts: expert_count (0: a dense model)
    n_expert_used: int = 0            # expert_used_count
    n_ff_exp: int = 0                 # expert_feed_forward_length
    n_ff_shexp: int = 0               # a shared expert's width (0: none), Qwen 2 MoE, Granite MoE
    shexp_gate: bool = False          # the shared expert's sigmoid gate ffn_gate_inp_shexp (Qwen 2 MoE)
    expert_type: GGMLType | None = None  # the experts' type (None: weight_type), e.g. gpt-oss's MXFP4
    legacy_ssm_in: bool = False       # qwen3next: Q, K, V and z in one ssm_in.weight (older converters)
    omit: tuple[str, ...] = ()        # tensor names to leave out (files for error tests)
    extra_keys: dict[str, Any] = field(default_factory=dict)
    extra_tensors: dict[str, np.ndarray] = field(default_factory=dict)  # e.g. rope_freqs.weight

    @property
    def head(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    @property
    def n_q(self) -> int:
        return self.head * self.n_head

    @property
    def n_kv(self) -> int:
        return self.head * self.n_head_kv


SSM_KEYS = {"rope.dimension_sections": [3, 1, 1, 0], "full_attention_interval": 2, "ssm.conv_kernel": 4,
            "ssm.inner_size": 64, "ssm.state_size": 16, "ssm.time_step_rank": 4, "ssm.group_count": 2}

# per-architecture defaults: what makes a tiny file of that family interesting
DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(n_layer=2),
    "mistral": dict(n_layer=2, n_swa=4),
    "qwen2": dict(n_layer=2, tied=True, rope_base=1e6),
    "qwen3": dict(n_layer=2, head_dim=32, rope_base=1e6),
    "phi3": dict(n_layer=2, n_rot=12),
    "gemma": dict(n_layer=2, head_dim=32, tied=True),
    "gemma2": dict(n_layer=4, n_swa=4, tied=True, attn_softcap=3.0, final_softcap=10.0),
    "gemma3": dict(n_layer=6, n_swa=4, tied=True, rope_base=1e6),
    "qwen3moe": dict(n_layer=2, head_dim=32, rope_base=1e6, n_expert=8, n_expert_used=3, n_ff_exp=32),
    "qwen2moe": dict(n_layer=2, rope_base=1e6, n_expert=8, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64,
                     shexp_gate=True),
    "olmoe": dict(n_layer=2, n_head_kv=4, n_ff=32, n_expert=8, n_expert_used=2),
    "granite": dict(n_layer=2, extra_keys={"logit_scale": 4.0, "residual_scale": 0.5, "embedding_scale": 3.0,
                                           "attention.scale": 0.2}),
    "granitemoe": dict(n_layer=2, n_ff=32, n_expert=4, n_expert_used=2, n_ff_shexp=64,
                       extra_keys={"logit_scale": 4.0, "residual_scale": 0.5, "embedding_scale": 3.0,
                                   "attention.scale": 0.2}),
    # a dense first layer, then experts with a sigmoid router, a selection bias and a shared
    # expert; partial rotary (16 of 32 dims) and q/k/v biases as GLM-4.5-Air
    "glm4moe": dict(n_layer=3, head_dim=32, n_rot=16, n_expert=8, n_expert_used=2, n_ff_exp=32,
                    extra_keys={"leading_dense_block_count": 1, "expert_shared_count": 1,
                                "expert_weights_norm": True, "expert_weights_scale": 2.5, "expert_gating_func": 2}),
    # alternating 4-token windows (even layers), Q wider than n_embd as in gpt-oss (64 heads of 64 in 2880)
    "gpt-oss": dict(n_layer=4, head_dim=32, n_swa=4, rope_base=1.5e5, n_expert=8, n_expert_used=2, n_ff_exp=32),
    # delta-net layers 0 and 2, gated attention 1 and 3; 4 value heads over 2 key heads; partial
    # rotary whose last section pair falls outside t/h/w (the extra position, 0 for text)
    "qwen35": dict(n_layer=4, head_dim=32, n_rot=16, rope_base=1e6, extra_keys=SSM_KEYS),
    "qwen35moe": dict(n_layer=4, head_dim=32, n_rot=16, rope_base=1e6, n_expert=8, n_expert_used=2, n_ff_exp=32,
                      n_ff_shexp=64, shexp_gate=True, extra_keys=SSM_KEYS),
    "qwen3next": dict(n_layer=4, head_dim=32, n_rot=16, rope_base=1e6, n_expert=8, n_expert_used=2, n_ff_exp=32,
                      n_ff_shexp=64, shexp_gate=True,
                      extra_keys={k: v for k, v in SSM_KEYS.items() if k != "rope.dimension_sections"}),
    "gemma4": GEMMA4_DENSE,
    "deepseek2": DEEPSEEK2_MLA,
}


class _Tiny:
    """The writer plus the random source: keys under the arch prefix, weights in layout."""

    def __init__(self, cfg: TinyConfig):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.w = GGUFWriter(cfg.arch)

    def key_u32(self, suffix: str, value: int) -> None:
        self.w.add_uint32(f"{self.cfg.arch}.{suffix}", int(value))

    def key_f32(self, suffix: str, value: float) -> None:
        self.w.add_float32(f"{self.cfg.arch}.{suffix}", float(value))

    def add(self, name: str, data: np.ndarray, **kw: Any) -> None:
        """Add a tensor unless the config omits it (the random draw happens either way, so
        the other tensors keep their values)."""
        if name not in self.cfg.omit:
            self.w.add_tensor(name, data, **kw)

    def mat(self, name: str, n_in: int, n_out: int) -> None:
        """A [n_out, n_in] matrix (ggml ne = (n_in, n_out)) scaled to keep activations O(1)."""
        add_random_matrix(self.add, self.rng, name, n_in, n_out, self.cfg.weight_type)

    def norm(self, name: str, n: int) -> None:
        self.add(name, (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32))

    def bias(self, name: str, n: int) -> None:
        self.add(name, (0.5 * self.rng.standard_normal(n)).astype(np.float32))

    def experts(self, name: str, n_in: int, n_out: int) -> None:
        _experts(self, name, n_in, n_out)


def _common_keys(t: _Tiny) -> None:
    c = t.cfg
    t.w.add_string("general.name", f"tiny-{c.arch}")
    t.key_u32("context_length", c.n_ctx_train)
    t.key_u32("embedding_length", c.n_embd)
    t.key_u32("block_count", c.n_layer)
    for key, value in (("feed_forward_length", c.n_ff), ("attention.head_count", c.n_head),
                       ("attention.head_count_kv", c.n_head_kv)):
        if key not in c.extra_keys:   # extra_keys may give them per layer
            t.key_u32(key, value)
    if c.head_dim:
        t.key_u32("attention.key_length", c.head_dim)
        t.key_u32("attention.value_length", c.head_dim)
    t.key_u32("rope.dimension_count", c.n_rot or c.head)
    t.key_f32("rope.freq_base", c.rope_base)
    t.key_f32("attention.layer_norm_rms_epsilon", 1e-6)
    t.key_u32("vocab_size", c.n_vocab)
    if c.n_swa:
        t.key_u32("attention.sliding_window", c.n_swa)
    if c.attn_softcap:
        t.key_f32("attn_logit_softcapping", c.attn_softcap)
    if c.final_softcap:
        t.key_f32("final_logit_softcapping", c.final_softcap)
    if c.n_expert:
        t.key_u32("expert_count", c.n_expert)
        t.key_u32("expert_used_count", c.n_expert_used)
        if c.n_ff_exp:
            t.key_u32("expert_feed_forward_length", c.n_ff_exp)
        if c.n_ff_shexp:
            t.key_u32("expert_shared_feed_forward_length", c.n_ff_shexp)
    for key, value in c.extra_keys.items():
        if isinstance(value, bool):
            t.w.add_bool(f"{c.arch}.{key}", value)
        elif isinstance(value, str):
            t.w.add_string(f"{c.arch}.{key}", value)
        elif isinstance(value, float):
            t.key_f32(key, value)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, bool) for v in value):
            t.w.add_array(f"{c.arch}.{key}", list(value), GGUFValueType.BOOL)
        elif isinstance(value, (list, tuple)):
            t.w.add_array(f"{c.arch}.{key}", [int(v) for v in value], GGUFValueType.INT32)
        else:
            t.key_u32(key, value)
    add_tiny_bpe_vocab(t.w, c.n_vocab)


def _embeddings(t: _Tiny) -> None:
    c = t.cfg
    t.add("token_embd.weight", t.rng.standard_normal((c.n_vocab, c.n_embd)).astype(np.float32))
    t.norm("output_norm.weight", c.n_embd)
    if not c.tied:
        t.mat("output.weight", c.n_embd, c.n_vocab)


def _attn(t: _Tiny, p: str, biases: bool = False, qk_norm: bool = False, qk_norm_rows: bool = False,
          out_bias: bool = False) -> None:
    """Q, K, V and output projections; q/k/v biases, the output's bias; q/k norms one head
    wide or (qk_norm_rows, OLMoE) as wide as all heads."""
    c = t.cfg
    t.mat(p + "attn_q.weight", c.n_embd, c.n_q)
    t.mat(p + "attn_k.weight", c.n_embd, c.n_kv)
    t.mat(p + "attn_v.weight", c.n_embd, c.n_kv)
    t.mat(p + "attn_output.weight", c.n_q, c.n_embd)
    if biases:
        t.bias(p + "attn_q.bias", c.n_q)
        t.bias(p + "attn_k.bias", c.n_kv)
        t.bias(p + "attn_v.bias", c.n_kv)
    if out_bias:
        t.bias(p + "attn_output.bias", c.n_embd)
    if qk_norm or qk_norm_rows:
        t.norm(p + "attn_q_norm.weight", c.n_q if qk_norm_rows else c.head)
        t.norm(p + "attn_k_norm.weight", c.n_kv if qk_norm_rows else c.head)


def _ffn(t: _Tiny, p: str, norm: str | None = "ffn_norm.weight", expert_biases: bool = False) -> None:
    """A gated FFN, or with n_expert a router and n_expert gated experts (Qwen 3 MoE:
    n_ff_exp wide; Mixtral: n_ff), with expert_biases the router's and the experts' biases
    (gpt-oss); `norm` names the norm before it (None: the caller writes it)."""
    c = t.cfg
    if norm is not None:
        t.norm(p + norm, c.n_embd)
    if c.n_expert:
        width = c.n_ff_exp or c.n_ff
        t.mat(p + "ffn_gate_inp.weight", c.n_embd, c.n_expert)
        _experts(t, p + "ffn_gate_exps.weight", c.n_embd, width)
        _experts(t, p + "ffn_up_exps.weight", c.n_embd, width)
        _experts(t, p + "ffn_down_exps.weight", width, c.n_embd)
        if expert_biases:
            t.bias(p + "ffn_gate_inp.bias", c.n_expert)
            for name, n_out in (("gate", width), ("up", width), ("down", c.n_embd)):
                t.add(p + f"ffn_{name}_exps.bias", (0.5 * t.rng.standard_normal((c.n_expert, n_out))).astype(np.float32))
        if c.n_ff_shexp and c.shexp_gate:
            t.add(p + "ffn_gate_inp_shexp.weight", (t.rng.standard_normal(c.n_embd) / np.sqrt(c.n_embd)).astype(np.float32))
        if c.n_ff_shexp:
            t.mat(p + "ffn_gate_shexp.weight", c.n_embd, c.n_ff_shexp)
            t.mat(p + "ffn_up_shexp.weight", c.n_embd, c.n_ff_shexp)
            t.mat(p + "ffn_down_shexp.weight", c.n_ff_shexp, c.n_embd)
        return
    t.mat(p + "ffn_gate.weight", c.n_embd, c.n_ff)
    t.mat(p + "ffn_up.weight", c.n_embd, c.n_ff)
    t.mat(p + "ffn_down.weight", c.n_ff, c.n_embd)


def _experts(t: _Tiny, name: str, n_in: int, n_out: int) -> None:
    """Every expert's [n_out, n_in] matrix, stacked: ggml ne (n_in, n_out, n_expert)."""
    c = t.cfg
    data = (t.rng.standard_normal((c.n_expert, n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
    wtype = c.expert_type or c.weight_type
    if wtype == GGMLType.F32:
        t.add(name, data)
    elif wtype == GGMLType.F16:
        t.add(name, data.astype(np.float16))
    else:
        rows = quantize(data.reshape(-1, n_in), wtype)
        t.add(name, rows.reshape(c.n_expert, n_out, -1), type=wtype, ne=(n_in, n_out, c.n_expert))


def _llama_like(biases: bool = False, qk_norm: bool = False, qk_norm_rows: bool = False) -> Callable[[_Tiny, str], None]:
    def layer(t: _Tiny, p: str) -> None:
        t.norm(p + "attn_norm.weight", t.cfg.n_embd)
        _attn(t, p, biases=biases, qk_norm=qk_norm, qk_norm_rows=qk_norm_rows)
        _ffn(t, p)
    return layer


def _glm4moe_layer(t: _Tiny, p: str) -> None:
    """Biased Q/K/V, post_attention_norm before the FFN; the first leading_dense_block_count
    layers dense, the others experts with exp_probs_b and expert_shared_count shared experts."""
    c = t.cfg
    t.norm(p + "attn_norm.weight", c.n_embd)
    _attn(t, p, biases=True)
    t.norm(p + "post_attention_norm.weight", c.n_embd)
    if int(p.split(".")[1]) < c.extra_keys.get("leading_dense_block_count", 0):
        for name, n_in, n_out in (("gate", c.n_embd, c.n_ff), ("up", c.n_embd, c.n_ff), ("down", c.n_ff, c.n_embd)):
            t.mat(p + f"ffn_{name}.weight", n_in, n_out)
        return
    t.mat(p + "ffn_gate_inp.weight", c.n_embd, c.n_expert)
    t.bias(p + "exp_probs_b.bias", c.n_expert)
    _experts(t, p + "ffn_gate_exps.weight", c.n_embd, c.n_ff_exp)
    _experts(t, p + "ffn_up_exps.weight", c.n_embd, c.n_ff_exp)
    _experts(t, p + "ffn_down_exps.weight", c.n_ff_exp, c.n_embd)
    n_shared = c.n_ff_exp * c.extra_keys.get("expert_shared_count", 0)
    if n_shared:
        t.mat(p + "ffn_gate_shexp.weight", c.n_embd, n_shared)
        t.mat(p + "ffn_up_shexp.weight", c.n_embd, n_shared)
        t.mat(p + "ffn_down_shexp.weight", n_shared, c.n_embd)


def _gpt_oss_layer(t: _Tiny, p: str) -> None:
    """Biased attention with one sink per head; the FFN's norm is post_attention_norm."""
    c = t.cfg
    t.norm(p + "attn_norm.weight", c.n_embd)
    _attn(t, p, biases=True, out_bias=True)
    t.add(p + "attn_sinks.weight", t.rng.standard_normal(c.n_head).astype(np.float32))
    _ffn(t, p, norm="post_attention_norm.weight", expert_biases=True)


def _qwen35_layer(t: _Tiny, p: str) -> None:
    """Qwen3.5 and Qwen3-Next: a gated delta-net or (every full_attention_interval-th) a
    gated attention layer, post_attention_norm, a SwiGLU FFN or experts."""
    c, k = t.cfg, t.cfg.extra_keys
    t.norm(p + "attn_norm.weight", c.n_embd)
    t.norm(p + "post_attention_norm.weight", c.n_embd)
    if (int(p.split(".")[1]) + 1) % k["full_attention_interval"]:
        d_state, n_v = k["ssm.state_size"], k["ssm.time_step_rank"]
        key_dim, value_dim = d_state * k["ssm.group_count"], d_state * n_v
        conv_dim = 2 * key_dim + value_dim
        if c.legacy_ssm_in:
            t.mat(p + "ssm_in.weight", c.n_embd, conv_dim + value_dim)
        else:
            t.mat(p + "attn_qkv.weight", c.n_embd, conv_dim)
            t.mat(p + "attn_gate.weight", c.n_embd, value_dim)
        t.add(p + "ssm_conv1d.weight", (0.5 * t.rng.standard_normal((conv_dim, k["ssm.conv_kernel"]))).astype(np.float32))
        t.bias(p + "ssm_dt.bias", n_v)
        t.add(p + "ssm_a", -np.exp(0.5 * t.rng.standard_normal(n_v)).astype(np.float32))
        if c.arch == "qwen3next":   # per key head: its value heads' betas, then their alphas
            t.mat(p + "ssm_ba.weight", c.n_embd, 2 * n_v)
        else:
            t.mat(p + "ssm_beta.weight", c.n_embd, n_v)
            t.mat(p + "ssm_alpha.weight", c.n_embd, n_v)
        t.norm(p + "ssm_norm.weight", d_state)
        t.mat(p + "ssm_out.weight", value_dim, c.n_embd)
    else:
        t.mat(p + "attn_q.weight", c.n_embd, 2 * c.n_q)
        t.mat(p + "attn_k.weight", c.n_embd, c.n_kv)
        t.mat(p + "attn_v.weight", c.n_embd, c.n_kv)
        t.mat(p + "attn_output.weight", c.n_q, c.n_embd)
        t.norm(p + "attn_q_norm.weight", c.head)
        t.norm(p + "attn_k_norm.weight", c.head)
    _ffn(t, p, norm=None)


def _phi3_layer(t: _Tiny, p: str) -> None:
    c = t.cfg
    t.norm(p + "attn_norm.weight", c.n_embd)
    if c.fused_qkv:
        t.mat(p + "attn_qkv.weight", c.n_embd, c.n_q + 2 * c.n_kv)
        t.mat(p + "attn_output.weight", c.n_q, c.n_embd)
    else:
        _attn(t, p)
    t.norm(p + "ffn_norm.weight", c.n_embd)
    t.mat(p + "ffn_up.weight", c.n_embd, 2 * c.n_ff)   # [gate | up]
    t.mat(p + "ffn_down.weight", c.n_ff, c.n_embd)


def _gemma_sandwich(qk_norm: bool) -> Callable[[_Tiny, str], None]:
    """Gemma 2/3: extra RMS norms after attention and after the FFN."""
    def layer(t: _Tiny, p: str) -> None:
        c = t.cfg
        t.norm(p + "attn_norm.weight", c.n_embd)
        _attn(t, p, qk_norm=qk_norm)
        t.norm(p + "post_attention_norm.weight", c.n_embd)
        _ffn(t, p)
        t.norm(p + "post_ffw_norm.weight", c.n_embd)
    return layer


LAYER_WRITERS: dict[str, Callable[[_Tiny, str], None]] = {
    "llama": _llama_like(),
    "mistral": _llama_like(),
    "qwen2": _llama_like(biases=True),
    "qwen3": _llama_like(qk_norm=True),
    "phi3": _phi3_layer,
    "gemma": _llama_like(),
    "gemma2": _gemma_sandwich(qk_norm=False),
    "gemma3": _gemma_sandwich(qk_norm=True),
    "qwen3moe": _llama_like(qk_norm=True),
    "qwen2moe": _llama_like(biases=True),
    "olmoe": _llama_like(qk_norm_rows=True),
    "granite": _llama_like(),
    "granitemoe": _llama_like(),
    "gpt-oss": _gpt_oss_layer,
    "glm4moe": _glm4moe_layer,
    "qwen35": _qwen35_layer,
    "qwen35moe": _qwen35_layer,
    "qwen3next": _qwen35_layer,
    "gemma4": gemma4_layer,
    "deepseek2": deepseek2_layer,
}
# tensors outside the layers besides the embeddings, per architecture
GLOBAL_WRITERS: dict[str, Callable[[_Tiny], None]] = {"gemma4": gemma4_globals}
ARCHS_WITHOUT_OUTPUT = {"gemma", "gemma2"}  # llama.cpp always ties their output


def tiny_config(arch: str, **overrides: Any) -> TinyConfig:
    """The configuration `write_tiny_model` uses: the arch's defaults, then `overrides`."""
    if arch not in DEFAULTS:
        raise ValueError(f"no tiny model writer for architecture {arch!r} "
                         f"(have: {', '.join(sorted(DEFAULTS))})")
    fields = set(TinyConfig.__dataclass_fields__) - {"arch"}
    unknown = set(overrides) - fields
    if unknown:
        raise TypeError(f"unknown tiny model setting(s): {', '.join(sorted(unknown))}")
    cfg = TinyConfig(arch=arch, **{**DEFAULTS[arch], **overrides})
    if arch in ARCHS_WITHOUT_OUTPUT and not cfg.tied:
        raise ValueError(f"{arch} has no separate output projection: tied must be True")
    if cfg.n_head % cfg.n_head_kv:
        raise ValueError(f"n_head {cfg.n_head} is not a multiple of n_head_kv {cfg.n_head_kv}")
    return cfg


def write_tiny_model(arch: str, path: str | Path, **overrides: Any) -> Path:
    """Write a tiny random `arch` model to `path` (settings: the fields of TinyConfig)."""
    cfg = tiny_config(arch, **overrides)
    t = _Tiny(cfg)
    _common_keys(t)
    _embeddings(t)
    for name, data in cfg.extra_tensors.items():
        t.add(name, np.asarray(data, np.float32))
    if arch in GLOBAL_WRITERS:
        GLOBAL_WRITERS[arch](t)
    layer = LAYER_WRITERS[arch]
    for il in range(cfg.n_layer):
        layer(t, f"blk.{il}.")
    return t.w.write(path)
