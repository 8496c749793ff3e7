"""Bad models and bad arguments give one clear error, never a deep traceback; a half-built
model is never returned."""
from __future__ import annotations

import numpy as np
import pytest

import llama
from ggmlpy.gguf import GGUFError, GGUFFile, GGUFWriter
from ggmlpy.hub import models_dir, resolve_model
from ggmlpy.testing.models import write_tiny_llama
from llama.arch import UnknownArchitecture
from llama.weights import TensorLoadError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("errors") / "tiny.gguf")


def rewrite(src, dst, *, drop_tensor=None, arch=None, reshape=None):
    """Copy a GGUF, changing one thing."""
    with GGUFFile(src) as f:
        w = GGUFWriter()
        for key, field in f.fields.items():
            value = arch if key == "general.architecture" and arch else field.value
            if arch and key.startswith("llama."):
                key = arch + key[len("llama"):]
            w.add_key_value(key, value, field.type, field.element_type)
        for name, info in f.tensors.items():
            if name == drop_tensor:
                continue
            data = np.array(info.data).view(np.float32)
            if name == reshape:
                data = data[: len(data) // 2]
                w.add_tensor(name, data.reshape(-1, info.ne[0] // 2) if len(info.ne) > 1 else data)
            else:
                w.add_tensor(name, data.reshape(tuple(reversed(info.ne))))
    return w.write(dst)


def test_unknown_architecture_is_named(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "x.gguf", arch="mamba9")
    with pytest.raises(UnknownArchitecture, match="mamba9"):
        llama.Model.load(path)


def test_missing_tensor_is_named(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "x.gguf", drop_tensor="blk.1.ffn_up.weight")
    with pytest.raises(TensorLoadError, match="blk.1.ffn_up.weight"):
        llama.Model.load(path)


def test_misshapen_tensor_is_named(tiny, tmp_path):
    path = rewrite(tiny, tmp_path / "x.gguf", reshape="blk.0.attn_q.weight")
    with pytest.raises(TensorLoadError, match=r"blk.0.attn_q.weight.*expected \[64, 64\]"):
        llama.Model.load(path)


def test_malformed_file_is_a_gguf_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    with pytest.raises(GGUFError):
        llama.Model.load(bad)


def test_unknown_model_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a known model name"):
        resolve_model(str(tmp_path / "nope.gguf"))


def test_xdg_cache_home_is_honoured(monkeypatch, tmp_path):
    monkeypatch.delenv("GGMLPY_MODELS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert models_dir() == tmp_path / "ggmlpy" / "models"
    monkeypatch.setenv("GGMLPY_MODELS", str(tmp_path / "m"))
    assert models_dir() == tmp_path / "m"


def test_progress_callback_can_cancel(tiny):
    seen = []

    def progress(p):
        seen.append(p)
        return p < 0.5

    with pytest.raises(llama.LoadCancelled):
        llama.Model.load(tiny, progress=progress)
    assert seen[0] == 0.0 and max(seen) >= 0.5


def test_vocab_only_model_cannot_make_a_context(tiny):
    model = llama.Model.load(tiny, vocab_only=True)
    assert model.tokenize("the") and model.w is None
    with pytest.raises(ValueError, match="vocab_only"):
        llama.Context(model)


def test_prompt_longer_than_context(tiny):
    from llama.generate import generate

    model = llama.Model.load(tiny)
    ctx = llama.Context(model, n_ctx=256, backend="ref")
    with pytest.raises(ValueError, match="context holds 256"):
        generate(ctx, list(range(1, 300)), max_tokens=1)
