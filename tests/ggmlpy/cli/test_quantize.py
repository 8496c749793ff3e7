"""`ggmlpy quantize` as a command: llama-quantize's argument forms, its refusals with the
reason, the output written atomically (a failure leaves OUT as it was and no temporary
file), and --keep-split / --prune-layers outputs as the gguf package reads them. Byte
identity with llama-quantize is tests/llama/quantize/test_llama_cpp_identity.py."""
from __future__ import annotations

import os

import gguf
import numpy as np
import pytest

from ggmlpy.cli import main
from ggmlpy.gguf import GGUFFile, GGUFWriter
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
    (["--prune-layers", "1,x", "IN", "OUT", "Q4_0"], "--prune-layers '1,x': invalid layer id 'x'"),
    (["--prune-layers", "-1", "IN", "OUT", "Q4_0"], "invalid layer id '-1'"),
    (["--prune-layers", "0,", "IN", "OUT", "Q4_0"], "invalid layer id ''"),
    (["--prune-layers", "", "IN", "OUT", "Q4_0"], "invalid layer id ''"),
    (["--prune-layers", "1.5", "IN", "OUT", "Q4_0"], "invalid layer id '1.5'"),
    (["--prune-layers", "0,2", "IN", "OUT", "Q4_0"], "--prune-layers: layer 2 does not exist: the model has 2 layers"),
    (["--prune-layers", "1,0", "IN", "OUT", "Q4_0"], "--prune-layers: pruning all 2 layers leaves no model"),
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


def reader_kvs(path) -> dict:
    """The metadata as the gguf package reads it: key -> (value, GGUF type)."""
    r = gguf.GGUFReader(path)
    return {f.name: (f.contents(), f.types[0]) for f in r.fields.values() if not f.name.startswith("GGUF.")}


@pytest.fixture
def split_f16(f16, tmp_path):
    """The tiny model split as gguf-split splits it, into three parts."""
    with GGUFFile(f16) as f:
        return GGUFWriter.from_file(f).write_split(tmp_path / "split", 3)


