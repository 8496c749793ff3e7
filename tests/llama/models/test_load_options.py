"""Model.load's llama.cpp load options: use_mmap, use_mlock, kv_overrides, check_tensors.

Each option is checked against what it must be equivalent to: reading instead of mapping
gives the same logits, an override gives the hparams of a file written with that value, a
check names the tensor and the element or block a NaN/Inf was planted in.
"""
from __future__ import annotations

import errno
import logging
from pathlib import Path

import numpy as np
import pytest

import llama
from ggmlpy.gguf import GGUFError, GGUFFile, GGUFWriter
from ggmlpy.gguf import memlock
from ggmlpy.gguf.file_map import FileMap
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants.validate import TensorDataError, first_invalid
from ggmlpy.testing.models import write_tiny_llama

PROMPT = [3, 14, 15, 92, 65, 35, 89, 79]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("load_options") / "tiny.gguf")


def logits(model: llama.Model) -> np.ndarray:
    ctx = llama.Context(model, n_ctx=256, n_batch=64, n_ubatch=64, backend="ref")
    assert ctx.decode(llama.Batch.from_tokens(PROMPT, logits_all=True)) == 0
    return ctx.get_logits().copy()


def with_keys(src: Path, dst: Path, **keys) -> Path:
    """A copy of src with metadata keys added or replaced (values typed by the writer)."""
    with GGUFFile(src) as f:
        w = GGUFWriter()
        for key, fl in f.fields.items():
            if key not in keys:
                w.add_key_value(key, fl.value, fl.type, fl.element_type)
        for key, (value, vtype) in keys.items():
            w.add_key_value(key, value, vtype)
        for t in f.tensors.values():
            w.add_tensor(t.name, np.array(t.data), type=t.type, ne=t.ne)
        return w.write(dst)


# use_mmap -------------------------------------------------------------------------------------
def test_read_instead_of_map_gives_identical_logits(tiny):
    mapped = llama.Model.load(tiny)
    read = llama.Model.load(tiny, use_mmap=False)
    assert mapped.gguf.mapped and not read.gguf.mapped
    info = read.gguf.tensors["blk.1.attn_q.weight"]
    assert not info.data.flags.writeable  # read-only, as a map is
    np.testing.assert_array_equal(info.data, mapped.gguf.tensors["blk.1.attn_q.weight"].data)
    np.testing.assert_array_equal(logits(read), logits(mapped))


