"""What cannot run is refused when the model or the context is made, never at the first
decode; what runs on a slower backend is told once; a failed decode leaves no stale logits."""
from __future__ import annotations

import logging
import struct

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

import llama
import llama.model
import llama.weights
from ggmlpy.gguf import GGUFError, GGUFFile, GGUFWriter
from ggmlpy.ir.types import GGMLType, block_size, type_size
from ggmlpy.quants import dequantizable_types
from ggmlpy.sched import ref_backend
from ggmlpy.sched.scheduler import SchedulerError
from ggmlpy.testing.models import write_tiny_llama
from ggmlpy.testing.ops import normalized_error, random_blocks
from llama.api.engine import DecodeError
from llama.arch import UnsupportedModel
from llama.batch import Batch
from llama.weights import UnsupportedTensorType

RETYPED = "blk.0.attn_q.weight"


def write_with_raw_type(src, dst, name: str, t: GGMLType, blocks: bool = False):
    """Copy a float32 GGUF with tensor `name` replaced by random bytes of type `t` (blocks of
    the right size, as llama-quantize writes them), or with `blocks`, random blocks whose
    scales are small finite numbers (so the model computes finite logits)."""
    with GGUFFile(src) as f:
        w = GGUFWriter()
        for key, field in f.fields.items():
            w.add_key_value(key, field.value, field.type, field.element_type)
        for tname, info in f.tensors.items():
            if tname == name:
                rng = np.random.default_rng(0)
                n_bytes = int(np.prod(info.ne)) // block_size(t) * type_size(t)
                raw = random_blocks(t, tuple(reversed(info.ne)), rng) if blocks else \
                    rng.integers(0, 256, n_bytes, dtype=np.uint8)
                w.add_tensor(tname, raw.reshape(-1).view(np.uint8), type=t, ne=tuple(info.ne))
            else:
                w.add_tensor(tname, np.array(info.data).view(np.float32).reshape(tuple(reversed(info.ne))))
    return w.write(dst)


def without(monkeypatch, t: GGMLType) -> None:
    """As if the quants package could not decode `t` (it decodes every type ggml has now):
    the load check and the reference backend both take the decodable types from it."""
    readable = tuple(x for x in dequantizable_types() if x != t)
    monkeypatch.setattr(llama.weights, "dequantizable_types", lambda: readable)
    monkeypatch.setattr(ref_backend, "_READABLE", frozenset(readable))


@pytest.fixture(scope="module")
def iq4_nl_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("unsupported")
    return write_with_raw_type(write_tiny_llama(d / "f32.gguf"), d / "iq4_nl.gguf", RETYPED, GGMLType.IQ4_NL)


@pytest.fixture(scope="module")
def q8_k_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("unsupported")
    src = write_tiny_llama(d / "f32.gguf", n_embd=256, n_ff=512)   # rows of whole 256-blocks
    return write_with_raw_type(src, d / "q8_k.gguf", RETYPED, GGMLType.Q8_K)


def test_block_sizes_agree_with_the_gguf_package():
    assert (block_size(GGMLType.IQ4_NL), type_size(GGMLType.IQ4_NL)) == \
        GGML_QUANT_SIZES[GGMLQuantizationType.IQ4_NL]


def test_every_type_ggml_has_is_computed():
    assert set(dequantizable_types()) == set(GGMLType)


def test_model_load_refuses_a_type_it_cannot_compute(iq4_nl_path, monkeypatch):
    without(monkeypatch, GGMLType.IQ4_NL)
    with pytest.raises(UnsupportedTensorType) as err:
        llama.Model.load(iq4_nl_path)
    msg = str(err.value)
    assert f"tensor {RETYPED!r} has type IQ4_NL" in msg
    # the supported types come from the quants package's decoders
    supported = msg.split("supported types: ")[1].rstrip(")").split(", ")
    assert supported == [t.name for t in llama.weights.dequantizable_types()]
    assert "Q5_1" in supported and "IQ4_NL" not in supported
    assert isinstance(err.value, UnsupportedModel) and isinstance(err.value, ValueError)
    assert llama.Model.load(iq4_nl_path, vocab_only=True).w is None  # no weights, nothing to compute


