"""The CPU backend's repacked weights (codegen_cpu/repack.py, kernels/qrepacked.py).

- the layout, decoded by a slow independent reading of the documented format, gives back
  exactly the GGUF weights (dequantised by ggmlpy.quants, itself bit-exact against gguf);
- mul_mat on repacked weights against the reference backend (ggml's bar) and against an
  exact model of the 8-bit activation scheme (f32 rounding only), over decode and prefill
  token counts, odd block counts and thread counts; a row's result never depends on the
  thread split;
- a weight read both ways in one graph (a tied embedding: get_rows and the output product);
- repacking happens once per model and the memory map's pages are released.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from ggmlpy.codegen_cpu import repack
from ggmlpy.codegen_cpu import repack_superblocks as superblocks
from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.ops import OpCase, SrcSpec
from ggmlpy.testing.ops import make_inputs, normalized_error, run_case, source_values
from ggmlpy.ir.tensor import Flag
from ggmlpy.ir.types import GGMLType, type_size
from ggmlpy.quants import dequantize
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.sched.store import TensorStore

from .test_cpu_quant_kernels import EXACT_BAR, GGML_BAR, _kernel_model

G = GGMLType
TYPES = (G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q8_0, G.MXFP4, G.IQ4_NL)
# MXFP4's codes (ggml's kvalues_mxfp4, the E2M1 values doubled) and its E8M0 scale 2^(e - 128)
MXFP4_CODES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
# ggml-common.h's kvalues_iq4nl, written out here independently of ggmlpy/quants/iq_grids.py
IQ4NL_CODES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
IQ2_LEVELS = (8, 25, 43)   # the values of ggml's iq2xs_grid and iq2s_grid entries
IQ3XXS_LEVELS = (4, 12, 20, 28, 36, 44, 52, 62)   # and of its iq3xxs_grid's
SHAPES = [(64, 16, 1), (64, 32, 2), (96, 16, 3), (96, 32, 5), (576, 48, 7), (1536, 32, 13), (160, 16, 48), (576, 64, 300)]
KTYPES = (G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K, G.IQ4_XS, G.IQ3_S, G.IQ3_XXS, G.IQ2_XS, G.IQ2_S)
BIT_MOVED = tuple(t for t in KTYPES if t not in superblocks.CODE_VALUES)   # repacked by repack_bits' tables
SIGN_BITS = (G.Q1_0,)   # blocks of 128 sign bits, kept as the dots' masks
BIT_SHAPES = [(128, 16, 1), (256, 32, 2), (384, 16, 3), (1536, 32, 13), (256, 16, 48), (640, 64, 300)]
KSHAPES = [(256, 16, 1), (256, 32, 4), (512, 16, 3), (512, 32, 7), (1024, 48, 40), (2048, 16, 13), (768, 64, 300)]


def _f16(b: np.ndarray) -> np.ndarray:
    return b.view(np.float16).astype(np.float32)


def _unpack(packed: np.ndarray, t: GGMLType, k: int, m: int) -> np.ndarray:
    """Read the repacked bytes back to f32 weights [m, k], one value at a time from the
    layout the module docstring describes (written independently of repack())."""
    out = np.zeros((m, k), np.float32)
    sb = repack.STEP_BYTES[t]
    n_steps = repack.n_steps(t, k)
    for g in range(m // 16):
        for s in range(n_steps):
            step = packed[(g * n_steps + s) * sb:(g * n_steps + s + 1) * sb]
            for h in range(2):
                blk = 2 * s + h
                if blk >= k // 32:
                    continue
                for r in range(16):
                    if t == G.MXFP4:   # the exponent byte of block h, row r at byte 16h + r
                        d = np.float32(np.ldexp(1.0, int(step[repack.d_offset(t) + 16 * h + r]) - 128))
                    else:
                        d = _f16(step[repack.d_offset(t) + 2 * (16 * h + r):][:2])[0]
                    vals = np.zeros(32, np.float32)
                    for j in range(32):
                        if t == G.Q1_0:   # bit 4r + i of word c of vector h: value 4c + i, +d or -d
                            c, i = divmod(j, 4)
                            word = int(step[64 * h + 8 * c:64 * h + 8 * c + 8].view("<u8")[0])
                            vals[j] = d if (word >> (4 * r + i)) & 1 else -d
                            continue
                        if t == G.Q8_0:
                            c, i = divmod(j, 4)
                            byte = step[64 * (8 * h + c) + 4 * r + i]
                            vals[j] = (int(byte) - 128) * d
                            continue
                        c, i = divmod(j % 16, 4)
                        byte = int(step[64 * (4 * h + c) + 4 * r + i])
                        q = (byte & 15) if j < 16 else (byte >> 4)
                        if t in (G.Q5_0, G.Q5_1):
                            plane = int(step[repack.qh_offset(t) + 64 * h + 4 * r + i])
                            q |= ((plane >> (c if j < 16 else 4 + c)) & 1) << 4
                        if t == G.Q5_0:
                            vals[j] = (q - 16) * d
                        elif t == G.Q4_0:
                            vals[j] = (q - 8) * d
                        elif t == G.MXFP4:
                            vals[j] = MXFP4_CODES[q] * d
                        elif t == G.IQ4_NL:
                            vals[j] = IQ4NL_CODES[q] * d
                        else:
                            mn = _f16(step[repack.m_offset(t) + 2 * (16 * h + r):][:2])[0]
                            vals[j] = q * d + mn
                    out[16 * g + r, 32 * blk:32 * blk + 32] = vals
    return out


def _unpack_kquant(packed: np.ndarray, t: GGMLType, k: int, m: int) -> np.ndarray:
    """As _unpack, for the K-quants (one step = one super-block of 256 values)."""
    out = np.zeros((m, k), np.float32)
    sb = repack.STEP_BYTES[t]
    n_steps = k // 256
    for g in range(m // 16):
        for s in range(n_steps):
            step = packed[(g * n_steps + s) * sb:(g * n_steps + s + 1) * sb]
            for r in range(16):
                d = _f16(step[superblocks.K_D[t] + 2 * r:][:2])[0]
                for v in range(256):
                    j, within = divmod(v, 64)
                    if t in (G.Q2_K, G.Q3_K, G.IQ2_XS, G.IQ2_S):
                        out[16 * g + r, 256 * s + v] = _crumb_value(step, t, r, d, j, within)
                        continue
                    half, pos = divmod(within, 32)
                    c, i = divmod(pos, 4)
                    byte = int(step[superblocks.k_values_offset(t, j, c) + 4 * r + i])
                    nib = (byte & 15) if half == 0 else (byte >> 4)
                    if t == G.Q5_K:   # fifth bit: vector `half`, byte i, bit c
                        nib |= ((int(step[superblocks.k_high_offset(t, j, half) + 4 * r + i]) >> c) & 1) << 4
                    if t in (G.IQ4_XS, G.IQ3_S):   # codes: IQ4_XS's kvalues_iq4nl, IQ3_S's CODE_VALUES
                        sc = np.float32(step[superblocks.k_scale_offset(t, v // 32) + r].view(np.int8))
                        value = np.float32(d * sc) * np.float32(_code_values(t)[nib])
                    elif t == G.IQ3_XXS:   # code: level nib % 8 of iq3xxs_grid's, bit 3 a minus sign
                        sc = np.float32(step[superblocks.k_scale_offset(t, v // 32) + r].view(np.int8))
                        value = np.float32(np.float32(d / 4) * sc) * np.float32(
                            IQ3XXS_LEVELS[nib % 8] * (-1 if nib >= 8 else 1))
                    elif t in (G.Q4_K, G.Q5_K):
                        sub = 2 * j + half
                        sc = np.float32(step[superblocks.k_scale_offset(t, sub) + r])
                        mn = np.float32(step[superblocks.k_min_offset(t, sub) + r])
                        dmin = _f16(step[superblocks.K_D[t] + 32 + 2 * r:][:2])[0]
                        value = np.float32(d * sc) * np.float32(nib) - np.float32(dmin * mn)
                    else:
                        qh = int(step[superblocks.q6_high_offset(j, c // 2) + 4 * r + i])
                        q = nib | (((qh >> (2 * (c % 2) + 4 * half)) & 3) << 4)
                        sc = np.float32(step[superblocks.k_scale_offset(t, v // 16) + r].view(np.int8))
                        value = np.float32(q - 32) * np.float32(d * sc)
                    out[16 * g + r, 256 * s + v] = value
    return out


def _code_values(t: GGMLType) -> tuple[int, ...]:
    from ggmlpy.quants.iq_grids import KVALUES_IQ4NL

    return superblocks.CODE_VALUES.get(t, tuple(int(v) for v in KVALUES_IQ4NL))


def _crumb_value(step: np.ndarray, t: GGMLType, r: int, d: np.float32, j: int, w: int) -> np.float32:
    """Value 64j + w of row r in a Q2_K, Q3_K, IQ2_XS or IQ2_S step: two bits from low-bit vector
    (w % 16) // 4, bits 2 (w // 16); Q3_K's and IQ2's third bit from vector w // 32, bit
    (w % 32) // 4 (Q3_K: a clear bit meaning minus 4); its sub-block's scale (and Q2_K's
    minimum) at byte 16 * sub + r."""
    e, rest = divmod(w, 16)
    c, i = divmod(rest, 4)
    q = (int(step[superblocks.k_values_offset(t, j, c) + 4 * r + i]) >> (2 * e)) & 3
    sub = (64 * j + w) // 16
    scale_byte = step[superblocks.k_scale_offset(t, sub) + r]
    if t == G.Q2_K:
        dmin = _f16(step[superblocks.K_D[t] + 32 + 2 * r:][:2])[0]
        return np.float32(d * np.float32(scale_byte & 15)) * np.float32(q) - np.float32(dmin * np.float32(scale_byte >> 4))
    h, within = divmod(w, 32)
    high = (int(step[superblocks.k_high_offset(t, j, h) + 4 * r + within % 4]) >> (within // 4)) & 1
    if t in (G.IQ2_XS, G.IQ2_S):   # the two bits pick 8, 25 or 43 (iq2xs_grid's levels), the third bit a minus sign
        return np.float32(np.float32(d / 8) * np.float32(scale_byte.view(np.int8))) * np.float32(
            IQ2_LEVELS[q] * (-1 if high else 1))
    return np.float32(d * np.float32(scale_byte.view(np.int8))) * np.float32(q - (0 if high else 4))


@pytest.mark.parametrize("t,k,m", [(G.Q4_K, 256, 16), (G.Q4_K, 512, 32), (G.Q6_K, 256, 16), (G.Q6_K, 512, 16),
                                   (G.Q2_K, 256, 16), (G.Q2_K, 512, 32), (G.Q3_K, 256, 16), (G.Q3_K, 512, 32),
                                   (G.Q5_K, 256, 16), (G.Q5_K, 512, 32), (G.IQ4_XS, 256, 16), (G.IQ4_XS, 768, 32),
                                   (G.IQ3_S, 256, 16), (G.IQ3_S, 768, 32), (G.IQ2_XS, 256, 16), (G.IQ2_XS, 768, 32),
                                   (G.IQ2_S, 256, 16), (G.IQ2_S, 768, 32), (G.IQ3_XXS, 256, 16), (G.IQ3_XXS, 768, 32)],
                         ids=str)
def test_kquant_layout_reads_back_exactly(t, k, m):
    case = OpCase((SrcSpec(t, (k, m, 1, 1)),))
    raw = make_inputs(case, np.random.default_rng(5))["src0"]
    packed = repack.repack(raw, t, k, m)
    assert packed.nbytes == repack.repacked_nbytes(t, k, m)
    expected = dequantize(np.ascontiguousarray(raw), t, (k, m)).reshape(m, k)
    np.testing.assert_array_equal(_unpack_kquant(packed, t, k, m), expected)


@pytest.mark.parametrize("t,k,m", [(t, k, m) for t in TYPES for k, m in [(64, 16), (96, 32), (160, 16)]]
                         + [(G.Q1_0, 128, 16), (G.Q1_0, 384, 32)], ids=str)
def test_layout_reads_back_exactly(t, k, m):
    case = OpCase((SrcSpec(t, (k, m, 1, 1)),))
    raw = make_inputs(case, np.random.default_rng(3))["src0"]
    packed = repack.repack(raw, t, k, m)
    assert packed.nbytes == repack.repacked_nbytes(t, k, m)
    assert packed.ctypes.data % repack.ALIGN == 0
    expected = dequantize(np.ascontiguousarray(raw), t, (k, m)).reshape(m, k)
    np.testing.assert_array_equal(_unpack(packed, t, k, m), expected)


def test_repack_rejects_bad_shapes():
    raw = np.zeros(20 * 2 * 8, np.uint8)
    with pytest.raises(ValueError, match="groups of 16"):
        repack.repack(raw, G.Q4_1, 64, 8)
    with pytest.raises(ValueError, match="needs"):
        repack.repack(raw, G.Q4_1, 64, 16)
    with pytest.raises(ValueError, match="no repacked layout"):
        repack.repack(raw, G.F16, 256, 16)


def _weight_case(t: GGMLType, k: int, m: int, n: int) -> OpCase:
    return OpCase((SrcSpec(t, (k, m, 1, 1), weight=True), SrcSpec(G.F32, (k, n, 1, 1))))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k,m,n", SHAPES, ids=str)
def test_mul_mat_on_repacked_weights(t, k, m, n):
    case = _weight_case(t, k, m, n)
    inputs = make_inputs(case, np.random.default_rng(k + m + n))
    ours, _ = run_case("mul_mat", case, CpuBackend(n_threads=2), inputs=inputs)
    expected, _ = run_case("mul_mat", case, RefBackend(), inputs=inputs)
    w, x = source_values(case, inputs)
    assert normalized_error(ours, expected) <= GGML_BAR
    assert normalized_error(ours[0, 0], _kernel_model(t, inputs["src0"], w[0, 0], x[0, 0])) <= EXACT_BAR


@pytest.mark.parametrize("t", KTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("k,m,n", KSHAPES, ids=str)
def test_kquant_mul_mat_on_repacked_weights(t, k, m, n):
    test_mul_mat_on_repacked_weights(t, k, m, n)


@pytest.mark.parametrize("t", SIGN_BITS, ids=lambda t: t.name)
@pytest.mark.parametrize("k,m,n", BIT_SHAPES, ids=str)
def test_sign_bits_mul_mat_on_repacked_weights(t, k, m, n):
    test_mul_mat_on_repacked_weights(t, k, m, n)


@pytest.mark.parametrize("t", [G.Q4_1, G.Q5_0, G.Q5_1, G.Q3_K, G.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 7, 40])
def test_result_independent_of_threads(t, n):
    case = _weight_case(t, 768, 80, n)   # 5 groups: uneven splits over 2 and 3 threads
    inputs = make_inputs(case, np.random.default_rng(9))
    results = [run_case("mul_mat", case, CpuBackend(n_threads=nt), inputs=inputs)[0] for nt in (1, 2, 3)]
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


@pytest.mark.parametrize("t", [G.Q4_1, G.Q5_1, G.Q8_0, G.Q1_0, G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K],
                         ids=lambda t: t.name)
def test_batched_tokens_equal_each_token_alone(t):
    """Batched decode: a token's result does not depend on the tile it falls in (tiles of
    4, 2 and 1 tokens), bit for bit."""
    k = 512 if t in KTYPES + SIGN_BITS else 576
    full = _weight_case(t, k, 48, 13)
    inputs = make_inputs(full, np.random.default_rng(3))
    backend = CpuBackend(n_threads=2)
    batched, _ = run_case("mul_mat", full, backend, inputs=inputs)
    for n in (1, 2, 3, 4, 5):
        part = _weight_case(t, k, 48, n)
        sub = dict(inputs, src1=inputs["src1"][..., :n, :])
        alone, _ = run_case("mul_mat", part, backend, inputs=sub)
        np.testing.assert_array_equal(alone, batched[..., :n, :])


def test_weights_are_repacked_only_where_the_layout_applies():
    b = GraphBuilder()
    w = b.input("w", G.Q4_1, (64, 32, 1, 1))
    w.flags = Flag.WEIGHT
    odd = b.input("odd", G.Q4_1, (64, 24, 1, 1))
    odd.flags = Flag.WEIGHT
    act = b.input("act", G.Q4_1, (64, 32, 1, 1))
    assert repack.is_repacked(w)
    assert not repack.is_repacked(odd)      # 24 rows: not whole groups
    assert not repack.is_repacked(act)      # not a weight: computed per run
    f16 = b.input("f16", G.F16, (64, 32, 1, 1))
    f16.flags = Flag.WEIGHT
    assert not repack.is_repacked(f16)


def test_tied_embedding_read_both_ways():
    """A weight read by get_rows and by mul_mat (a tied embedding): one repacked copy."""
    k, m, n = 128, 48, 3
    rng = np.random.default_rng(4)
    wcase = OpCase((SrcSpec(G.Q8_0, (k, m, 1, 1)),))
    wdata = make_inputs(wcase, rng)["src0"]
    ids = np.array([5, 0, 47], np.int32)
    b = GraphBuilder()
    w = b.input("tok_embd", G.Q8_0, (k, m, 1, 1))
    w.flags = Flag.WEIGHT
    tokens = b.input("ids", G.I32, (n, 1, 1, 1))
    rows = b.get_rows(w, tokens)
    logits = b.mul_mat(w, rows)
    graph = b.build([logits])

    def run(backend):
        store = TensorStore({"tok_embd": np.array(wdata, copy=True), "ids": ids})
        backend.compile(graph, graph.nodes).run(store, {})
        return np.array(store.array(logits, {}), copy=True)

    ours, expected = run(CpuBackend(n_threads=2)), run(RefBackend())
    assert normalized_error(ours, expected) <= GGML_BAR


def test_repacked_once_per_model_and_pages_released(smollm2_path):
    import llama

    model = llama.Model.load(smollm2_path)
    ctx1 = llama.Context(model, n_ctx=256, n_batch=32, n_ubatch=32)
    ctx2 = llama.Context(model, n_ctx=256, n_batch=32, n_ubatch=32)
    for ctx in (ctx1, ctx2):
        assert ctx.decode(llama.Batch.from_tokens([1, 2, 3])) == 0
    layouts = model.backend_cache["cpu.repacked"]
    assert ctx1.backends[0].weight_layouts is ctx2.backends[0].weight_layouts is layouts
    # every Q4_1 weight, and the tied Q8_0 embedding (the output product)
    assert "token_embd.weight" in layouts.arrays
    assert sum(name.endswith("ffn_up.weight") for name in layouts.arrays) == model.hparams.n_layer
    np.testing.assert_array_equal(ctx1.get_logits_ith(-1), ctx2.get_logits_ith(-1))
    # the file pages of the repacked weights are no longer resident in this process (in
    # this model's mapping: another test's model may map the same file)
    weights = model.weight_arrays().values()
    span = (min(a.ctypes.data for a in weights), max(a.ctypes.data + a.nbytes for a in weights))
    resident = _mapping_rss_kib(str(smollm2_path), span)
    assert resident * 1024 < 0.25 * model.size_bytes, resident


def test_parallel_repack_equals_one_at_a_time():
    """WeightLayouts.prepare (a first decode's repack, on the backend's threads) makes the
    same bytes as get, one weight at a time, and leaves the weights already done alone."""
    from ggmlpy.codegen_cpu.repack import WeightLayouts
    from ggmlpy.ir.tensor import Tensor, contiguous_strides

    rng = np.random.default_rng(5)
    pending = []
    for i, (t, k, m) in enumerate([(G.Q4_1, 576, 64), (G.Q8_0, 576, 48), (G.Q4_K, 512, 32), (G.Q6_K, 256, 16),
                                   (G.Q4_0, 96, 32), (G.Q8_0, 64, 16 * 8000)]):   # the last: 2+ slices
        per = 256 if t in KTYPES else 32
        raw = rng.integers(0, 256, m * (k // per) * type_size(t), dtype=np.uint8)
        ne = (k, m, 1, 1)
        pending.append((Tensor(name=f"w{i}", type=t, ne=ne, nb=contiguous_strides(t, ne), flags=Flag.WEIGHT), raw))
    serial, parallel = WeightLayouts(release=False), WeightLayouts(release=False)
    for t, raw in pending:
        serial.get(t, raw)
    done_before = parallel.get(*pending[0])
    parallel.prepare(pending, n_threads=2)
    assert parallel.arrays["w0"] is done_before
    assert serial.arrays.keys() == parallel.arrays.keys()
    for name in serial.arrays:
        np.testing.assert_array_equal(serial.arrays[name], parallel.arrays[name])
    # one thread (the caller alone) gives the same bytes too
    alone = WeightLayouts(release=False)
    alone.prepare(pending, n_threads=1)
    for name in serial.arrays:
        np.testing.assert_array_equal(serial.arrays[name], alone.arrays[name])


def _mapping_rss_kib(path: str, span: tuple[int, int]) -> int:
    """Resident KiB of the mappings of `path` within the address range `span`."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                inside = line.rstrip().endswith(path) and lo < span[1] and span[0] < hi
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


