"""Every registered architecture on a tiny random-weight GGUF, as llama.cpp's
tests/test-llama-archs:

1. every available backend gives the reference backend's logits (NMSE <= 1e-4, f32
   weights), for a prompt decoded as one batch, then token by token through the KV cache;
2. the reference backend gives the logits of an independent numpy forward pass written
   from the family's published description (tests/llama/models/oracles, HF modeling semantics);
3. the tiny files really exercise what (2) checks: switching one feature off in the
   oracle (the window, a soft-cap, the biases, the RoPE style ...) moves its logits far
   from ours, so (2) would catch a model file that left the feature out;
4. decoding token by token equals decoding the prompt at once (the windowed layers'
   cache included: the prompt is three times longer than the window).
"""
from __future__ import annotations

from contextlib import closing

import numpy as np
import pytest

import llama
from ggmlpy.testing.ops import normalized_error
from ggmlpy.sched.registry import available_backends
from ggmlpy.testing.models_archs import DEFAULTS, write_tiny_model
from ggmlpy.testing.models_deepseek2 import DEEPSEEK2_LEGACY
from ggmlpy.testing.models_gemma4 import GEMMA4_MOE
from llama.arch import ARCHS, get_arch
from llama.hparams import HParamsError
from llama.weights import TensorLoadError
from tests.llama.models import oracles

get_arch("llama")  # imports llama.models: registers every architecture
REGISTERED = sorted(name for name, arch in ARCHS.items() if not arch.drafter)   # drafters: test_mtp.py

# variant -> (architecture, tiny-model settings beyond the arch's defaults)
VARIANTS = {arch: (arch, {}) for arch in REGISTERED}
VARIANTS.update({
    "llama-tied": ("llama", {"tied": True}),
    "llama-experts": ("llama", {"n_expert": 4, "n_expert_used": 2}),   # Mixtral
    "mistral-no-window": ("mistral", {"n_swa": 0}),
    "phi3-split-qkv": ("phi3", {"fused_qkv": False}),
    "qwen3next-ssm-in": ("qwen3next", {"legacy_ssm_in": True}),
    "gemma4-moe": ("gemma4", GEMMA4_MOE),   # 26B-A4B's shape: experts beside the dense FFN
    "deepseek2-lite": ("deepseek2", DEEPSEEK2_LEGACY),   # attn_kv_b instead of the absorbed MLA tensors
})
TOKENS = [5, 17, 200, 33, 41, 9, 8, 7, 100, 101, 102, 103]  # windows are 4 positions
N_PROMPT = 7          # then the remaining tokens one at a time
MAX_NMSE_BACKEND = 1e-4
MAX_NMSE_ORACLE = 1e-6
MIN_NMSE_CONTROL = 1e-4
OTHER_BACKENDS = [b for b in available_backends() if b != "ref"]