def test_llama_class_refuses_it_too(iq4_nl_path, monkeypatch):
    without(monkeypatch, GGMLType.IQ4_NL)
    with pytest.raises(UnsupportedTensorType, match=rf"{RETYPED}.*IQ4_NL"):
        llama.Llama(str(iq4_nl_path), n_ctx=256, verbose=False)


def test_a_removed_type_is_refused_by_name(iq4_nl_path, tmp_path):
    """Types ggml removed (the interleaved IQ4_NL_4_4 here) are refused by the file reader."""
    raw = bytearray(iq4_nl_path.read_bytes())
    name = RETYPED.encode()
    at = raw.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    n_dims = struct.unpack_from("<I", raw, at)[0]
    struct.pack_into("<I", raw, at + 4 + 8 * n_dims, 36)
    path = tmp_path / "removed.gguf"
    path.write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match=rf"tensor {RETYPED} has IQ4_NL_4_4 \(removed from ggml\)"):
        llama.Model.load(path)


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_context_refuses_a_node_no_backend_runs(q8_k_path, monkeypatch, backend):
    """Past the load check (skipped here), the context's scheduler asks every backend,
    the reference one included, and names the node it cannot place (Q8_K: no CPU kernel
    reads it, and the reference backend is told it cannot decode it)."""
    without(monkeypatch, GGMLType.Q8_K)
    monkeypatch.setattr(llama.model, "check_tensor_types", lambda tensors: None)
    model = llama.Model.load(q8_k_path)
    tried = "cpu, ref" if backend == "cpu" else "ref"
    with pytest.raises(SchedulerError, match=rf"Qcur-0 \(mul_mat F32 .*tried {tried}; its inputs: "
                                             rf"{RETYPED} Q8_K"):
        llama.Context(model, n_ctx=256, backend=backend)


@pytest.mark.parametrize("wtype", [GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.NVFP4], ids=lambda t: t.name)
def test_models_quantized_to_new_types_run(tmp_path, wtype):
    """Weights quantised by the quants package decode on the reference backend and stay near
    the float32 model's logits (NMSE 0.02-0.03 for these 4-bit formats)."""
    kw = dict(n_embd=256, n_ff=512)
    f32 = llama.Context(llama.Model.load(write_tiny_llama(tmp_path / "f32.gguf", **kw)), n_ctx=256, backend="ref")
    ctx = llama.Context(llama.Model.load(write_tiny_llama(tmp_path / "q.gguf", weight_type=wtype, **kw)),
                        n_ctx=256, backend="ref")
    for c in (f32, ctx):
        assert c.decode(Batch.from_tokens([1, 2, 3, 4, 5])) == 0
    assert normalized_error(ctx.get_logits(), f32.get_logits()) < 0.06


@pytest.mark.parametrize("wtype", [GGMLType.IQ1_M, GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ1_S,
                                   GGMLType.IQ3_S, GGMLType.TQ1_0, GGMLType.Q1_0], ids=lambda t: t.name)
def test_files_with_other_new_types_load_and_decode(tmp_path, wtype):
    """Types ggmlpy decodes but (without an importance matrix) does not quantise, and slow
    ones: random blocks as a quantised file would hold them."""
    path = write_with_raw_type(write_tiny_llama(tmp_path / "f32.gguf", n_embd=256, n_ff=512),
                               tmp_path / "q.gguf", RETYPED, wtype, blocks=True)
    ctx = llama.Context(llama.Model.load(path), n_ctx=256, backend="ref")
    assert ctx.decode(Batch.from_tokens([1, 2, 3])) == 0
    assert np.isfinite(ctx.get_logits()).all()


@pytest.mark.parametrize("wtype", [GGMLType.Q8_1, GGMLType.Q8_K])   # weights no CPU kernel reads
def test_fallback_to_the_reference_backend_is_told_once(tmp_path, caplog, wtype):
    path = write_tiny_llama(tmp_path / f"{wtype.name}.gguf", weight_type=wtype, n_embd=256, n_ff=512)
    model = llama.Model.load(path)
    prompt = [1, 2, 3, 4, 5]
    with caplog.at_level(logging.DEBUG, logger="ggmlpy.sched"):
        ctx = llama.Context(model, n_ctx=256, backend="cpu")
        assert ctx.decode(Batch.from_tokens(prompt)) == 0
        assert ctx.decode(Batch.from_tokens([6])) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # 7 matmuls per layer and the output, in the prompt graph and the one-token graph
    n = 2 * (7 * 2 + 1)
    assert warnings == [f"{n} nodes in 2 graphs fall back to a slower backend; "
                        f"ref runs what cpu cannot: mul_mat({wtype.name}, F32) x{n}"]
    ref = llama.Context(model, n_ctx=256, backend="ref")
    assert ref.decode(Batch.from_tokens(prompt)) == 0 and ref.decode(Batch.from_tokens([6])) == 0
    np.testing.assert_allclose(ctx.get_logits(), ref.get_logits(), atol=2e-3, rtol=0)