@pytest.mark.parametrize("t", TYPES + SIGN_BITS, ids=lambda t: t.name)
def test_get_rows_from_repacked_table(t):
    k, m = (384 if t in SIGN_BITS else 160), 48   # an odd number of blocks (of 32; Q1_0: of 128)
    case = OpCase((SrcSpec(t, (k, m, 1, 1), weight=True), SrcSpec(G.I32, (6,), fill="rows:48")))
    inputs = make_inputs(case, np.random.default_rng(6))
    inputs["src1"] = np.array([0, 15, 16, 47, 31, 15], np.int32)
    ours, _ = run_case("get_rows", case, CpuBackend(n_threads=2), inputs=inputs)
    expected = dequantize(np.ascontiguousarray(inputs["src0"]), t, (k, m)).reshape(m, k)[inputs["src1"]]
    np.testing.assert_array_equal(ours.reshape(expected.shape), expected)


def test_get_rows_of_a_kquant_weight_reads_the_gguf_bytes():
    """K-quant tables have no repacked get_rows: the weight gets a plain slot too."""
    k, m = 256, 32
    case = OpCase((SrcSpec(G.Q4_K, (k, m, 1, 1), weight=True), SrcSpec(G.I32, (3,), fill="rows:32")))
    inputs = make_inputs(case, np.random.default_rng(8))
    ours, _ = run_case("get_rows", case, CpuBackend(n_threads=2), inputs=inputs)
    expected = dequantize(np.ascontiguousarray(inputs["src0"]), G.Q4_K, (k, m)).reshape(m, k)[inputs["src1"]]
    np.testing.assert_array_equal(ours.reshape(expected.shape), expected)