# (arch, feature, oracle config overrides that switch the feature off)
CONTROLS = [
    ("llama", "Q/K permuted for adjacent-pair RoPE", dict(rope_style="pairs")),
    ("mistral", "sliding window", dict(sliding_window=0)),
    ("qwen2", "q/k/v biases", dict(forward_kw={"use_bias": False})),
    ("qwen2", "NeoX RoPE", dict(rope_style="pairs")),
    ("qwen3", "q/k RMS norms", dict(forward_kw={"use_qk_norm": False})),
    ("qwen3", "NeoX RoPE", dict(rope_style="pairs")),
    ("qwen3moe", "top-k weights normalised to 1", dict(forward_kw={"norm_topk": False})),
    ("qwen3moe", "q/k RMS norms", dict(forward_kw={"use_qk_norm": False})),
    ("qwen2moe", "the shared expert", dict(forward_kw={"use_shared_expert": False})),
    ("qwen2moe", "q/k/v biases", dict(forward_kw={"use_bias": False})),
    ("olmoe", "q/k RMS norms over whole rows", dict(forward_kw={"use_qk_norm": False})),
    ("granite", "embedding, residual and logit multipliers", dict(forward_kw={"use_multipliers": False})),
    ("granitemoe", "embedding, residual and logit multipliers", dict(forward_kw={"use_multipliers": False})),
    ("gpt-oss", "attention sinks", dict(forward_kw={"use_sinks": False})),
    ("glm4moe", "the experts' selection bias", dict(forward_kw={"use_selection_bias": False})),
    ("glm4moe", "partial rotary", dict(rotary_dim=32)),
    ("gpt-oss", "alternating sliding window", dict(sliding_window=0)),
    ("phi3", "partial rotary", dict(rotary_dim=16)),
    ("phi3", "NeoX RoPE", dict(rope_style="pairs")),
    ("gemma", "query scale 1/sqrt(head_dim)", dict(query_scale=16 ** -0.5)),
    ("gemma", "NeoX RoPE", dict(rope_style="pairs")),
    ("gemma2", "sliding window", dict(sliding_window=0)),
    ("gemma2", "even layers slide", dict(sliding_layers=[il % 2 == 1 for il in range(4)])),
    ("gemma2", "attention soft-cap", dict(attn_softcap=0.0)),
    ("gemma2", "final soft-cap", dict(final_softcap=0.0)),
    ("gemma3", "sliding window", dict(sliding_window=0)),
    ("gemma3", "global 6th layer", dict(sliding_layers=[True] * 6)),
    ("gemma3", "local RoPE base", dict(rope_local_theta=None)),
    ("qwen35", "the delta rule's decay gate", dict(forward_kw={"use_decay": False})),
    ("qwen35", "value heads tiled over the key heads", dict(forward_kw={"interleave": True})),
    ("qwen35", "the attention's output gate", dict(forward_kw={"use_attn_gate": False})),
    ("qwen35", "partial rotary", dict(rotary_dim=32)),
    ("qwen35moe", "the gated shared expert", dict(forward_kw={"use_shared_expert": False})),
    ("qwen3next", "value heads interleaved over the key heads", dict(forward_kw={"interleave": False})),
    ("gemma4", "KV shared from earlier layers", dict(forward_kw={"share_kv": False})),
    ("gemma4", "per-layer embedding inputs", dict(forward_kw={"use_per_layer": False})),
    ("gemma4", "proportional RoPE on the global layers", dict(forward_kw={"use_factors": False})),
    ("gemma4", "sliding window", dict(sliding_window=0)),
    ("deepseek2", "RoPE on adjacent pairs of the rope dims", dict(rope_style="half")),
    ("deepseek2", "the shared expert", dict(forward_kw={"use_shared_expert": False})),
    ("deepseek2-lite", "RoPE on adjacent pairs of the rope dims", dict(rope_style="half")),
]


class TinyModels:
    """Files, loaded models and reference logits, each made once per test module."""

    def __init__(self, root):
        self.root = root
        self.paths, self.models, self._ref = {}, {}, {}

    def path(self, variant: str):
        if variant not in self.paths:
            arch, settings = VARIANTS[variant]
            self.paths[variant] = write_tiny_model(arch, self.root / f"{variant}.gguf", **settings)
        return self.paths[variant]

    def model(self, variant: str) -> llama.Model:
        if variant not in self.models:
            self.models[variant] = llama.Model.load(self.path(variant))
        return self.models[variant]

    def ref_logits(self, variant: str) -> np.ndarray:
        if variant not in self._ref:
            self._ref[variant] = batch_logits(self.model(variant), "ref")
        return self._ref[variant]

    def close(self) -> None:
        for m in self.models.values():
            m.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    models = TinyModels(tmp_path_factory.mktemp("archs"))
    yield models
    models.close()


def make_ctx(model: llama.Model, backend: str) -> llama.Context:
    try:
        return llama.Context(model, n_ctx=256, n_batch=32, n_ubatch=32, backend=backend)
    except RuntimeError as e:  # a registered backend whose device this machine lacks
        if backend in ("ref", "cpu"):
            raise
        pytest.skip(f"backend {backend} is not usable here: {e}")


def batch_logits(model: llama.Model, backend: str) -> np.ndarray:
    ctx = make_ctx(model, backend)
    assert ctx.decode(llama.Batch.from_tokens(TOKENS, logits_all=True)) == 0
    return ctx.get_logits().copy()


def incremental_logits(model: llama.Model, backend: str) -> np.ndarray:
    """The prompt's first N_PROMPT tokens as one batch, then one token per decode."""
    ctx = make_ctx(model, backend)
    assert ctx.decode(llama.Batch.from_tokens(TOKENS[:N_PROMPT], logits_all=True)) == 0
    rows = [ctx.get_logits().copy()]
    for tok in TOKENS[N_PROMPT:]:
        assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
        rows.append(ctx.get_logits_ith(-1)[None].copy())
    return np.concatenate(rows)


