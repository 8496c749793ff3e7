"""`ggmlpy run` and `ggmlpy chat` with llama.cpp's -ctk/-ctv/-fa: a quantised KV cache gives
the ids the API gives with the same types, and a quantised V with -fa off is one line with
llama.cpp's message."""
from __future__ import annotations

import json

import numpy as np
import pytest

import llama
from ggmlpy.cli import build_parser
from ggmlpy.cli.cache_args import cache_kwargs
from tests.ggmlpy.cli.test_cli_run import call
from tests.tools.kv_quant_vectors import write_file


@pytest.fixture(scope="module")
def h32(tmp_path_factory):
    return write_file("h32", tmp_path_factory.mktemp("cli_kv"))


def test_run_with_a_quantised_cache_matches_the_api(h32):
    model = llama.Model.load(str(h32))
    ctx = llama.Context(model, n_ctx=256, type_k="q8_0", type_v="q4_0")
    ids = model.tokenize("the", add_special=True, parse_special=True)
    assert ctx.decode(llama.Batch.from_tokens(ids)) == 0
    expect = []
    for _ in range(6):
        tok = int(np.argmax(ctx.get_logits_ith(-1)))
        expect.append(tok)
        assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
    rc, out, err = call("run", "-m", str(h32), "-p", "the", "-n", "6", "--temp", "0", "-c", "256", "--json",
                        "-ctk", "q8_0", "-ctv", "q4_0")
    assert rc == 0, err
    got = json.loads(out)["ids"]
    assert got and got == expect[:len(got)]   # (shorter only where an end-of-generation token came)


def test_run_refuses_a_quantised_v_without_flash_attention(h32):
    rc, out, err = call("run", "-m", str(h32), "-p", "the", "-n", "2", "-ctv", "q8_0", "-fa", "off")
    assert rc == 1 and out == ""
    assert err.startswith("ggmlpy run: error: ") and "quantized V cache requires flash_attn" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", ["run", "chat"])
def test_the_options_parse_as_llama_cpps(command):
    extra = ["-p", "x"] if command == "run" else []
    args = build_parser().parse_args([command, "-m", "m.gguf", *extra, "-ctk", "iq4_nl", "--cache-type-v", "q5_1",
                                      "-fa", "on"])
    assert cache_kwargs(args) == {"type_k": "iq4_nl", "type_v": "q5_1", "flash_attn": True}
    defaults = build_parser().parse_args([command, "-m", "m.gguf", *extra])
    assert cache_kwargs(defaults) == {"type_k": "f16", "type_v": "f16", "flash_attn": None}