@pytest.mark.parametrize("n", [5, 1], ids=["tiles-of-4-and-1", "one-token"])
def test_prefetch_changes_no_result(tmp_path, monkeypatch, n):
    """The weights' software prefetch is emitted where the tables ask for it (tiles of 2+
    tokens, and one-token tiles on the flavours without VNNI) and leaves every result
    bit-identical."""
    from ggmlpy.codegen_cpu.kernels import qrepacked
    from ggmlpy.codegen_cpu.kernels.qvec import flavour
    from ggmlpy.codegen_cpu.program import ProgramBuilder
    from ggmlpy.options import Options
    from ggmlpy.testing.ops import build_case_graph

    case = _weight_case(G.Q4_1, 576, 48, n)
    inputs = make_inputs(case, np.random.default_rng(5))
    results, irs = [], []
    for ahead in (0, 4096):
        monkeypatch.setitem(qrepacked.PREFETCH_AHEAD, G.Q4_1, ahead)
        monkeypatch.setitem(qrepacked.PREFETCH_FAR, flavour(), {G.Q4_1: 2 * ahead})   # and the streaming one
        monkeypatch.setitem(qrepacked.PREFETCH_MIN_TOKENS, flavour(), 1)
        # a cache per setting: plan keys follow the generator's source, not this table
        backend = CpuBackend(n_threads=2, options=Options(cache_dir=str(tmp_path / str(ahead))))
        results.append(run_case("mul_mat", case, backend, inputs=inputs)[0])
        graph, _ = build_case_graph("mul_mat", case)
        builder = ProgramBuilder(graph, graph.nodes, backend.worst_env, set(), False, backend.qdot)
        irs.append("".join(unit.build_ir() for unit in builder.units()))
    np.testing.assert_array_equal(results[0], results[1])
    assert "llvm.prefetch" not in irs[0]
    assert "i32 0, i32 3, i32 1)" in irs[1] and "i32 0, i32 0, i32 1)" in irs[1]


