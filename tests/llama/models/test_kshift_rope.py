"""The K-shift rotates cached keys with the forward graph's RoPE, frequency factors included.

llama 3 files carry `rope_freqs.weight` and Phi-3 128k files LongRoPE's
`rope_factors_long/short.weight`; the forward graph divides the RoPE frequencies by them, so
the K-shift (llama.cpp's build_graph_shift, which passes model.get_rope_factors) must too.
Tiny random models: decode at positions 0..n-1, seq_add(+d), decode one more token (which
applies the shift), and the K cache must match a fresh context that decoded the same tokens
at d..d+n-1. An independent numpy RoPE shows that the same rotation without the factors
would miss by far more than the tolerance.
"""
from __future__ import annotations

import numpy as np
import pytest

import llama
from ggmlpy.testing.models_archs import write_tiny_model

PROMPT, NEXT, D = [3, 14, 15, 92, 65, 35], 89, 37
TOL = 2e-3  # relative to the largest key: f16 cache, keys rotated twice


def _factors(n: int, seed: int) -> np.ndarray:
    """Factors far from 1 (real files: 1 .. ~60), so dropping them shows."""
    return np.random.default_rng(seed).uniform(1.0, 8.0, n).astype(np.float32)


# name -> (arch, tensors, keys, which tensor the rotation must use)
# phi3's n_rot is 12 of a 16-wide head (partial rotary): the factors cover n_rot / 2 pairs.
# LongRoPE picks the long factors when the cache (256 cells) exceeds the original context.
CASES = {
    "llama-rope_freqs": ("llama", {"rope_freqs.weight": _factors(8, 1)}, {}, "rope_freqs.weight"),
    "phi3-longrope-long": ("phi3", {"rope_factors_long.weight": _factors(6, 2),
                                    "rope_factors_short.weight": _factors(6, 3)},
                           {"rope.scaling.original_context_length": 128}, "rope_factors_long.weight"),
    "phi3-longrope-short": ("phi3", {"rope_factors_long.weight": _factors(6, 2),
                                     "rope_factors_short.weight": _factors(6, 3)},
                            {"rope.scaling.original_context_length": 512}, "rope_factors_short.weight"),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    arch, tensors, keys, used = CASES[request.param]
    path = write_tiny_model(arch, tmp_path_factory.mktemp("kshift") / f"{request.param}.gguf",
                            extra_tensors=tensors, extra_keys=keys)
    return llama.Model.load(path), tensors[used]


def rope_numpy(k: np.ndarray, delta: int, hp, factors: np.ndarray | None) -> np.ndarray:
    """Rotate cached keys [cells, n_head_kv * head] by `delta` positions: theta_i =
    delta * scale * base^(-2i/n_rot) / factors[i], pairs (2i, 2i+1) for normal RoPE and
    (i, i + n_rot/2) for NeoX, dimensions past n_rot unchanged, magnitude * attn_factor."""
    args = hp.rope_args(0)
    n_rot, head = args["n_dims"], hp.n_embd_head_k
    x = k.astype(np.float64).reshape(len(k), -1, head)
    i = np.arange(n_rot // 2)
    theta = delta * args["freq_scale"] * args["freq_base"] ** (-2.0 * i / n_rot)
    if factors is not None:
        theta = theta / factors.astype(np.float64)
    cos, sin = np.cos(theta) * args["attn_factor"], np.sin(theta) * args["attn_factor"]
    if args["mode"] == 2:
        a, b = i, i + n_rot // 2
    else:
        a, b = 2 * i, 2 * i + 1
    out = x.copy()
    out[..., a] = x[..., a] * cos - x[..., b] * sin
    out[..., b] = x[..., a] * sin + x[..., b] * cos
    return out.reshape(k.shape)


def k_rows(ctx: llama.Context, n: int) -> list[np.ndarray]:
    return [ctx.memory.k[il][:n].astype(np.float32).copy() for il in range(ctx.model.hparams.n_layer)]


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_shifted_keys_equal_fresh_keys(case, backend):
    model, factors = case
    n = len(PROMPT)
    ctx = llama.Context(model, n_ctx=256, backend=backend)
    assert ctx.decode(llama.Batch.from_tokens(PROMPT)) == 0
    before = k_rows(ctx, n)
    ctx.memory.seq_add(0, 0, -1, D)
    assert ctx.memory.has_shift
    assert ctx.decode(llama.Batch(tokens=[NEXT], pos=[D + n], seq_ids=[0])) == 0
    assert not ctx.memory.has_shift
    shifted = k_rows(ctx, n + 1)

    fresh_ctx = llama.Context(model, n_ctx=256, backend=backend)
    tokens = PROMPT + [NEXT]
    assert fresh_ctx.decode(llama.Batch(tokens=tokens, pos=list(range(D, D + n + 1)),
                                        seq_ids=[0] * (n + 1))) == 0
    fresh = k_rows(fresh_ctx, n + 1)

    hp = model.hparams
    for il in range(hp.n_layer):
        # the shifted cache holds the fresh keys, and the next token's too
        assert rel_err(shifted[il], fresh[il]) < TOL, il
        # the shift itself is the numpy rotation with the factors ...
        assert rel_err(shifted[il][:n], rope_numpy(before[il], D, hp, factors)) < TOL, il
        # ... and the old rotation (factors dropped) would have missed the fresh keys by far
        assert rel_err(rope_numpy(before[il], D, hp, None), fresh[il][:n]) > 50 * TOL, il


def test_shift_uses_the_forward_attn_factor(tmp_path):
    """The shift passes the forward graph's attn_factor, as llama.cpp's build_rope_shift
    passes cparams.yarn_attn_factor (a magnitude != 1 is then applied once more)."""
    tensors = {"rope_factors_long.weight": _factors(6, 2), "rope_factors_short.weight": _factors(6, 3)}
    path = write_tiny_model("phi3", tmp_path / "phi3-af.gguf", extra_tensors=tensors,
                            extra_keys={"rope.scaling.original_context_length": 128,
                                        "rope.scaling.attn_factor": 1.25})
    model = llama.Model.load(path)
    assert model.hparams.rope_args(0)["attn_factor"] == 1.25
    n = len(PROMPT)
    ctx = llama.Context(model, n_ctx=256, backend="ref")
    assert ctx.decode(llama.Batch.from_tokens(PROMPT)) == 0
    before = k_rows(ctx, n)
    ctx.memory.seq_add(0, 0, -1, D)
    assert ctx.decode(llama.Batch(tokens=[NEXT], pos=[D + n], seq_ids=[0])) == 0
    shifted = k_rows(ctx, n)
    for il in range(model.hparams.n_layer):
        expected = rope_numpy(before[il], D, model.hparams, tensors["rope_factors_long.weight"])
        assert rel_err(shifted[il], expected) < TOL, il