def test_every_registered_architecture_has_a_writer_and_an_oracle():
    assert set(REGISTERED) <= set(DEFAULTS), "tiny writer missing (ggmlpy/testing/models_archs.py)"
    assert set(REGISTERED) <= set(oracles.ORACLES), "numpy oracle missing (tests/llama/models/oracles)"
    assert {"llama", "gemma3", "qwen2", "qwen3", "phi3", "mistral", "gemma", "gemma2"} <= set(REGISTERED)


def backend_cases() -> list:
    return [pytest.param(arch, backend, id=f"{arch}-{backend}")
            for arch in REGISTERED for backend in OTHER_BACKENDS]


@pytest.mark.parametrize("arch, backend", backend_cases())
def test_backend_matches_reference(tiny, arch, backend):
    ours = incremental_logits(tiny.model(arch), backend)
    ref = tiny.ref_logits(arch)
    assert ours.shape == (len(TOKENS), tiny.model(arch).n_vocab)
    assert normalized_error(ours, ref) <= MAX_NMSE_BACKEND


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_reference_backend_matches_numpy_oracle(tiny, variant):
    expected = oracles.run(tiny.path(variant), TOKENS)
    assert normalized_error(tiny.ref_logits(variant), expected) <= MAX_NMSE_ORACLE


@pytest.mark.parametrize("arch, feature, overrides", CONTROLS, ids=[f"{a}-{f}" for a, f, _ in CONTROLS])
def test_tiny_model_exercises_feature(tiny, arch, feature, overrides):
    without = oracles.run(tiny.path(arch), TOKENS, **overrides)
    assert normalized_error(tiny.ref_logits(arch), without) > MIN_NMSE_CONTROL, \
        f"{arch}: the oracle without {feature} still matches, so the test cannot see it"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_token_by_token_equals_batch(tiny, variant):
    ours = incremental_logits(tiny.model(variant), "ref")
    assert normalized_error(ours, tiny.ref_logits(variant)) <= MAX_NMSE_ORACLE


# hyperparameters as llama.cpp reads them ------------------------------------------------------
@pytest.mark.parametrize("variant, rope_type, n_swa, swa_layers", [
    ("llama", 0, 0, [False, False]),
    ("mistral", 0, 4, [True, True]),
    ("mistral-no-window", 0, 0, [False, False]),
    ("qwen2", 2, 0, [False, False]),
    ("qwen3", 2, 0, [False, False]),
    ("phi3", 2, 0, [False, False]),
    ("gemma", 2, 0, [False, False]),
    ("gemma2", 2, 4, [True, False, True, False]),
    ("gemma3", 2, 4, [True] * 5 + [False]),
    ("gemma4", 2, 4, [True, True, True, False, True, False]),
])
def test_hparams(tiny, variant, rope_type, n_swa, swa_layers):
    hp = tiny.model(variant).hparams
    assert hp.rope_type == rope_type
    assert hp.n_swa == n_swa
    assert [hp.is_swa(il) for il in range(hp.n_layer)] == swa_layers


def test_hparams_head_sizes_and_caps(tiny):
    qwen3, phi3, gemma2 = (tiny.model(v).hparams for v in ("qwen3", "phi3", "gemma2"))
    assert (qwen3.n_embd_head_k, qwen3.n_rot) == (32, 32)
    assert (phi3.n_embd_head_k, phi3.n_rot) == (16, 12)
    assert (gemma2.f_attn_logit_softcapping, gemma2.f_final_logit_softcapping) == (3.0, 10.0)
    assert gemma2.rope_freq_base_swa == gemma2.rope_freq_base == 10000.0
    assert gemma2.f_attention_scale == pytest.approx(0.25)


def test_gemma4_hparams_per_layer(tiny):
    """Head sizes, rotary dims, KV heads and RoPE bases per layer kind, and the layers past
    n_layer - shared_kv_layers reading the last earlier cache of their kind."""
    hp = tiny.model("gemma4").hparams
    assert [hp.head_k(il) for il in range(6)] == [32, 32, 32, 64, 32, 64]
    assert [hp.rope_args(il)["n_dims"] for il in (0, 3)] == [32, 64]
    assert [hp.rope_args(il)["freq_base"] for il in (0, 3)] == [1e4, 1e6]
    assert [hp.n_embd_k_gqa(il) for il in range(6)] == [64, 64, 64, 64, 64, 64]
    assert [hp.kv_layer(il) for il in range(6)] == [0, 1, 2, 3, 2, 3]
    assert hp.n_embd_per_layer == 32 and hp.f_attention_scale == 1.0
    assert [hp.uses_rope_freqs(il) for il in range(6)] == [False, False, False, True, False, True]