def test_one_token_tiles_prefetch_without_vnni():
    """A one-token tile (decode) prefetches its Q4_1 and Q8_0 weights where a dot step takes
    several instructions (AVX2, plain IR), not where it is one vpdpbusd; the tiles of 2 and
    4 tokens prefetch with every flavour. A product's kernel holds all three tiles (the
    token count is a symbol), so the one-token tile shows as one more prefetching loop.
    Only the IR text is built: every flavour is checked on any host."""
    from ggmlpy.codegen_cpu.program import ProgramBuilder
    from ggmlpy.testing.ops import build_case_graph

    def prefetch_sites(t: GGMLType, qdot: str, locality: int) -> int:
        graph, _ = build_case_graph("mul_mat", _weight_case(t, 576, 48, 1))
        builder = ProgramBuilder(graph, graph.nodes, {"n_tokens": 1}, set(), False, qdot)
        ir = "".join(unit.build_ir() for unit in builder.units())
        pattern = r'call void @"llvm\.prefetch\.p0"\(ptr %[^,]+, i32 0, i32 ' + str(locality) + r', i32 1\)'
        return len(re.findall(pattern, ir))

    flavours = ("vnni512", "vnni256", "avx2", "generic")
    for t in (G.Q4_1, G.Q8_0):
        sites = {qdot: prefetch_sites(t, qdot, 3) for qdot in flavours}
        assert sites["vnni512"] > 0 and sites["vnni512"] == sites["vnni256"], (t.name, sites)
        per_loop = sites["vnni512"] // 2                      # the tiles of 4 and 2 tokens
        assert sites["avx2"] == sites["generic"] == 3 * per_loop, (t.name, sites)
        # the streaming prefetch further ahead: Q8_0 on AVX2 only (measured there)
        far = {qdot: prefetch_sites(t, qdot, 0) for qdot in flavours}
        assert far == {**dict.fromkeys(flavours, 0), "avx2": 3 * per_loop if t == G.Q8_0 else 0}, (t.name, far)


