"""The KV cache's types (llama.cpp's -ctk/-ctv, llama-cpp-python's type_k/type_v): what each
takes in memory, the rules llama.cpp refuses by (with its messages), the K-shift of a
quantised K, and saved states, which hold the cache's bytes and so its types."""
from __future__ import annotations

import numpy as np
import pytest

import llama
from ggmlpy.ir.types import GGMLType, row_size
from llama.kv_types import KV_TYPES, hadamard
from tests.llama.models.batched import check_batched_equals_alone
from tests.llama.models.test_kv_quant_llama_cpp import log_softmax
from tests.tools.kv_quant_vectors import write_file

PROMPT = [5, 17, 200, 33, 41, 9, 8, 7, 100, 64, 3, 250, 77, 12]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kv_types")
    return {name: write_file(name, folder) for name in ("h32", "h64")}


@pytest.fixture(scope="module")
def h32(paths):
    return llama.Model.load(str(paths["h32"]))


@pytest.fixture(scope="module")
def h64(paths):
    return llama.Model.load(str(paths["h64"]))


@pytest.mark.parametrize("name", list(KV_TYPES))
def test_the_cache_takes_what_its_type_says(h32, name):
    """n_ctx rows of the type's row size per layer, for K and V alike."""
    hp = h32.hparams
    ctx = llama.Context(h32, n_ctx=256, type_k=name, type_v=name)
    t = KV_TYPES[name]
    row = row_size(t, hp.n_embd_k_gqa(0))
    for il in range(hp.n_layer):
        assert ctx.memory.k[il].nbytes == ctx.memory.v[il].nbytes == 256 * row
    assert ctx.memory.nbytes == 2 * hp.n_layer * 256 * row
    f16 = 2 * hp.n_layer * 256 * row_size(GGMLType.F16, hp.n_embd_k_gqa(0))
    assert ctx.memory.nbytes == f16 * {"f32": 2, "f16": 1, "bf16": 1, "q8_0": 34 / 64, "q4_0": 18 / 64,
                                       "q4_1": 20 / 64, "iq4_nl": 18 / 64, "q5_0": 22 / 64, "q5_1": 24 / 64}[name]


def test_a_quantised_v_cache_needs_flash_attention(h32):
    with pytest.raises(ValueError, match="quantized V cache requires flash_attn to be enabled"):
        llama.Context(h32, n_ctx=64, type_v="q8_0", flash_attn=False)
    assert llama.Context(h32, n_ctx=64, type_v="q4_0").flash_attn is True        # auto turns it on
    assert llama.Context(h32, n_ctx=64, type_k="q4_0", flash_attn=False).flash_attn is False
    assert llama.Context(h32, n_ctx=64).flash_attn is None


def test_unknown_types_and_partial_blocks_are_refused(h32, tmp_path):
    with pytest.raises(ValueError, match="Unsupported K cache type: 'q2_k'"):
        llama.Context(h32, n_ctx=64, type_k="q2_k")
    with pytest.raises(ValueError, match="Unsupported V cache type: 9"):
        llama.Context(h32, n_ctx=64, type_v=9)
    from ggmlpy.testing.models_archs import write_tiny_model

    heads16 = llama.Model.load(str(write_tiny_model("llama", tmp_path / "h16.gguf")))
    with pytest.raises(ValueError, match="K cache type q8_0 with block size 32 does not divide n_embd_head_k=16"):
        llama.Context(heads16, n_ctx=64, type_k="q8_0")


def test_llama_takes_ggml_type_ids(paths):
    """llama-cpp-python's Llama(type_k=8, type_v=2) is q8_0 and q4_0; its names work too."""
    llm = llama.Llama(str(paths["h32"]), n_ctx=64, type_k=8, type_v=2, verbose=False)
    assert (llm.ctx.type_k, llm.ctx.type_v) == ("q8_0", "q4_0")
    assert llm.ctx.memory.layout().type_k == GGMLType.Q8_0
    with pytest.raises(ValueError, match="quantized V cache requires flash_attn"):
        llama.Llama(str(paths["h32"]), n_ctx=64, type_v="iq4_nl", flash_attn=False, verbose=False)


