"""The interleaved sliding-window KV cache (llama.cpp's llama_kv_cache_iswa) and the Gemma 3
graph that uses it, on a tiny random-weight gemma3 GGUF written here (reference backend).

The forward pass is checked against a small numpy Gemma 3 written from the architecture's
published description (Gemma 3 technical report / the HF reference model), windowed layers
and all; the cache against its sizing rule, the seq operations on both halves, and the
all-or-nothing placement of a batch.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import llama
from ggmlpy.gguf.writer import GGUFWriter
from ggmlpy.testing.models import add_tiny_bpe_vocab, write_tiny_llama
from llama.batch import Batch, BatchAllocator, UBatch
from llama.hparams import HParams
from llama.kv_cache import KVCache
from llama.kv_cache_iswa import KVCacheISWA, swa_cache_size

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD, N_FF, N_VOCAB = 6, 64, 4, 2, 16, 96, 320
N_SWA = 4
BASE_GLOBAL, BASE_LOCAL = 1e6, 1e4


# -- the tiny model and its independent numpy forward pass --------------------------------------

def write_tiny_gemma3(path, seed: int = 0) -> dict[str, np.ndarray]:
    """A gemma3 GGUF with f32 weights; returns the weights (numpy order) for the oracle."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter("gemma3")
    for key, value in (("context_length", 2048), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
                       ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD_KV), ("attention.key_length", HEAD),
                       ("attention.value_length", HEAD), ("attention.sliding_window", N_SWA)):
        w.add_uint32(f"gemma3.{key}", value)
    w.add_float32("gemma3.rope.freq_base", BASE_GLOBAL)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    add_tiny_bpe_vocab(w, N_VOCAB)
    weights: dict[str, np.ndarray] = {}

    def mat(name, n_in, n_out):
        weights[name] = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def vec(name, n):
        weights[name] = (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    weights["token_embd.weight"] = (0.3 * rng.standard_normal((N_VOCAB, N_EMBD))).astype(np.float32)
    vec("output_norm.weight", N_EMBD)
    for il in range(N_LAYER):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", N_EMBD)
        mat(p + "attn_q.weight", N_EMBD, HEAD * N_HEAD)
        mat(p + "attn_k.weight", N_EMBD, HEAD * N_HEAD_KV)
        mat(p + "attn_v.weight", N_EMBD, HEAD * N_HEAD_KV)
        mat(p + "attn_output.weight", HEAD * N_HEAD, N_EMBD)
        vec(p + "attn_q_norm.weight", HEAD)
        vec(p + "attn_k_norm.weight", HEAD)
        vec(p + "post_attention_norm.weight", N_EMBD)
        vec(p + "ffn_norm.weight", N_EMBD)
        mat(p + "ffn_gate.weight", N_EMBD, N_FF)
        mat(p + "ffn_up.weight", N_EMBD, N_FF)
        mat(p + "ffn_down.weight", N_FF, N_EMBD)
        vec(p + "post_ffw_norm.weight", N_EMBD)
    for name, data in weights.items():
        w.add_tensor(name, data)
    w.write(path)
    return weights


def _rms(x, w, eps=1e-6):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope_neox(x, pos, base):
    """x [T, H, D]: rotate pairs (i, i + D/2) by pos * base^(-2i/D)."""
    d = x.shape[-1]
    theta = pos[:, None] * base ** (-np.arange(0, d, 2) / d)          # [T, D/2]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gemma3_reference(W, tokens, pos=None, window: int | None = N_SWA) -> np.ndarray:
    """Logits [T, n_vocab] of one sequence: every 6th layer global (RoPE base 1e6), the others
    see positions p - window < q <= p (base 1e4). K and V are rounded to f16, as the cache
    stores them. window=None: no sliding window (to show the window matters)."""
    tokens = np.asarray(tokens)
    pos = np.arange(len(tokens), dtype=np.float64) if pos is None else np.asarray(pos, np.float64)
    h = W["token_embd.weight"][tokens].astype(np.float64) * math.sqrt(N_EMBD)
    diff = pos[:, None] - pos[None, :]
    for il in range(N_LAYER):
        p = f"blk.{il}."
        local = (il + 1) % 6 != 0
        x = _rms(h, W[p + "attn_norm.weight"])
        q = (x @ W[p + "attn_q.weight"].T).reshape(len(tokens), N_HEAD, HEAD)
        k = (x @ W[p + "attn_k.weight"].T).reshape(len(tokens), N_HEAD_KV, HEAD)
        v = (x @ W[p + "attn_v.weight"].T).reshape(len(tokens), N_HEAD_KV, HEAD)
        base = BASE_LOCAL if local else BASE_GLOBAL
        q = _rope_neox(_rms(q, W[p + "attn_q_norm.weight"]), pos, base) / math.sqrt(HEAD)
        k = _rope_neox(_rms(k, W[p + "attn_k_norm.weight"]), pos, base)
        k = k.astype(np.float16).astype(np.float64)
        v = v.astype(np.float16).astype(np.float64)
        allowed = diff >= 0
        if local and window is not None:
            allowed &= diff < window
        out = np.empty_like(q)
        for hd in range(N_HEAD):
            kv = hd // (N_HEAD // N_HEAD_KV)
            s = np.where(allowed, q[:, hd] @ k[:, kv].T, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, hd] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        o = out.reshape(len(tokens), -1) @ W[p + "attn_output.weight"].T
        h = h + _rms(o, W[p + "post_attention_norm.weight"])
        x = _rms(h, W[p + "ffn_norm.weight"])
        f = _gelu(x @ W[p + "ffn_gate.weight"].T) * (x @ W[p + "ffn_up.weight"].T)
        f = f @ W[p + "ffn_down.weight"].T
        h = h + _rms(f, W[p + "post_ffw_norm.weight"])
    return _rms(h, W["output_norm.weight"]) @ W["token_embd.weight"].T.astype(np.float64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny-gemma3.gguf"
    weights = write_tiny_gemma3(path)
    model = llama.Model.load(path)
    yield model, weights
    model.close()


def make_ctx(model, **kw):
    kw.setdefault("backend", "ref")
    return llama.Context(model, **kw)


TOKENS = [int(t) for t in np.random.default_rng(7).integers(1, N_VOCAB, 320)]


def assert_close(ours, ref, tol=2e-3):
    """Logits of magnitude ~1-10; f32 graph vs f64 oracle with the same f16 K/V."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    np.testing.assert_allclose(ours, ref, atol=tol * max(1.0, float(np.abs(ref).max())), rtol=0)


# -- hyperparameters and sizing ------------------------------------------------------------------

def test_gemma3_hparams_from_file(tiny):
    hp = tiny[0].hparams
    assert hp.n_swa == N_SWA and hp.rope_type == 2
    assert hp.swa_layers == [True] * 5 + [False]
    assert (hp.rope_freq_base, hp.rope_freq_base_swa) == (BASE_GLOBAL, BASE_LOCAL)
    assert hp.f_attention_scale == pytest.approx(1 / math.sqrt(HEAD))


def test_set_swa_pattern_like_llama_cpp():
    hp = HParams("x", 0, 8, 18, [8] * 18, [2] * 18, [1] * 18, 4, 4, 4, 10)
    hp.set_swa_pattern(6)
    assert [il for il in range(18) if not hp.is_swa(il)] == [5, 11, 17]
    hp.set_swa_pattern(2, dense_first=True)
    assert [il for il in range(6) if not hp.is_swa(il)] == [0, 2, 4]
    hp.set_swa_pattern(0)
    assert all(hp.swa_layers)
    hp.set_swa_pattern(1)
    assert not any(hp.swa_layers)


def test_swa_cache_size_rule():
    # window of every sequence plus one ubatch, padded to 256, capped by the main cache
    assert swa_cache_size(32768, 512, 1, 512) == 1024
    assert swa_cache_size(32768, 512, 4, 512) == 2560
    assert swa_cache_size(4096, 1024, 4, 512) == 4096
    assert swa_cache_size(1024, 4, 1, 8) == 256
    assert swa_cache_size(256, 512, 1, 512) == 256
    assert swa_cache_size(32768, 512, 1, 512, swa_full=True) == 32768


def test_context_sizes_the_two_halves(tiny):
    model = tiny[0]
    ctx = make_ctx(model, n_ctx=1024, n_batch=64, n_ubatch=8)
    mem = ctx.memory
    assert isinstance(mem, KVCacheISWA)
    assert (mem.base.size, mem.swa.size) == (1024, 256)
    assert sorted(mem.base.k) == [5] and sorted(mem.swa.k) == [0, 1, 2, 3, 4]
    row = HEAD * N_HEAD_KV * 2  # f16 bytes per cell per layer, K or V
    assert mem.nbytes == 2 * row * (1024 * 1 + 256 * 5)
    assert ctx.kv_layout.kv_size_swa == 256
    full = make_ctx(model, n_ctx=1024, n_batch=64, n_ubatch=8, swa_full=True).memory
    assert (full.base.size, full.swa.size) == (1024, 1024)
    assert full.nbytes == 2 * row * 1024 * N_LAYER > mem.nbytes


def test_models_without_window_keep_the_unified_cache(tmp_path):
    model = llama.Model.load(write_tiny_llama(tmp_path / "tiny-llama.gguf"))
    ctx = make_ctx(model, n_ctx=256)
    assert type(ctx.memory) is KVCache and ctx.kv_layout.kv_size_swa == 0
    model.close()


# -- the forward pass ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def long_run(tiny):
    """320 tokens in ubatches of 8 through a 256-cell SWA cache (so its cells are recycled),
    then 12 more one at a time; logits of every position."""
    model, _ = tiny
    ctx = make_ctx(model, n_ctx=512, n_batch=512, n_ubatch=8)
    prompt, tail = TOKENS[:308], TOKENS[308:]
    assert ctx.decode(Batch.from_tokens(prompt, logits_all=True)) == 0
    rows = [ctx.get_logits().copy()]
    for t in tail:
        assert ctx.decode(Batch.from_tokens([t])) == 0
        rows.append(ctx.get_logits().copy())
    return ctx, np.concatenate(rows)


def test_logits_match_numpy_gemma3_with_window(tiny, long_run):
    _, weights = tiny
    ctx, ours = long_run
    ref = gemma3_reference(weights, TOKENS)
    assert_close(ours, ref)
    # the window changes the answer, so a missing or wrong SWA mask could not pass
    no_window = gemma3_reference(weights, TOKENS[:40], window=None)
    assert np.abs(no_window[20:] - ref[20:40]).max() > 0.1


def test_swa_cache_recycles_cells_and_main_cache_keeps_all(long_run):
    ctx, _ = long_run
    mem = ctx.memory
    n = len(TOKENS)
    assert mem.base.cells.used == n and mem.base.seq_pos_min(0) == 0
    # the SWA half fills up, then overwrites the oldest cells: it keeps the last 256 positions
    assert mem.swa.cells.used == mem.swa.size == 256
    assert mem.swa.seq_pos_min(0) == n - 256
    assert (mem.seq_pos_min(0), mem.seq_pos_max(0)) == (mem.swa.seq_pos_min(0), n - 1)


def test_small_swa_cache_equals_full_size_one(tiny, long_run):
    model, _ = tiny
    _, ours = long_run
    full = make_ctx(model, n_ctx=512, n_batch=512, n_ubatch=8, swa_full=True)
    assert full.memory.swa.size == 512
    assert full.decode(Batch.from_tokens(TOKENS, logits_all=True)) == 0
    # the two caches hold the same cells in other places and sizes, so numpy's BLAS sums in
    # another order; an f32 difference that flips an f16 rounding of K/V then grows through
    # the layers (3e-4 on an AVX2 machine), so this uses the oracle's tolerance
    assert_close(full.get_logits(), ours)


# -- seq operations on both halves ---------------------------------------------------------------

def test_seq_rm_then_redecode(tiny):
    model, weights = tiny
    ctx = make_ctx(model, n_ctx=512, n_batch=64, n_ubatch=8)
    assert ctx.decode(Batch.from_tokens(TOKENS[:40])) == 0
    assert ctx.memory.seq_rm(0, 37, -1)
    assert ctx.memory.base.seq_pos_max(0) == ctx.memory.swa.seq_pos_max(0) == 36
    new_tail = [5, 6, 7]
    assert ctx.decode(Batch.from_tokens(new_tail, logits_all=True)) == 0
    assert_close(ctx.get_logits(), gemma3_reference(weights, TOKENS[:37] + new_tail)[37:])


def test_seq_cp_then_continue_copy(tiny):
    model, weights = tiny
    ctx = make_ctx(model, n_ctx=256, n_batch=64, n_ubatch=16, n_seq_max=2)
    assert ctx.decode(Batch.from_tokens(TOKENS[:20])) == 0
    ctx.memory.seq_cp(0, 1)
    for half in (ctx.memory.base, ctx.memory.swa):
        assert (half.seq_pos_min(1), half.seq_pos_max(1)) == (half.seq_pos_min(0), 19)
    ctx.memory.seq_keep(1)
    assert ctx.memory.base.seq_pos_max(0) == ctx.memory.swa.seq_pos_max(0) == -1
    tail = [9, 8, 7, 6]
    b = Batch(tokens=tail, pos=list(range(20, 24)), seq_ids=[1] * 4, logits=[True] * 4)
    assert ctx.decode(b) == 0
    assert_close(ctx.get_logits(), gemma3_reference(weights, TOKENS[:20] + tail)[20:])


def test_seq_add_shifts_keys_in_both_halves(tiny):
    """Positions moved by seq_add are re-rotated (K-shift) in both caches, whose sizes
    differ: the next token then sees the same relative positions as a fresh run."""
    model, weights = tiny
    ids = TOKENS[:30]
    ctx = make_ctx(model, n_ctx=512, n_batch=64, n_ubatch=8)
    assert ctx.decode(Batch.from_tokens(ids[:-1])) == 0
    ctx.memory.seq_add(0, 0, -1, 7)
    assert ctx.memory.has_shift
    assert (ctx.memory.base.seq_pos_max(0), ctx.memory.swa.seq_pos_max(0)) == (35, 35)
    assert ctx.decode(Batch(tokens=[ids[-1]], pos=[36], seq_ids=[0], logits=[True])) == 0
    assert not ctx.memory.has_shift
    ref = gemma3_reference(weights, ids, pos=np.arange(7, 37))[-1]
    assert_close(ctx.get_logits_ith(-1), ref, tol=5e-3)  # K rotated twice in f16: looser
    # without the shift the keys would sit at the old positions: visibly different
    stale = gemma3_reference(weights, ids, pos=np.r_[np.arange(29), 36])[-1]
    assert np.abs(stale - ref).max() > 0.05


def test_seq_div_and_clear_reach_both_halves(tiny):
    model, _ = tiny
    ctx = make_ctx(model, n_ctx=256, n_batch=64, n_ubatch=16)
    assert ctx.decode(Batch.from_tokens(TOKENS[:12])) == 0
    ctx.memory.seq_div(0, 0, -1, 2)
    assert ctx.memory.base.seq_pos_max(0) == ctx.memory.swa.seq_pos_max(0) == 5
    ctx.memory.clear()
    assert ctx.memory.base.cells.used == ctx.memory.swa.cells.used == 0
    assert ctx.memory.seq_pos_max(0) == -1


# -- all or nothing ------------------------------------------------------------------------------

def _hp(n_layer: int = 3, n_swa: int = 4) -> HParams:
    hp = HParams("test", 1024, 8, n_layer, [16] * n_layer, [2] * n_layer, [1] * n_layer, 4, 4, 4, 10,
                 n_swa=n_swa)
    hp.set_swa_pattern(3)  # layers 0, 1 windowed, 2 global
    return hp


def _ubatch(pos, seq=0) -> UBatch:
    ab = BatchAllocator.init(
        Batch(tokens=[1] * len(pos), pos=list(pos), seq_ids=[seq] * len(pos), logits=[False] * len(pos)),
        10, 2)
    return ab.split_all(len(pos), "simple")[0]


def _cells_state(mem):
    return [(c.pos.copy(), c.seq.copy(), c.head) for c in (mem.base.cells, mem.swa.cells)]


def _same(a, b):
    return all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) and x[2] == y[2]
               for x, y in zip(a, b))


def test_prepare_fails_in_swa_half_changes_nothing():
    mem = KVCacheISWA(_hp(), 64, n_seq_max=2, n_ubatch=4, swa_pad=1)
    assert (mem.base.size, mem.swa.size) == (64, 12)
    ub = _ubatch(range(8))
    mem.apply_ubatch(mem.prepare([ub])[0], ub)
    mem.seq_cp(0, 1)  # cells shared by two sequences cannot be recycled
    before = _cells_state(mem)
    # the 4 free cells take the first ubatch; for the second only the cell of position 8
    # (seq 0 alone, out of the window of position 12) can be recycled: 1 cell for 4 tokens
    ubatches = [_ubatch(range(8, 12)), _ubatch(range(12, 16))]
    assert mem.base.prepare(ubatches) is not None
    assert mem.prepare(ubatches) is None
    assert _same(before, _cells_state(mem))
    # once the copy is gone the old cells can be recycled too
    mem.seq_rm(1)
    slots = mem.prepare(ubatches)
    assert slots is not None and [s.n_tokens for s in slots] == [4, 4]
    assert set(slots[1].swa.idxs.tolist()) <= set(range(9))  # recycled: positions 0..8


def test_prepare_fails_in_main_half_changes_nothing():
    mem = KVCacheISWA(_hp(), 16, n_seq_max=1, n_ubatch=4, swa_pad=1)
    for p0 in range(0, 16, 4):
        ub = _ubatch(range(p0, p0 + 4))
        mem.apply_ubatch(mem.prepare([ub])[0], ub)
    assert mem.base.cells.used == 16 and mem.swa.cells.used <= mem.swa.size == 8
    before = _cells_state(mem)
    assert mem.prepare([_ubatch([16])]) is None  # the main cache is full
    assert _same(before, _cells_state(mem))


def test_decode_without_room_returns_1_and_leaves_both_halves(tiny):
    model, _ = tiny
    ctx = make_ctx(model, n_ctx=256, n_batch=256, n_ubatch=8)
    assert ctx.decode(Batch.from_tokens(TOKENS[:250])) == 0
    before = _cells_state(ctx.memory)
    assert ctx.decode(Batch.from_tokens(TOKENS[250:260])) == 1   # 6 cells left in the main cache
    assert _same(before, _cells_state(ctx.memory))
    assert ctx.memory.seq_pos_max(0) == 249


def test_iswa_needs_a_window():
    with pytest.raises(ValueError, match="n_swa"):
        KVCacheISWA(_hp(n_swa=0), 64)