@pytest.mark.parametrize("t", TYPES + SIGN_BITS + KTYPES, ids=lambda t: t.name)
def test_every_dot_flavour_gives_the_same_bits(t):
    """The dot flavours the host can run (vpdpbusd; AVX2's vpmaddubsw with i16 partial sums,
    Q8_0's sign trick; plain IR) differ only in how exact integer sums are formed, so
    decode, batched and prefill results on repacked weights agree bit for bit."""
    from ggmlpy.options import Options

    from .test_cpu_quant_kernels import _flavours

    from ggmlpy.testing.ops import encode

    k = 512 if t in KTYPES + SIGN_BITS else 576
    for n, extreme in ((1, False), (5, False), (48, False), (1, True), (5, True)):
        case = _weight_case(t, k, 32, n)
        inputs = make_inputs(case, np.random.default_rng(n))
        if extreme:  # every weight and activation at its largest code: a saturating i16 sum shows
            inputs = {"src0": encode(np.ones((1, 1, 32, k), np.float32), t, np.random.default_rng(0)),
                      "src1": np.ones_like(inputs["src1"])}
        results = {f: run_case("mul_mat", case, CpuBackend(n_threads=2, options=Options(cpu_qdot=f)),
                               inputs=inputs)[0] for f in _flavours()}
        first = next(iter(results.values()))
        for f, r in results.items():
            np.testing.assert_array_equal(r, first, err_msg=f"flavour {f}, {n} tokens")


