"""Context's llama.cpp cparams: rope_freq_base / rope_freq_scale overrides and flash_attn.

A RoPE override must act exactly like a model file holding that value, must reach every
graph that rotates (the forward graphs and the K-shift), and must stay in its context: the
Model is shared by every context made from it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import llama
from ggmlpy.gguf import GGUFFile, GGUFValueType, GGUFWriter
from ggmlpy.testing.models import write_tiny_llama
from llama.hparams import HParams

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("context_options")
    base = write_tiny_llama(d / "base.gguf")
    with GGUFFile(base) as f:  # the same model with linear RoPE scaling by 2 (freq_scale 0.5)
        w = GGUFWriter.from_file(f)
        w.add_key_value("llama.rope.scaling.type", "linear", GGUFValueType.STRING)
        w.add_key_value("llama.rope.scaling.factor", 2.0, GGUFValueType.FLOAT32)
        scaled = w.write(d / "scaled.gguf")
    return {"base": base, "base_40000": write_tiny_llama(d / "b40000.gguf", rope_base=40000.0),
            "scaled": scaled}


@pytest.fixture(scope="module")
def model(files) -> llama.Model:
    return llama.Model.load(files["base"])


def run(model: llama.Model, backend: str = "ref", **kw) -> np.ndarray:
    ctx = llama.Context(model, n_ctx=256, n_batch=64, n_ubatch=64, backend=backend, **kw)
    assert ctx.decode(llama.Batch.from_tokens(PROMPT, logits_all=True)) == 0
    return ctx.get_logits().copy()


def test_rope_freq_base_acts_like_the_file_and_stays_in_its_context(model, files):
    plain = run(model)
    ctx = llama.Context(model, n_ctx=256, backend="ref", rope_freq_base=40000.0)
    assert ctx.rope_freq_base == 40000.0 and ctx.rope_freq_scale == 1.0
    assert ctx.model.hparams.rope_freq_base == 40000.0
    assert model.hparams.rope_freq_base == 10000.0  # the shared model is unchanged
    assert ctx.model.gguf is model.gguf and ctx.model.backend_cache is model.backend_cache
    got = run(model, rope_freq_base=40000.0)
    np.testing.assert_array_equal(got, run(llama.Model.load(files["base_40000"])))
    assert np.abs(got - plain).max() > 1e-2
    np.testing.assert_array_equal(run(model), plain)  # a later default context: the model's base


def test_rope_freq_scale_acts_like_linear_scaling_in_the_file(model, files):
    scaled = llama.Model.load(files["scaled"])
    assert scaled.hparams.rope_freq_scale == 0.5
    got = run(model, rope_freq_scale=0.5)
    np.testing.assert_array_equal(got, run(scaled))
    assert np.abs(got - run(model)).max() > 1e-2
    # and an override of a scaled model's scale replaces the file's
    np.testing.assert_array_equal(run(scaled, rope_freq_scale=1.0), run(model))


def test_zero_keeps_the_model_values(model):
    ctx = llama.Context(model, n_ctx=256, backend="ref", rope_freq_base=0.0, rope_freq_scale=0.0)
    assert ctx.model is model
    assert (ctx.rope_freq_base, ctx.rope_freq_scale) == (10000.0, 1.0)


def test_the_k_shift_rotates_with_the_override(model, files):
    """After seq_add the cached keys are re-rotated with the context's base: the shifted
    cache then decodes like the model whose file has that base."""
    def shifted(m: llama.Model, **kw) -> np.ndarray:
        ctx = llama.Context(m, n_ctx=256, backend="ref", **kw)
        assert ctx.decode(llama.Batch.from_tokens(PROMPT[:6])) == 0
        ctx.memory.seq_add(0, 0, -1, 7)
        assert ctx.decode(llama.Batch.from_tokens(PROMPT[6:7])) == 0
        return ctx.get_logits_ith(-1).copy()

    np.testing.assert_array_equal(shifted(model, rope_freq_base=40000.0),
                                  shifted(llama.Model.load(files["base_40000"])))


def test_cpu_backend_compiles_each_context_with_its_own_base(model, files):
    """Compiled-graph caches (in memory and on disk) must key on the rope parameters."""
    plain = run(model, backend="cpu")
    got = run(model, backend="cpu", rope_freq_base=40000.0)
    np.testing.assert_allclose(got, run(llama.Model.load(files["base_40000"]), backend="cpu"),
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(got, run(model, rope_freq_base=40000.0), atol=2e-3, rtol=0)  # as ref
    assert np.abs(got - plain).max() > 1e-2


def test_sliding_window_layers_keep_their_own_rope():
    """llama_model::get_rope_freq_base: windowed layers rotate with their trained base and
    scale whatever the context asks for; only the dense layers take the override."""
    hp = HParams(arch="x", n_ctx_train=512, n_embd=64, n_layer=3, n_ff=[96] * 3, n_head=[4] * 3,
                 n_head_kv=[4] * 3, n_embd_head_k=16, n_embd_head_v=16, n_rot=16, n_vocab=10,
                 rope_freq_base=1e6, n_swa=128, rope_freq_base_swa=1e4)
    hp.set_swa_pattern(3)  # layers 0 and 1 windowed, 2 dense
    over = hp.with_rope(5e5, 0.25)
    assert [over.rope_args(il)["freq_base"] for il in range(3)] == [1e4, 1e4, 5e5]
    assert [over.rope_args(il)["freq_scale"] for il in range(3)] == [1.0, 1.0, 0.25]
    assert hp.rope_freq_base == 1e6 and hp.rope_freq_scale == 1.0


@pytest.mark.parametrize("kw, message", [
    ({"rope_freq_base": -1.0}, "rope_freq_base must be a finite number >= 0"),
    ({"rope_freq_scale": float("nan")}, "rope_freq_scale must be a finite number >= 0"),
    ({"flash_attn": "yes"}, "flash_attn must be True, False or None"),
])
def test_bad_values_raise(model, kw, message):
    with pytest.raises(ValueError, match=message):
        llama.Context(model, n_ctx=256, backend="ref", **kw)


def test_flash_attn_is_recorded_and_changes_no_result(model):
    """ggmlpy builds attention as llama.cpp's graph without flash attention whatever the flag
    (the backends fuse it), so every setting gives the same logits."""
    plain = run(model)
    for flag, recorded in ((None, None), ("auto", None), (True, True), (False, False)):
        ctx = llama.Context(model, n_ctx=256, backend="ref", flash_attn=flag)
        assert ctx.flash_attn is recorded
    np.testing.assert_array_equal(run(model, flash_attn=True), plain)
    np.testing.assert_array_equal(run(model, flash_attn=False), plain)