def test_rotation_sizes(h32, h64):
    """llama.cpp rotates a quantised cache's heads of 64 (K: the largest power of two dividing
    them), not those of 32."""
    lay = llama.Context(h64, n_ctx=64, type_k="q8_0", type_v="q4_0").kv_layout
    assert (lay.rot_k, lay.rot_v) == (64, 64)
    assert llama.Context(h64, n_ctx=64, type_k="q8_0").kv_layout.rot_v == 0
    assert llama.Context(h32, n_ctx=64, type_k="q8_0", type_v="q8_0").kv_layout.rot_k == 0
    h = hadamard(64)
    np.testing.assert_allclose(h @ h, np.eye(64), atol=1e-6)


def _shifted(model, type_k: str, backend: str, shift: bool = True) -> np.ndarray:
    """Logits of a token after dropping three cells and moving the rest back (K-shift), or
    (shift False) leaving the gap."""
    ctx = llama.Context(model, n_ctx=64, backend=backend, type_k=type_k)
    assert ctx.decode(llama.Batch.from_tokens(PROMPT)) == 0
    ctx.memory.seq_rm(0, 2, 5)
    if shift:
        ctx.memory.seq_add(0, 5, -1, -3)
    assert ctx.decode(llama.Batch.from_tokens([77], pos0=len(PROMPT) - (3 if shift else 0))) == 0
    return np.array(ctx.get_logits_ith(-1), dtype=np.float64)


def _fresh(model, type_k: str) -> np.ndarray:
    """The prompt and a token decoded from scratch."""
    ctx = llama.Context(model, n_ctx=64, type_k=type_k)
    assert ctx.decode(llama.Batch.from_tokens(PROMPT + [77])) == 0
    return np.array(ctx.get_logits_ith(-1), dtype=np.float64)


def _dist(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(log_softmax(a) - log_softmax(b)).mean())


@pytest.mark.parametrize("backend", ["cpu", "ref"])
@pytest.mark.parametrize("file,type_k", [("h32", "q8_0"), ("h64", "q8_0"), ("h64", "q4_0"), ("h32", "iq4_nl")])
def test_k_shift_of_a_quantised_k(h32, h64, file, type_k, backend):
    """The K-shift of a quantised K (decoded, un-rotated, RoPE, rotated, quantised again) lands
    as close to f16's shifted keys as the quantised cache is to f16 without a shift (the
    shift adds a second rounding of the keys, nothing more), and far from the keys left
    where they were."""
    model = {"h32": h32, "h64": h64}[file]
    f16 = _shifted(model, "f16", backend)
    shift_err = _dist(_shifted(model, type_k, backend), f16)
    plain_err = _dist(_fresh(model, type_k), _fresh(model, "f16"))
    assert shift_err <= 2.5 * plain_err + 1e-3, (shift_err, plain_err)
    assert shift_err < _dist(_shifted(model, "f16", backend, shift=False), f16) / 2
def test_state_round_trip_and_type_check(paths):
    """save_state/load_state hold the quantised cache's bytes: a state loaded back continues
    as the original does; one saved with other cache types is refused, clearly."""
    path = str(paths["h32"])
    llm = llama.Llama(path, n_ctx=64, type_k="q4_0", type_v="q8_0", verbose=False)
    llm.eval(PROMPT)
    state = llm.save_state()
    assert state.arrays["cache_k_l0"].dtype == np.uint8 and state.llama_state_size == llm.ctx.memory.nbytes
    first = llm.create_completion(PROMPT, max_tokens=6, temperature=0.0)["choices"][0]["text"]
    llm.reset()
    llm.load_state(state)
    assert llm.create_completion(PROMPT, max_tokens=6, temperature=0.0)["choices"][0]["text"] == first
    other = llama.Llama(path, n_ctx=64, type_k="q8_0", type_v="q8_0", verbose=False)
    with pytest.raises(ValueError, match="KV cache types K q4_0, V q8_0; this context's are K q8_0, V q8_0"):
        other.load_state(state)


@pytest.mark.parametrize("types", [("q8_0", "q8_0"), ("q4_0", "iq4_nl")], ids="-".join)
def test_sequences_of_a_batch_equal_each_alone(h64, types):
    """Three sequences in each ubatch over a quantised (and rotated) cache, against each
    decoded alone: every row is stored and read as it is alone."""
    check_batched_equals_alone(h64, 3, n_vocab=320, type_k=types[0], type_v=types[1])