NATIVE_CASES = [(t, k) for t in TYPES for k in (32, 96, 640, 2048)] + \
    [(t, k) for t in KTYPES for k in (256, 2048)]


@pytest.mark.parametrize("t,k", NATIVE_CASES, ids=lambda c: getattr(c, "name", str(c)))
def test_native_repack_equals_numpy(t, k):
    """repack_native's table loop (repack_bits' for the K-quants) writes the same bytes as
    the numpy definition of the layout, for whole and odd numbers of blocks (the padded
    last step) and several groups."""
    from ggmlpy.codegen_cpu import repack_bits, repack_native

    per = 256 if t in KTYPES else 32
    m = 3 * repack.GROUP
    raw = np.random.default_rng(k).integers(0, 256, m * (k // per) * type_size(t), dtype=np.uint8)
    table = repack.native_table(t, k)
    assert (table is None) == (t in KTYPES)
    assert (repack.kquant_table(t, k) is None) == (t not in BIT_MOVED)
    want = repack.repack(raw, t, k, m, native=False)
    np.testing.assert_array_equal(repack.repack(raw, t, k, m), want)
    if t in BIT_MOVED:
        bits = repack.kquant_table(t, k)
        with pytest.raises(ValueError, match="whole groups"):
            repack_bits.apply(bits, raw[:-1], np.empty(3 * bits.out_bytes, np.uint8))
        # the numpy model of the native loop gives the same bytes for one group
        np.testing.assert_array_equal(repack_bits.emulate(bits, raw[:bits.in_bytes]), want[:bits.out_bytes])
    if table is not None:
        assert table.unit == 4   # whole words: the quants' lanes; the scales are numpy's
        with pytest.raises(ValueError, match="whole groups"):
            repack_native.apply(table, raw[:-1], np.empty(3 * table.out_bytes, np.uint8))
        # the half-word table (the fallback) moves the scales too, and gives the same bytes
        row_bytes = k // 32 * type_size(t)
        halves = repack_native.derive_table(
            lambda rows: repack._repack_groups(rows.reshape(repack.GROUP, row_bytes), t, k).reshape(-1),
            repack.GROUP * row_bytes, repack.STEP_BYTES[t], [(lo, hi) for lo, hi, _ in repack._computed(t, 2)], 2)
        assert halves is not None and halves.unit == 2 and halves.offset.size == 2 * table.offset.size
        out = np.empty_like(want)
        repack_native.apply(halves, raw, out)
        steps, expected = out.reshape(3, -1, repack.STEP_BYTES[t]), want.reshape(3, -1, repack.STEP_BYTES[t])
        for lo, hi, _ in repack._computed(t, 2):   # Q5_0's and Q5_1's planes are numpy's either way
            steps[:, :, lo:hi] = expected[:, :, lo:hi]
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("t", KTYPES, ids=lambda t: t.name)
def test_kquant_native_repack_on_extreme_bytes(t):
    """All-zero and all-one rows and single set bits: every output bit is the one the table
    names (a bit copied to the wrong place, or a constant taken for a copy, shows here)."""
    k, m = 512, 2 * repack.GROUP
    n = m * (k // 256) * type_size(t)
    for raw in (np.zeros(n, np.uint8), np.full(n, 255, np.uint8),
                np.packbits(np.arange(8 * n) % 97 == 5, bitorder="little")):
        np.testing.assert_array_equal(repack.repack(raw, t, k, m), repack.repack(raw, t, k, m, native=False))


@pytest.mark.parametrize("t", BIT_MOVED, ids=lambda t: t.name)
def test_kquant_step_table_widens_like_its_bits(t):
    """A step's table widened to K term by term is the table of the widened bit sources
    (the fallback where a term spans two blocks): the same bytes on any rows."""
    from ggmlpy.codegen_cpu import repack_bits

    k, bb = 768, type_size(t)
    sources, constant = repack_bits.bit_sources(
        lambda rows: repack._repack_groups(rows.reshape(repack.GROUP, bb), t, 256).reshape(-1), repack.GROUP * bb)
    step = repack_bits.make_table(sources, constant, repack.GROUP * bb)
    widened = repack_bits.widen(step, k // 256, repack.GROUP)
    assert widened is not None
    from_bits = repack_bits.make_table(repack.widen_sources(sources, k // 256, bb), np.tile(constant, k // 256),
                                       repack.GROUP * bb * k // 256)
    raw = np.random.default_rng(2).integers(0, 256, widened.in_bytes, dtype=np.uint8)
    want = repack.repack(raw, t, k, repack.GROUP, native=False)
    np.testing.assert_array_equal(repack_bits.emulate(widened, raw), want)
    np.testing.assert_array_equal(repack_bits.emulate(from_bits, raw), want)


def test_bit_table_refuses_a_layout_that_is_not_bit_moves():
    """A layout that adds bytes (not a copy of input bits) gets no table: numpy keeps it."""
    from ggmlpy.codegen_cpu import repack_bits

    def layout(rows: np.ndarray) -> np.ndarray:
        return (rows.astype(np.uint16) + rows[::-1]).astype(np.uint8)

    sources, constant = repack_bits.bit_sources(layout, 64)
    table = repack_bits.make_table(sources, constant, 64)
    assert table is None or not repack_bits.reproduces(table, layout)


def test_q5_high_bit_planes_match_their_definition():
    """Q5_0's plane bytes by table lookups equal the definition bit by bit: byte i, bit c is
    bit 4c + i of qh and bit 4 + c is bit 16 + 4c + i (c = 0..3)."""
    qh = np.random.default_rng(8).integers(0, 2 ** 32, (5, 3, 2), dtype=np.uint64).astype(np.uint32)
    qh[0, 0] = [0, 0xFFFFFFFF]
    got = repack._qh_planes(qh)
    bits = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    for i in range(4):
        want = sum((bits[..., 4 * c + i] << c) | (bits[..., 16 + 4 * c + i] << (4 + c)) for c in range(4))
        np.testing.assert_array_equal(got[..., i], want.astype(np.uint8))