@pytest.mark.parametrize("wtype", [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q5_1])
def test_low_bit_weights_run_on_the_cpu(tmp_path, caplog, wtype):
    """Q2_K, Q3_K and Q5_1 products have CPU kernels: no node falls back, and the logits
    agree with the reference backend's as closely as other types' do (the CPU's 8-bit
    activations, as ggml's, against exact f32: NMSE 1-3e-4 here for Q4_0 to Q6_K alike)."""
    path = write_tiny_llama(tmp_path / f"{wtype.name}.gguf", weight_type=wtype, n_embd=256, n_ff=512)
    model = llama.Model.load(path)
    prompt = [1, 2, 3, 4, 5]
    with caplog.at_level(logging.DEBUG, logger="ggmlpy.sched"):
        ctx = llama.Context(model, n_ctx=256, backend="cpu")
        assert ctx.decode(Batch.from_tokens(prompt)) == 0
        assert ctx.decode(Batch.from_tokens([6])) == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    ref = llama.Context(model, n_ctx=256, backend="ref")
    assert ref.decode(Batch.from_tokens(prompt)) == 0 and ref.decode(Batch.from_tokens([6])) == 0
    assert normalized_error(ctx.get_logits(), ref.get_logits()) < 1e-3


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return llama.Model.load(write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf"))


def test_a_refused_batch_leaves_no_logits(tiny_model):
    ctx = llama.Context(tiny_model, n_ctx=256, backend="ref")
    assert ctx.decode(Batch.from_tokens([1, 2, 3])) == 0
    assert ctx.get_logits().shape == (1, tiny_model.n_vocab)
    assert ctx.decode(Batch.from_tokens([tiny_model.n_vocab + 5])) == -1  # a token outside the vocab
    assert ctx.get_logits().shape == (0, tiny_model.n_vocab)
    with pytest.raises(IndexError):
        ctx.get_logits_ith(-1)


def test_no_kv_slot_leaves_no_logits(tiny_model):
    ctx = llama.Context(tiny_model, n_ctx=256, n_batch=256, n_ubatch=256, backend="ref")
    assert ctx.decode(Batch.from_tokens(list(range(1, 251)))) == 0
    assert ctx.decode(Batch.from_tokens(list(range(1, 11)))) == 1  # 260 tokens > 256 cells
    with pytest.raises(IndexError):
        ctx.get_logits_ith(-1)


def test_a_failed_compute_leaves_no_stale_logits(tiny_model, monkeypatch):
    ctx = llama.Context(tiny_model, n_ctx=256, backend="ref")
    assert ctx.decode(Batch.from_tokens([1, 2, 3])) == 0
    assert np.any(ctx.get_logits_ith(-1) != 0)

    def failing(ub, slot):
        raise NotImplementedError("dequantization of IQ4_NL is not implemented")

    monkeypatch.setattr(ctx, "_process_ubatch", failing)
    assert ctx.decode(Batch.from_tokens([4, 5])) < -1
    assert not np.any(ctx.get_logits())  # zeros for the rows never computed, not step one's
    assert ctx.memory.seq_pos_max(0) == 2  # and the cache is as it was


def test_llama_scores_are_cleared_by_a_failed_eval(tiny_model, monkeypatch):
    llm = llama.Llama(str(tiny_model.path), n_ctx=256, backend="ref", verbose=False)
    llm.eval([1, 2, 3])
    assert llm.scores is not None
    monkeypatch.setattr(llm.engine.ctx, "_process_ubatch", lambda ub, slot: 1 / 0)
    with pytest.raises(DecodeError):
        llm.eval([4])
    assert llm.scores is None