def test_keep_split_writes_the_same_parts(split_f16, tmp_path, capsys):
    out = tmp_path / "q" / "model.gguf"
    out.parent.mkdir()
    assert main(["quantize", "--no-progress", "--keep-split", str(split_f16[0]), str(out), "Q8_0"]) == 0
    parts = [out.parent / f"model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert sorted(out.parent.iterdir()) == parts
    assert capsys.readouterr().out.splitlines()[-3:] == [f"wrote {p} (Q8_0)" for p in parts]
    n_tensors = sum(len(gguf.GGUFReader(p).tensors) for p in split_f16)
    for i, (src, dst) in enumerate(zip(split_f16, parts)):
        kvs = reader_kvs(dst)
        assert list(kvs)[-3:] == ["split.no", "split.count", "split.tensors.count"]
        assert kvs["split.no"] == (i, gguf.GGUFValueType.UINT16)
        assert kvs["split.count"] == (3, gguf.GGUFValueType.UINT16)
        assert kvs["split.tensors.count"] == (n_tensors, gguf.GGUFValueType.INT32)
        assert ("general.file_type" in kvs) == (i == 0)   # the model's metadata in the first part only
        assert [t.name for t in gguf.GGUFReader(dst).tensors] == [t.name for t in gguf.GGUFReader(src).tensors]
    with GGUFFile(parts[0]) as g:   # and ggmlpy reads the parts back as one model
        assert len(g.tensors) == n_tensors and g.tensors["blk.1.attn_q.weight"].type == GGMLType.Q8_0


def test_keep_split_default_name_and_unsplit_input(f16, split_f16, tmp_path):
    assert main(["quantize", "--no-progress", "--keep-split", str(split_f16[0]), "Q8_0"]) == 0
    assert all((tmp_path / f"ggml-model-Q8_0-0000{i}-of-00003.gguf").exists() for i in (1, 2, 3))
    out = tmp_path / "one.gguf"
    assert main(["quantize", "--no-progress", "--keep-split", str(f16), str(out), "Q8_0"]) == 0
    part = tmp_path / "one-00001-of-00001.gguf"   # llama_split_path even for one file, without split keys
    assert part.exists() and not out.exists()
    assert not any(k.startswith("split.") for k in reader_kvs(part))


def test_without_keep_split_a_split_input_is_one_file(split_f16, tmp_path):
    out = tmp_path / "one.gguf"
    assert main(["quantize", "--no-progress", str(split_f16[0]), str(out), "Q8_0"]) == 0
    assert not any(k.startswith("split.") for k in reader_kvs(out))
    assert len(gguf.GGUFReader(out).tensors) == sum(len(gguf.GGUFReader(p).tensors) for p in split_f16)


def test_keep_split_refuses_to_overwrite_an_input_part(split_f16, tmp_path, capsys):
    before = [p.read_bytes() for p in split_f16]
    assert main(["quantize", "--keep-split", str(split_f16[0]), str(tmp_path / "split.gguf"), "Q8_0"]) == 1
    assert "input and output files are the same" in capsys.readouterr().err
    assert [p.read_bytes() for p in split_f16] == before and not leftovers(tmp_path)


def test_keep_split_failure_leaves_no_part(split_f16, tmp_path, capsys, monkeypatch):
    def failing(*args):
        raise ValueError("boom")

    monkeypatch.setattr(driver, "encode_job", failing)
    out = tmp_path / "q.gguf"
    assert main(["quantize", "--no-progress", "--keep-split", str(split_f16[0]), str(out), "Q4_0", "1"]) == 1
    assert "boom" in capsys.readouterr().err
    assert not list(tmp_path.glob("q-*")) and not leftovers(tmp_path)


def test_prune_layers_renumbers_and_sets_block_count(tmp_path):
    src = write_tiny_model("llama", tmp_path / "four.gguf", n_embd=256, n_ff=256, n_layer=4,
                           weight_type=GGMLType.F16)
    out = tmp_path / "pruned.gguf"
    assert main(["quantize", "--no-progress", "--prune-layers", "2,0,2", str(src), str(out), "Q8_0"]) == 0
    kvs = reader_kvs(out)
    assert list(kvs)[-1] == "llama.block_count"   # set after the rest, as llama-quantize sets it
    assert kvs["llama.block_count"] == (2, gguf.GGUFValueType.UINT32)
    r_in, r_out = gguf.GGUFReader(src), gguf.GGUFReader(out)
    names = [t.name for t in r_out.tensors]
    assert {n.split(".")[1] for n in names if n.startswith("blk.")} == {"0", "1"}
    assert len(names) == len(r_in.tensors) - 2 * 9   # two layers of nine tensors gone
    tensors_in = {t.name: t for t in r_in.tensors}
    for new, old in (("blk.0.attn_norm.weight", "blk.1.attn_norm.weight"), ("blk.1.ffn_norm.weight",
                                                                             "blk.3.ffn_norm.weight")):
        t = next(t for t in r_out.tensors if t.name == new)   # F32 norms are copied: the old layer's bytes
        np.testing.assert_array_equal(t.data, tensors_in[old].data)


def test_prune_layers_from_python(f16, tmp_path):
    from llama.quantize import quantize_file
    result = quantize_file(f16, tmp_path / "out.gguf", "Q4_0", prune_layers=[1], dry_run=True)
    assert result.paths == [] and not any(name.startswith("blk.1.") for name in result.types)
    assert "blk.0.attn_q.weight" in result.types


def test_keep_split_refuses_a_middle_file_left_empty(tmp_path, capsys):
    """Four layers in three parts of 13 tensors: the second part is layers 1 and 2 only.
    llama-quantize crashes here (it has no output for that file); ggmlpy names it."""
    src = write_tiny_model("llama", tmp_path / "four.gguf", n_embd=256, n_ff=256, n_layer=4,
                           weight_type=GGMLType.F16)
    with GGUFFile(src) as f:
        parts = GGUFWriter.from_file(f).write_split(tmp_path / "four", 3)
    args = ["quantize", "--keep-split", "--prune-layers", "1,2", str(parts[0]), str(tmp_path / "q.gguf"), "Q8_0"]
    assert main(args) == 1
    assert f"--prune-layers leaves no tensor in {parts[1]}" in capsys.readouterr().err
    assert not list(tmp_path.glob("q*")) and not leftovers(tmp_path)
