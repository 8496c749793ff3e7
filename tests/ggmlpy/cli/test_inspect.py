"""`ggmlpy inspect`, run in-process through the CLI's main on both real models and on small
files made for the cases the real models do not exercise (guessed file type, bad files).

The expected figures are llama.cpp's for these files ("model size = 235.16 MiB (7.36 BPW)"
is what llama.cpp reports for gemma-3-270m Q4_K_M, 134.52 M parameters for SmolLM2-135M);
test_gguf_reader checks every tensor's element and byte count against the `gguf` package.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ggmlpy.cli import main
from ggmlpy.gguf import GGMLType, GGUFFile, GGUFValueType as T
from ggmlpy.gguf.summary import LLAMA_FTYPE_GUESSED, file_type_name, guess_file_type
from ggmlpy.gguf.writer import GGUFWriter


def run_json(capsys, *args) -> dict:
    assert main(["inspect", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_model_text(capsys, smollm2_path):
    assert main(["inspect"]) == 0  # no argument: the default model, smollm2-135m
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in out.splitlines()[0]
    for line in ["GGUF version:  3", "architecture:  llama", "file type:     Q4_1",
                 "tensors:       272 (F32 61, Q4_1 210, Q8_0 1)",
                 "parameters:    134.52 M (134515008)", "size:          92.10 MiB (5.74 BPW)",
                 "metadata: 33 keys", "tensors: 272"]:
        assert line in out.splitlines(), line
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  ")}
    assert rows["token_embd.weight"] == ["token_embd.weight", "Q8_0", "[576,", "49152]", "30081024"]
    assert rows["blk.0.ffn_down.weight"][1:] == ["Q4_1", "[1536,", "576]", "552960"]
    assert rows["tokenizer.ggml.tokens"][1:4] == ["array[string,49152]", "=", "[49152"]
    assert "[49152 strings: '<|endoftext|>', '<|im_start|>', '<|im_end|>', ...]" in out
    assert rows["tokenizer.ggml.token_type"][1:] == ["array[int32,49152]", "=", "[49152", "int32]"]
    assert rows["llama.attention.layer_norm_rms_epsilon"][1:] == ["float32", "=", "1e-05"]
    assert rows["tokenizer.ggml.add_bos_token"][1:] == ["bool", "=", "false"]
    assert rows["general.languages"][1:] == ["array[string,1]", "=", "['en']"]
    chat = rows["tokenizer.chat_template"]
    assert chat[-1].endswith("...") and "\n" not in chat  # long strings are cut to one line


def test_smollm2_json(capsys, smollm2_path):
    d = run_json(capsys, str(smollm2_path))
    assert (d["version"], d["architecture"], d["n_tensors"]) == (3, "llama", 272)
    assert (d["file_type"], d["file_type_name"], d["file_type_guessed"]) == (3, "Q4_1", False)
    assert (d["n_params"], d["tensor_bytes"]) == (134515008, 96576768)
    assert d["bpw"] == pytest.approx(96576768 * 8 / 134515008) and round(d["bpw"], 2) == 5.74
    assert round(d["size_mib"], 2) == 92.10
    assert d["type_counts"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert len(d["metadata"]) == 33 and len(d["tensors"]) == 272
    assert d["metadata"]["llama.context_length"] == {"type": "uint32", "value": 8192}
    assert d["metadata"]["tokenizer.ggml.merges"]["value"] == "[48900 strings: 'Ġ t', 'Ġ a', 'i n', ...]"
    template = d["metadata"]["tokenizer.chat_template"]["value"]
    assert template.startswith("{% for message in messages %}") and "\n" in template  # JSON: whole
    assert d["tensors"][0] == {"name": "token_embd.weight", "type": "Q8_0", "shape": [576, 49152],
                               "nbytes": 30081024, "offset": 1785664, "part": 0}


def test_gemma3_json_by_name(capsys, gemma3_path):
    d = run_json(capsys, "gemma3-270m")
    assert d["path"] == str(gemma3_path)
    assert (d["version"], d["architecture"], d["n_tensors"]) == (3, "gemma3", 236)
    assert (d["file_type"], d["file_type_name"]) == (15, "Q4_K - Medium")
    assert (d["n_params"], d["tensor_bytes"]) == (268098176, 246587904)
    assert round(d["size_mib"], 2) == 235.16 and round(d["bpw"], 2) == 7.36  # llama.cpp's figures
    assert d["type_counts"] == {"F32": 109, "Q5_0": 81, "Q8_0": 10, "Q4_K": 27, "Q6_K": 9}
    md = d["metadata"]
    assert md["tokenizer.ggml.tokens"] == {"type": "array[string,262144]",
                                           "value": "[262144 strings: '<pad>', '<eos>', '<bos>', ...]"}
    assert md["tokenizer.ggml.scores"]["value"] == "[262144 float32]"
    assert md["general.tags"]["value"] == ["gemma3", "gemma", "google", "text-generation"]
    assert md["gemma3.attention.layer_norm_rms_epsilon"]["value"] == 1e-06
    assert md["tokenizer.ggml.add_bos_token"]["value"] is True
    embd = next(t for t in d["tensors"] if t["name"] == "token_embd.weight")
    assert (embd["type"], embd["shape"], embd["nbytes"]) == ("Q8_0", [640, 262144], 178257920)


def test_guessed_file_type_of_the_real_models(smollm2_path, gemma3_path):
    """Without general.file_type llama.cpp would guess from the most common tensor type:
    Q4_1 for SmolLM2; for Gemma F32 tensors (norms) outnumber any quantised type."""
    with GGUFFile(smollm2_path) as f:
        assert guess_file_type(f.tensors.values()) == 3 | LLAMA_FTYPE_GUESSED
    with GGUFFile(gemma3_path) as f:
        assert guess_file_type(f.tensors.values()) == 0 | LLAMA_FTYPE_GUESSED
    assert file_type_name(3 | LLAMA_FTYPE_GUESSED) == "Q4_1 (guessed)"


def _tiny(tmp_path, tensors: dict[str, GGMLType], **metadata) -> str:
    w = GGUFWriter("llama")
    for key, value in metadata.items():
        w.add_key_value(key.replace("__", "."), value)
    for name, ttype in tensors.items():
        if ttype == GGMLType.Q8_0:
            w.add_tensor(name, np.zeros((1, 34), np.uint8), type=ttype)
        else:
            w.add_tensor(name, np.zeros(32, {GGMLType.F32: np.float32, GGMLType.F16: np.float16,
                                             GGMLType.I32: np.int32}[ttype]))
    return str(w.write(tmp_path / "tiny.gguf"))


@pytest.mark.parametrize("tensors, ftype, name", [
    ({"a": GGMLType.Q8_0, "b": GGMLType.Q8_0, "c": GGMLType.F32}, 7, "Q8_0 (guessed)"),
    # a tie: walking names in order, F16 reaches 2 before Q8_0 does and keeps the lead
    ({"d": GGMLType.Q8_0, "a": GGMLType.F16, "b": GGMLType.F16, "c": GGMLType.Q8_0}, 1, "F16 (guessed)"),
    ({"d": GGMLType.F16, "a": GGMLType.Q8_0, "b": GGMLType.F16, "c": GGMLType.Q8_0}, 7, "Q8_0 (guessed)"),
    ({"x": GGMLType.I32, "y": GGMLType.I32, "z": GGMLType.F16}, 0, "all F32 (guessed)"),
])
def test_guessed_file_type(capsys, tmp_path, tensors, ftype, name):
    d = run_json(capsys, _tiny(tmp_path, tensors))
    assert d["file_type"] == ftype | LLAMA_FTYPE_GUESSED
    assert (d["file_type_name"], d["file_type_guessed"]) == (name, True)
    assert main(["inspect", _tiny(tmp_path, tensors)]) == 0
    assert f"file type:     {name}" in capsys.readouterr().out.splitlines()


def test_declared_file_types_and_bpw(capsys, tmp_path):
    path = _tiny(tmp_path, {"a": GGMLType.Q8_0, "b": GGMLType.F32}, general__file_type=99)
    d = run_json(capsys, path)
    assert (d["file_type"], d["file_type_name"], d["file_type_guessed"]) == (99, "unknown, may not work", False)
    # 32 Q8_0 elements in 34 bytes and 32 F32 elements in 128 bytes
    assert (d["n_params"], d["tensor_bytes"]) == (64, 162) and d["bpw"] == pytest.approx(162 * 8 / 64)
    assert [file_type_name(t) for t in (0, 1, 14, 32, 38)] == [
        "all F32", "F16", "Q4_K - Small", "BF16", "MXFP4 MoE"]


def test_metadata_display(capsys, tmp_path):
    w = GGUFWriter("llama")
    w.add_string("long", "line one\nline two " + "x" * 100)
    w.add_string("bad_utf8", b"ok \xff".decode("utf-8", "surrogateescape"))
    w.add_array("short", np.array([1, 2, 3], dtype=np.uint16))
    w.add_array("long_f64", np.zeros(9, dtype=np.float64))
    w.add_array("nested", [["a"], ["b"]], T.ARRAY)
    path = str(w.write(tmp_path / "m.gguf"))
    assert main(["inspect", path]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")}
    assert rows["long"].endswith("= line one\\nline two " + "x" * 38 + "...")
    assert rows["bad_utf8"].endswith("= ok \\xff")
    assert rows["short"].endswith("array[uint16,3]   = [1, 2, 3]")
    assert rows["long_f64"].endswith("= [9 float64]")
    assert rows["nested"].endswith("= [2 arrays]")
    md = run_json(capsys, path)["metadata"]
    assert md["long"]["value"] == "line one\nline two " + "x" * 100
    assert md["short"] == {"type": "array[uint16,3]", "value": [1, 2, 3]}


def test_malformed_file_is_one_clear_line(capsys, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (7).to_bytes(4, "little") + bytes(16))
    assert main(["inspect", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"ggmlpy inspect: error: {bad}: unsupported GGUF version 7 "
                                f"(supported: 2, 3) (at byte offset 4)"]


def test_unknown_name_is_one_clear_line(capsys, tmp_path):
    assert main(["inspect", str(tmp_path / "missing.gguf"), "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert "no such file, and not a known model name" in err