def test_gemma4_cache_holds_only_the_layers_that_own_one(tiny):
    ctx = llama.Context(tiny.model("gemma4"), n_ctx=32, backend="ref")
    names = set(ctx.memory.bindings())
    assert {f"cache_k_l{il}" for il in range(4)} <= names
    assert not {"cache_k_l4", "cache_k_l5", "cache_v_l4", "cache_v_l5"} & names


def test_gemma4_bad_shared_layers_are_refused(tmp_path):
    """Shared layers must find a sliding-window layer and then a global one before them."""
    from ggmlpy.testing.models_gemma4 import GEMMA4_DENSE
    keys = {**GEMMA4_DENSE["extra_keys"], "attention.shared_kv_layers": 3}
    path = write_tiny_model("gemma4", tmp_path / "bad.gguf", extra_keys=keys)
    with pytest.raises(HParamsError, match="shared_kv_layers"):
        llama.Model.load(str(path))


def test_mistral_window_pattern_makes_every_nth_layer_global(tmp_path):
    path = write_tiny_model("mistral", tmp_path / "m.gguf", n_layer=4,
                            extra_keys={"attention.sliding_window_pattern": 2})
    with closing(llama.Model.load(path)) as m:
        assert m.hparams.swa_layers == [True, False, True, False]


def test_gemma2_softcaps_default_to_llama_cpp_values(tmp_path):
    path = write_tiny_model("gemma2", tmp_path / "g2.gguf", attn_softcap=0.0, final_softcap=0.0)
    with closing(llama.Model.load(path)) as m:
        assert (m.hparams.f_attn_logit_softcapping, m.hparams.f_final_logit_softcapping) == (50.0, 30.0)


# errors ---------------------------------------------------------------------------------------
def test_qwen2_without_q_bias_is_rejected(tmp_path):
    path = write_tiny_model("qwen2", tmp_path / "q.gguf", omit=("blk.1.attn_q.bias",))
    with pytest.raises(TensorLoadError, match=r"blk\.1\.attn_q\.bias"):
        llama.Model.load(path)


def test_phi3_without_any_qkv_projection_is_rejected(tmp_path):
    path = write_tiny_model("phi3", tmp_path / "p.gguf", fused_qkv=False, omit=("blk.0.attn_k.weight",))
    with closing(llama.Model.load(path)) as m:
        with pytest.raises(TensorLoadError, match=r"blk\.0\.attn_qkv\.weight"):
            llama.Context(m, n_ctx=256, backend="ref")


@pytest.mark.parametrize("omit, message", [
    (("blk.0.attn_q.weight",), r"neither blk\.0\.attn_qkv\.weight nor blk\.0\.attn_q\.weight"),
    (("blk.1.attn_k.weight",), r"owns a KV cache but the file lacks blk\.1\.attn_k\.weight"),
])
def test_gemma4_without_its_projections_is_rejected(tmp_path, omit, message):
    path = write_tiny_model("gemma4", tmp_path / "g.gguf", omit=omit)
    with closing(llama.Model.load(path)) as m:
        with pytest.raises(TensorLoadError, match=message):
            llama.Context(m, n_ctx=256, backend="ref")


def test_gemma2_zero_softcap_is_rejected(tmp_path):
    path = write_tiny_model("gemma2", tmp_path / "g.gguf", attn_softcap=0.0,
                            extra_keys={"attn_logit_softcapping": 0.0})
    with pytest.raises(HParamsError, match="soft-capping"):
        llama.Model.load(path)


@pytest.mark.parametrize("n_expert, n_expert_used, message", [
    (4, 5, r"qwen3moe\.expert_used_count 5 exceeds qwen3moe\.expert_count 4"),
    (4, 0, r"qwen3moe\.expert_count \(4\) and qwen3moe\.expert_used_count \(0\) must be positive"),
])
def test_qwen3moe_bad_expert_counts_are_rejected(tmp_path, n_expert, n_expert_used, message):
    path = write_tiny_model("qwen3moe", tmp_path / "m.gguf", n_expert=n_expert, n_expert_used=n_expert_used)
    with pytest.raises(HParamsError, match=message):
        llama.Model.load(path)


