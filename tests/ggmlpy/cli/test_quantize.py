"""`ggmlpy quantize` as a command: llama-quantize's argument forms, its refusals with the
reason, and the output written atomically (a failure leaves OUT as it was and no temporary
file). Byte identity with llama-quantize is tests/llama/quantize/test_llama_cpp_identity.py."""
from __future__ import annotations

import os

import numpy as np
import pytest

from ggmlpy.cli import main
from ggmlpy.gguf import GGUFFile
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import quantize
from ggmlpy.testing.models_archs import write_tiny_model
from llama.quantize import driver


@pytest.fixture
def f16(tmp_path):
    return write_tiny_model("llama", tmp_path / "tiny-f16.gguf", n_embd=256, n_ff=256, weight_type=GGMLType.F16)


def leftovers(folder) -> list[str]:
    return [p for p in os.listdir(folder) if p.endswith(".tmp")]


def test_help_lists_the_mixes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["quantize", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for line in ("  15  or  Q4_K_M  :  4.58G, +0.1754 ppl @ Llama-3-8B", "  38  or  MXFP4_MOE :  MXFP4 MoE",
                 "          COPY    : only copy tensors, no quantizing"):
        assert line in out.splitlines()
    assert "--tensor-type PATTERN=TYPE" in out and "--imatrix FILE" in out


def test_default_output_name_and_thread_count(f16, capsys):
    assert main(["quantize", "--no-progress", str(f16), "q8_0", "1"]) == 0
    out = f16.parent / "ggml-model-Q8_0.gguf"
    assert f"wrote {out} (Q8_0)" in capsys.readouterr().out
    with GGUFFile(out) as g:
        assert g.metadata["general.file_type"] == 7 and g.metadata["general.quantization_version"] == 2
        assert list(g.fields)[-2:] == ["general.quantization_version", "general.file_type"]
        assert g.tensors["blk.0.attn_q.weight"].type == GGMLType.Q8_0
        assert g.tensors["blk.0.attn_norm.weight"].type == GGMLType.F32


def test_number_for_the_mix_and_dry_run(f16, tmp_path, capsys):
    assert main(["quantize", "--dry-run", str(f16), str(tmp_path / "out.gguf"), "2"]) == 0
    out = capsys.readouterr().out
    assert "blk.0.attn_q.weight" in out and "q4_0" in out and "quant size" in out
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.parametrize("args,message", [
    (["IN", "OUT", "Q9_9"], "invalid ftype 'Q9_9'"),
    (["IN", "OUT"], "missing ftype after the output path"),
    (["IN", "OUT", "Q4_0", "two"], "invalid nthread 'two'"),
    (["--keep-split", "IN", "OUT", "Q4_0"], "--keep-split is not supported"),
    (["--tensor-type", "attn_q", "IN", "OUT", "Q4_0"], "malformed tensor type 'attn_q'"),
    (["--tensor-type", "attn_q=q9", "IN", "OUT", "Q4_0"], "invalid ggml_type 'q9'"),
    (["--output-tensor-type", "x", "IN", "OUT", "Q4_0"], "--output-tensor-type: invalid ggml_type 'x'"),
    (["--override-kv", "a.b=int:x", "IN", "OUT", "Q4_0"], "is not an int"),
    (["--include-weights", "a", "--exclude-weights", "b", "IN", "OUT", "Q4_0"], "cannot be used together"),
    (["IN", "OUT", "IQ2_XXS"], "requires an importance matrix (--imatrix): tensor blk.0.attn_k.weight"),
    (["IN", "OUT", "Q2_K_S"], "tensor blk.0.attn_k.weight would be q2_K"),
])
def test_refusals_name_the_argument(f16, tmp_path, capsys, args, message):
    paths = {"IN": str(f16), "OUT": str(tmp_path / "out.gguf")}
    assert main(["quantize", *[paths.get(a, a) for a in args]]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.gguf").exists() and not leftovers(tmp_path)


def test_same_input_and_output_refused(f16, capsys):
    assert main(["quantize", str(f16), str(f16), "Q4_0"]) == 1
    assert "input and output files are the same" in capsys.readouterr().err


def test_missing_input_is_named(tmp_path, capsys):
    assert main(["quantize", str(tmp_path / "nope.gguf"), str(tmp_path / "out.gguf"), "Q4_0"]) == 1
    assert "nope.gguf" in capsys.readouterr().err


def test_quantised_input_needs_allow_requantize(tmp_path, capsys):
    q = write_tiny_model("llama", tmp_path / "q8.gguf", weight_type=GGMLType.Q8_0)
    assert main(["quantize", str(q), str(tmp_path / "out.gguf"), "Q4_0"]) == 1
    assert "requantizing from type q8_0 is disabled (pass --allow-requantize)" in capsys.readouterr().err
    assert main(["quantize", "--no-progress", "--allow-requantize", str(q), str(tmp_path / "out.gguf"), "Q4_0"]) == 0


def test_failure_midway_leaves_out_untouched(f16, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out.gguf"
    out.write_bytes(b"the old file")
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("boom in the third unit")
        return original(*args)

    original = driver.encode_job
    monkeypatch.setattr(driver, "encode_job", failing)
    assert main(["quantize", "--no-progress", str(f16), str(out), "Q4_0", "1"]) == 1
    assert "boom in the third unit" in capsys.readouterr().err
    assert out.read_bytes() == b"the old file" and not leftovers(tmp_path)


def test_tensor_type_file(f16, tmp_path):
    spec = tmp_path / "types.txt"
    spec.write_text("attn_q=q8_0\n ffn_down=Q5_1 ")
    out = tmp_path / "out.gguf"
    assert main(["quantize", "--no-progress", "--tensor-type-file", str(spec), str(f16), str(out), "Q4_0"]) == 0
    with GGUFFile(out) as g:
        assert g.tensors["blk.1.attn_q.weight"].type == GGMLType.Q8_0
        assert g.tensors["blk.1.ffn_down.weight"].type == GGMLType.Q5_1
        assert g.tensors["blk.1.ffn_up.weight"].type == GGMLType.Q4_0


def test_importance_matrix_refused_where_a_low_bit_tensor_has_none(f16, tmp_path, capsys):
    """The matrix has no attn_output rows for layers 0-1: IQ2_XXS cannot be written there."""
    from tests.llama.quantize.cases import write_imatrix
    imatrix = write_imatrix(tmp_path)
    assert main(["quantize", "--imatrix", str(imatrix), str(f16), str(tmp_path / "out.gguf"), "IQ2_XXS"]) == 1
    assert "missing importance matrix for tensor blk.0.attn_output.weight" in capsys.readouterr().err
    assert not (tmp_path / "out.gguf").exists()


def test_importance_matrix_weighs_each_tensor_by_its_own_values(f16, tmp_path):
    """Each tensor is encoded with its own entry of the matrix (counts normalised): output.weight
    is quantize(its values, Q6_K, imatrix=its entry), unlike the file written without one."""
    from llama.quantize import load_imatrix
    from tests.llama.quantize.cases import write_imatrix
    imatrix = write_imatrix(tmp_path)
    with_m, without = tmp_path / "with.gguf", tmp_path / "without.gguf"
    assert main(["quantize", "--no-progress", "--imatrix", str(imatrix), str(f16), str(with_m), "Q4_K_M"]) == 0
    assert main(["quantize", "--no-progress", str(f16), str(without), "Q4_K_M"]) == 0
    values = np.asarray(load_imatrix(imatrix, [], []).data["output.weight"], dtype=np.float32)
    with GGUFFile(f16) as src, GGUFFile(with_m) as a, GGUFFile(without) as b:
        x = np.asarray(src.tensors["output.weight"].data).view(np.float16).astype(np.float32).reshape(-1, 256)
        got = np.asarray(a.tensors["output.weight"].data).reshape(-1)
        assert a.tensors["output.weight"].type == GGMLType.Q6_K
        np.testing.assert_array_equal(got, quantize(x, GGMLType.Q6_K, imatrix=values).reshape(-1))
        assert not np.array_equal(got, np.asarray(b.tensors["output.weight"].data).reshape(-1))
