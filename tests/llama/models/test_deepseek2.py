"""DeepSeek V2/V3 (deepseek2) beyond the logits checks of test_archs_llama_cpp.py: MLA's K-only
cache (one compressed row per token, read as V too), the K-shift of its rope dims only, state
save/load, and the hyperparameters a file can get wrong, refused by name."""
from __future__ import annotations

import numpy as np
import pytest

import llama
from ggmlpy.testing.models_archs import write_tiny_model
from ggmlpy.ir.types import GGMLType
from ggmlpy.testing.models_deepseek2 import DEEPSEEK2_LEGACY, DEEPSEEK2_MLA, DEEPSEEK2_TEMP, DEEPSEEK2_V3, KV_RANK, ROPE
from llama.hparams import HParamsError

PROMPT, NEXT, D = [3, 14, 15, 92, 65, 35], 89, 37
TOL = 2e-3   # relative to the largest key: f16 cache, keys rotated twice


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepseek2")
    return {"mla": write_tiny_model("deepseek2", folder / "mla.gguf"),
            "legacy": write_tiny_model("deepseek2", folder / "legacy.gguf", **DEEPSEEK2_LEGACY)}


def test_the_mla_cache_holds_one_compressed_row_per_token(files):
    """llama.cpp's K-only cache: kv_lora_rank + n_rot values per token and layer, no V."""
    ctx = llama.Context(llama.Model.load(str(files["mla"])), n_ctx=64)
    cells = ctx.memory.size
    for il in range(DEEPSEEK2_MLA["n_layer"]):
        assert ctx.memory.k[il].shape == (cells, KV_RANK + ROPE)
        assert ctx.memory.v[il].shape == (cells, 0)
    assert ctx.memory.nbytes == DEEPSEEK2_MLA["n_layer"] * cells * (KV_RANK + ROPE) * 2
    legacy = llama.Context(llama.Model.load(str(files["legacy"])), n_ctx=64)
    assert legacy.memory.v[0].shape == (cells, 4 * 32)   # every head's V, decompressed


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("name", ["mla", "legacy"])
def test_shifted_keys_equal_fresh_keys(files, name, backend):
    """seq_add re-rotates only the rope dims at the end of each cached key (llama.cpp's K-shift
    view from n_embd_head_k - n_rot): the cache then equals a fresh decode at the new positions."""
    model = llama.Model.load(str(files[name]))
    ctx = llama.Context(model, n_ctx=256, backend=backend)
    assert ctx.decode(llama.Batch.from_tokens(PROMPT)) == 0
    before = [ctx.memory.k[il][:len(PROMPT)].astype(np.float32) for il in range(3)]
    ctx.memory.seq_add(0, 0, -1, D)
    assert ctx.decode(llama.Batch(tokens=[NEXT], pos=[D + len(PROMPT)], seq_ids=[0])) == 0
    fresh = llama.Context(model, n_ctx=256, backend=backend)
    n = len(PROMPT) + 1
    assert fresh.decode(llama.Batch(tokens=PROMPT + [NEXT], pos=list(range(D, D + n)), seq_ids=[0] * n)) == 0
    head = model.hparams.head_k(0)
    for il in range(3):
        shifted, want = (c.memory.k[il][:n].astype(np.float32) for c in (ctx, fresh))
        assert np.abs(shifted - want).max() / np.abs(want).max() < TOL, il
        # the unrotated part of each head did not move
        nope = shifted[:len(PROMPT)].reshape(len(PROMPT), -1, head)[..., :head - ROPE]
        np.testing.assert_array_equal(nope, before[il].reshape(len(PROMPT), -1, head)[..., :head - ROPE])


@pytest.mark.parametrize("settings", [DEEPSEEK2_V3, DEEPSEEK2_TEMP], ids=["v3-groups-yarn", "lite-temperature"])
def test_the_cpu_runs_every_node_natively(tmp_path, settings):
    """The absorbed products over per-head weights, the group mask (a set_rows into the
    scores), the attention temperature: all CPU kernels, nothing left to the reference backend."""
    path = write_tiny_model("deepseek2", tmp_path / "m.gguf", **settings, weight_type=GGMLType.Q8_0)
    ctx = llama.Context(llama.Model.load(str(path)), n_ctx=64, backend="cpu")
    assert ctx.decode(llama.Batch.from_tokens(list(range(5, 17)))) == 0
    assert ctx.decode(llama.Batch.from_tokens([30], pos0=12)) == 0
    assert not ctx.fallbacks.told and not ctx.fallbacks.pending


def test_state_save_and_load(files):
    from llama import Llama

    llm = Llama(str(files["mla"]), n_ctx=64, verbose=False)
    llm.eval(PROMPT)
    state = llm.save_state()
    llm.eval([NEXT])
    want = np.array(llm.scores[llm.n_tokens - 1])
    llm.reset()
    llm.eval([7, 8, 9])
    llm.load_state(state)
    llm.eval([NEXT])
    np.testing.assert_array_equal(np.array(llm.scores[llm.n_tokens - 1]), want)


def test_mla_refuses_different_k_and_v_cache_types(files):
    with pytest.raises(ValueError, match="different K .* and V .* cache types"):
        llama.Context(llama.Model.load(str(files["mla"])), n_ctx=64, type_k="q8_0", type_v="f16")


@pytest.mark.parametrize("keys, message", [
    ({"attention.kv_lora_rank": None}, "deepseek2.attention.kv_lora_rank is missing"),
    ({"attention.value_length_mla": None}, "must both be given or both be absent"),
    ({"attention.key_length": 40}, "an MLA file caches one head of kv_lora_rank"),
    ({"expert_group_count": 3, "expert_group_used_count": 1}, "do not group 8 experts"),
    ({"expert_gating_func": 9}, "expert_gating_func 9 is not a gating function"),
    ({"attention.temperature_scale": 0.1}, "needs a positive deepseek2.attention.temperature_length"),
])
def test_bad_keys_are_named(tmp_path, keys, message):
    extra = {k: v for k, v in {**DEEPSEEK2_MLA["extra_keys"], **keys}.items() if v is not None}
    path = write_tiny_model("deepseek2", tmp_path / "bad.gguf", **{**DEEPSEEK2_MLA, "extra_keys": extra})
    with pytest.raises(HParamsError, match=message):
        llama.Model.load(str(path))