def test_qwen3moe_without_an_expert_tensor_is_rejected(tmp_path):
    path = write_tiny_model("qwen3moe", tmp_path / "m.gguf", omit=("blk.1.ffn_down_exps.weight",))
    with pytest.raises(TensorLoadError, match=r"blk\.1\.ffn_down_exps\.weight"):
        llama.Model.load(path)


def test_tiny_writer_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="tied"):  # llama.cpp's gemma has no output matrix
        write_tiny_model("gemma", tmp_path / "g.gguf", tied=False)
    with pytest.raises(ValueError, match="no tiny model writer"):
        write_tiny_model("gpt2", tmp_path / "x.gguf")
    with pytest.raises(TypeError, match="n_layers"):
        write_tiny_model("llama", tmp_path / "x.gguf", n_layers=3)


def test_gemma4_embeddings_input_takes_the_padding_rows(tiny):
    """Embeddings as input take per-layer row 0 (the padding token's), as llama.cpp does: the
    scaled embedding rows of token 0 then give the logits of token 0 given as ids."""
    model = tiny.model("gemma4")
    table = model.gguf.tensors["token_embd.weight"].data.view(np.float32).reshape(-1, 64)
    embd = table[[0, 0, 0]] * np.float32(np.sqrt(64))
    outs = []
    for batch in (llama.Batch(embd=embd, logits=[True] * 3), llama.Batch.from_tokens([0, 0, 0], logits_all=True)):
        ctx = llama.Context(model, n_ctx=32, backend="ref")
        assert ctx.decode(batch) == 0
        outs.append(np.array([ctx.get_logits_ith(i) for i in range(3)]))
    assert normalized_error(outs[0], outs[1]) <= MAX_NMSE_ORACLE


def test_gemma4_quantised_kv_cache(tiny):
    """A q8_0 K/V cache over layers of two head sizes: whole blocks per head in each, no
    Hadamard rotation (the layers' heads differ, as llama.cpp's n_embd_head_k_all = -1), and
    the logits of the f16 cache but for the rounding."""
    outs = []
    for kv in ("f16", "q8_0"):
        ctx = llama.Context(tiny.model("gemma4"), n_ctx=32, type_k=kv, type_v=kv, flash_attn=True, backend="ref")
        assert ctx.decode(llama.Batch.from_tokens(TOKENS, logits_all=True)) == 0
        assert ctx.memory.layout().rot_k == 0
        outs.append(np.array([ctx.get_logits_ith(i) for i in range(len(TOKENS))]))
    assert 0 < normalized_error(outs[1], outs[0]) <= 1e-3


def test_gemma4_experts_per_layer(tmp_path):
    """A layer has experts where it has a router, as llama.cpp decides (has_expert): a file
    whose layer 1 has none runs that layer's dense FFN alone, as the oracle does; a router
    without its norms is refused by name."""
    from ggmlpy.testing.models_gemma4 import GEMMA4_MOE
    p = "blk.1."
    dense_1 = [p + n for n in ("ffn_gate_inp.weight", "ffn_gate_inp.scale", "ffn_gate_up_exps.weight",
                               "ffn_down_exps.weight", "ffn_down_exps.scale", "pre_ffw_norm_2.weight",
                               "post_ffw_norm_1.weight", "post_ffw_norm_2.weight")]
    path = write_tiny_model("gemma4", tmp_path / "mixed.gguf", **GEMMA4_MOE, omit=tuple(dense_1))
    ctx = llama.Context(llama.Model.load(str(path)), n_ctx=32, backend="ref")
    assert ctx.decode(llama.Batch.from_tokens(TOKENS, logits_all=True)) == 0
    ours = np.array([ctx.get_logits_ith(i) for i in range(len(TOKENS))])
    assert normalized_error(ours, oracles.run(path, TOKENS)) <= MAX_NMSE_ORACLE
    bad = write_tiny_model("gemma4", tmp_path / "bad.gguf", **GEMMA4_MOE, omit=(p + "pre_ffw_norm_2.weight",))
    with pytest.raises(TensorLoadError, match="pre_ffw_norm_2"):   # when its graphs are built
        llama.Context(llama.Model.load(str(bad)), n_ctx=32, backend="ref")
