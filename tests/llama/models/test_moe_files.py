"""Mixture-of-experts files beyond the logits checks: GLM-4.5's multi-token-prediction block
is left out of the graph (its tensors unused, the model is the blocks before it), and the
keys an MoE file can get wrong are refused by name."""
from __future__ import annotations

import numpy as np
import pytest

import llama
from ggmlpy.testing.models_archs import DEFAULTS, write_tiny_model
from llama.hparams import HParamsError

TOKENS = [5, 17, 200, 33, 41, 9]


def _logits(path) -> np.ndarray:
    ctx = llama.Context(llama.Model.load(str(path)), n_ctx=32, n_threads=2)
    assert ctx.decode(llama.Batch.from_tokens(TOKENS, logits_all=True)) == 0
    return np.array(ctx.get_logits())


def test_glm4moe_nextn_block_is_not_part_of_the_model(tmp_path):
    keys = dict(DEFAULTS["glm4moe"]["extra_keys"])
    plain = write_tiny_model("glm4moe", tmp_path / "plain.gguf")
    with_mtp = write_tiny_model("glm4moe", tmp_path / "mtp.gguf", n_layer=4,
                                extra_keys={**keys, "nextn_predict_layers": 1})
    model = llama.Model.load(str(with_mtp))
    assert model.hparams.n_layer == 3 and len(model.layers) == 3
    np.testing.assert_array_equal(_logits(with_mtp), _logits(plain))   # the same first three blocks


@pytest.mark.parametrize("arch, keys, message", [
    ("glm4moe", {"expert_gating_func": 7}, "expert_gating_func 7 is not a gating function"),
    ("glm4moe", {"nextn_predict_layers": 3}, "nextn_predict_layers 3 is not below block_count 3"),
    ("qwen3moe", {"expert_used_count": 9}, "expert_used_count 9 exceeds"),
])
def test_bad_expert_keys_are_named(tmp_path, arch, keys, message):
    extra = {**DEFAULTS[arch].get("extra_keys", {}), **keys}
    settings = {"extra_keys": extra}
    if "expert_used_count" in keys:
        settings = {"n_expert_used": keys["expert_used_count"]}
    path = write_tiny_model(arch, tmp_path / "bad.gguf", **settings)
    with pytest.raises(HParamsError, match=message):
        llama.Model.load(str(path))