def test_read_mode_covers_split_models_and_stays_strict(tiny, tmp_path):
    with GGUFFile(tiny) as f:
        parts = GGUFWriter.from_file(f).write_split(tmp_path / "split", 3)
    split = llama.Model.load(parts[0], use_mmap=False)
    assert len(split.gguf.paths) == 3 and not split.gguf.mapped
    np.testing.assert_array_equal(logits(split), logits(llama.Model.load(tiny)))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[: tiny.stat().st_size // 2])
    with pytest.raises(GGUFError, match="lies outside the file"):
        GGUFFile(cut, use_mmap=False)


def test_failed_map_falls_back_to_reading(tiny, monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(FileMap, "of", classmethod(refuse))
    with caplog.at_level(logging.WARNING, logger="ggmlpy.gguf"):
        model = llama.Model.load(tiny)
    assert not model.gguf.mapped
    assert "mmap failed" in caplog.text and "reading the file into memory" in caplog.text
    assert model.hparams.n_layer == 2 and len(model.gguf.tensors) == 21


# use_mlock ------------------------------------------------------------------------------------
def _vm_locked_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmLck:"):
            return int(line.split()[1])
    raise AssertionError("no VmLck in /proc/self/status")


def _can_lock(nbytes: int) -> bool:
    """Whether the kernel will let this process lock nbytes more: CAP_IPC_LOCK lifts the
    limit, otherwise RLIMIT_MEMLOCK's soft limit counts."""
    import resource

    cap_eff = next(int(line.split()[1], 16) for line in Path("/proc/self/status").read_text().splitlines()
                   if line.startswith("CapEff:"))
    if cap_eff >> 14 & 1:  # CAP_IPC_LOCK
        return True
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return soft == resource.RLIM_INFINITY or _vm_locked_kib() * 1024 + nbytes <= soft


@pytest.mark.parametrize("use_mmap", [True, False])
def test_mlock_locks_the_model_or_warns(tiny, use_mmap, caplog):
    size = tiny.stat().st_size
    expect_locked = _can_lock(size)
    before = _vm_locked_kib()
    with caplog.at_level(logging.WARNING, logger="ggmlpy.gguf"):
        model = llama.Model.load(tiny, use_mmap=use_mmap, use_mlock=True)
    if expect_locked:
        assert model.gguf.locked_bytes == size
        assert _vm_locked_kib() - before >= size // 1024  # the kernel counts the pages as locked
        assert "failed to mlock" not in caplog.text
    else:
        assert model.gguf.locked_bytes == 0
        assert f"failed to mlock {size}-byte buffer" in caplog.text
    model.close()
    assert _vm_locked_kib() == before  # close unlocks
    assert model.gguf.locked_bytes == 0


def test_mlock_refusal_is_a_warning_not_an_error(tiny, monkeypatch, caplog):
    monkeypatch.setattr(memlock, "_mlock", lambda addr, size: errno.ENOMEM)
    with caplog.at_level(logging.WARNING, logger="ggmlpy.gguf"):
        model = llama.Model.load(tiny, use_mlock=True)
    assert model.gguf.locked_bytes == 0
    assert f"failed to mlock {tiny.stat().st_size}-byte buffer (after previously locking 0 bytes)" \
        in caplog.text
    assert "Cannot allocate memory" in caplog.text
    assert logits(model).shape == (len(PROMPT), 320)  # and the model runs


# kv_overrides ---------------------------------------------------------------------------------
def test_rope_base_override_is_the_file_with_that_value(tiny, tmp_path):
    written = llama.Model.load(write_tiny_llama(tmp_path / "base.gguf", rope_base=25000.0))
    overridden = llama.Model.load(tiny, kv_overrides={"llama.rope.freq_base": 25000.0})
    assert overridden.hparams.rope_freq_base == 25000.0
    assert overridden.hparams == written.hparams
    assert overridden.gguf.metadata["llama.rope.freq_base"] == 25000.0
    plain = logits(llama.Model.load(tiny))
    got = logits(overridden)
    np.testing.assert_array_equal(got, logits(written))
    assert np.abs(got - plain).max() > 1e-2  # and the base matters for these logits


def test_context_length_override_sets_n_ctx_train(tiny, tmp_path):
    written = llama.Model.load(write_tiny_llama(tmp_path / "ctx.gguf", n_ctx_train=1024))
    overridden = llama.Model.load(tiny, kv_overrides={"llama.context_length": 1024})
    assert overridden.hparams == written.hparams and overridden.hparams.n_ctx_train == 1024
    ctx = llama.Context(overridden, n_ctx=0, backend="ref")  # 0: the training context
    assert ctx.n_ctx == 1024


def test_override_adds_missing_keys(tiny, tmp_path):
    """Keys the file lacks are added: linear RoPE scaling by 4 gives freq_scale 1/4 exactly as
    a file holding the two keys does."""
    from ggmlpy.gguf import GGUFValueType as V

    keys = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    written = llama.Model.load(with_keys(tiny, tmp_path / "scaled.gguf",
                                         **{k: (v, V.STRING if isinstance(v, str) else V.FLOAT32)
                                            for k, v in keys.items()}))
    overridden = llama.Model.load(tiny, kv_overrides=keys)
    assert "llama.rope.scaling.type" not in llama.Model.load(tiny).gguf.metadata
    assert overridden.hparams.rope_freq_scale == 0.25
    assert overridden.hparams == written.hparams
    assert overridden.gguf.fields["llama.rope.scaling.factor"].type == V.FLOAT64


def test_bool_override_reaches_the_vocab(tiny):
    plain = llama.Model.load(tiny)
    with_bos = llama.Model.load(tiny, kv_overrides={"tokenizer.ggml.add_bos_token": True})
    assert plain.tokenize("ab") == with_bos.tokenize("ab")[1:]
    assert with_bos.tokenize("ab")[0] == 0  # the tiny vocab's BOS id


@pytest.mark.parametrize("overrides, message", [
    ({"llama.context_length": 1024.0}, r"'llama.context_length'.*float.*UINT32.*an int"),
    ({"llama.rope.freq_base": 25000}, r"'llama.rope.freq_base'.*an int.*FLOAT32.*a float"),
    ({"tokenizer.ggml.add_bos_token": 1}, r"'tokenizer.ggml.add_bos_token'.*an int.*BOOL.*a bool"),
    ({"general.name": 3}, r"'general.name'.*an int.*STRING.*a str"),
    ({"llama.block_count": True}, r"'llama.block_count'.*a bool.*UINT32"),
    ({"tokenizer.ggml.tokens": "x"}, r"'tokenizer.ggml.tokens'.*ARRAY of STRING.*cannot be overridden"),
    ({"llama.context_length": -1}, r"'llama.context_length'.*-1 does not fit.*UINT32"),
    ({"llama.rope.freq_base": 1e39}, r"'llama.rope.freq_base'.*overflows.*FLOAT32"),
    ({"llama.new_key": [1, 2]}, r"'llama.new_key'.*list is not an override type"),
])
def test_bad_overrides_raise_naming_key_and_types(tiny, overrides, message):
    with pytest.raises(ValueError, match=message):
        llama.Model.load(tiny, kv_overrides=overrides)


# check_tensors --------------------------------------------------------------------------------
def poke(path: Path, tensor: str, byte_offset: int, raw: bytes) -> None:
    """Overwrite bytes of one tensor's data in place."""
    with GGUFFile(path) as f:
        at = f.tensors[tensor].offset + byte_offset
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(raw)


def test_nan_in_f32_tensor_is_named(tmp_path):
    path = write_tiny_llama(tmp_path / "nan.gguf")
    assert llama.Model.load(path, check_tensors=True).hparams.n_layer == 2  # clean: passes
    poke(path, "blk.1.attn_k.weight", 4 * 37, np.float32(np.nan).tobytes())
    llama.Model.load(path)  # unchecked: loads
    with pytest.raises(TensorDataError, match=r"'blk.1.attn_k.weight' \(F32\).*element 37 is nan"):
        llama.Model.load(path, check_tensors=True)


def test_inf_in_f16_tensor_is_named(tmp_path):
    path = write_tiny_llama(tmp_path / "inf.gguf", weight_type=GGMLType.F16)
    assert llama.Model.load(path, check_tensors=True).hparams.n_layer == 2
    poke(path, "blk.0.ffn_up.weight", 2 * 1000, np.float16(-np.inf).tobytes())
    with pytest.raises(TensorDataError, match=r"'blk.0.ffn_up.weight' \(F16\).*element 1000 is -inf"):
        llama.Model.load(path, check_tensors=True)


def test_bad_q8_0_scale_is_named(tmp_path):
    path = write_tiny_llama(tmp_path / "q8.gguf", weight_type=GGMLType.Q8_0)
    assert llama.Model.load(path, check_tensors=True).hparams.n_layer == 2
    poke(path, "blk.0.attn_v.weight", 34 * 5, np.float16(np.inf).tobytes())  # d of block 5
    with pytest.raises(TensorDataError, match=r"'blk.0.attn_v.weight' \(Q8_0\).*block 5 "
                                              r"\(elements 160..191\).*scale d = inf"):
        llama.Model.load(path, check_tensors=True)


def test_bad_q4_k_dmin_is_named(tmp_path):
    path = write_tiny_llama(tmp_path / "q4k.gguf", weight_type=GGMLType.Q4_K, n_embd=256, n_ff=256,
                            n_head=4, n_head_kv=4)
    assert llama.Model.load(path, check_tensors=True).hparams.n_layer == 2
    poke(path, "blk.1.ffn_down.weight", 144 * 3 + 2, np.float16(np.nan).tobytes())  # dmin of block 3
    with pytest.raises(TensorDataError, match=r"'blk.1.ffn_down.weight' \(Q4_K\).*block 3 .*dmin = nan"):
        llama.Model.load(path, check_tensors=True)


def test_first_bad_spot_across_chunks_and_fields():
    """The earliest bad element wins, also past the first chunk, and across d/dmin fields."""
    x = np.zeros(3_000_000, np.float32)
    x[2_900_001] = np.inf
    x[2_950_000] = np.nan
    bad = first_invalid(x.view(np.uint8), GGMLType.F32)
    assert (bad.index, bad.value) == (2_900_001, np.inf)
    bf16 = np.full(10, 0x3F80, np.uint16)  # 1.0
    bf16[7] = 0xFFC0  # a NaN
    assert first_invalid(bf16.view(np.uint8), GGMLType.BF16).index == 7
    blocks = np.zeros(9 * 144, np.uint8)
    blocks.view(np.uint16)[72 * 6 + 1] = 0x7C00  # dmin of block 6 is +inf
    blocks.view(np.uint16)[72 * 8] = 0x7E00  # d of block 8 is NaN
    bad = first_invalid(blocks, GGMLType.Q4_K)
    assert (bad.index, bad.field, bad.value) == (6, "dmin", np.inf)
    assert first_invalid(np.arange(100, dtype=np.int32).view(np.uint8), GGMLType.I32) is None


def test_progress_moves_per_tensor_checked(tiny):
    seen: list[float] = []
    llama.Model.load(tiny, check_tensors=True, progress=seen.append)
    assert seen == [i / 21 for i in range(22)]
