"""`ggmlpy run` and `ggmlpy tokenize`, in-process through the CLI's main.

The greedy ids of `run --temp 0` are checked against an independent loop over the public API
(llama.Context + argmax), the tokenizer output against `Model.tokenize`. SmolLM2 runs on the
reference backend are slow, so the real-model generations are done once per module; the
cases about options and errors use a tiny random-weight llama written by the test.
"""
from __future__ import annotations

import contextlib
import io
import json
import re

import numpy as np
import pytest

import llama
from ggmlpy.cli import main
from ggmlpy.gguf import GGUFFile
from ggmlpy.gguf.writer import GGUFWriter
from ggmlpy.testing.models import write_tiny_llama

PROMPT = "The capital of France is"
N_GEN = 8
N_CTX = 256


def call(*argv: str) -> tuple[int, str, str]:
    """main(argv) with stdout and stderr captured (usable from module-scoped fixtures)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    model = llama.Model.load(smollm2_path)
    yield model
    model.close()


@pytest.fixture(scope="module")
def greedy_ids(smollm2) -> list[int]:
    """Greedy continuation computed directly with the API: decode the prompt, then argmax."""
    ctx = llama.Context(smollm2, n_ctx=N_CTX)
    ids = smollm2.tokenize(PROMPT, add_special=True, parse_special=True)
    assert ctx.decode(llama.Batch.from_tokens(ids)) == 0
    out = []
    for _ in range(N_GEN):
        tok = int(np.argmax(ctx.get_logits_ith(-1)))
        if smollm2.vocab.is_eog(tok):
            break
        out.append(tok)
        assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
    return out


@pytest.fixture(scope="module")
def json_run(smollm2_path) -> dict:
    rc, out, err = call("run", "-m", str(smollm2_path), "-p", PROMPT, "-n", str(N_GEN),
                        "--temp", "0", "-c", str(N_CTX), "--json")
    assert rc == 0, err
    assert out.count("\n") == 1  # exactly one JSON object, nothing streamed
    return json.loads(out)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_layer=2, seed=3)


# run: SmolLM2 -------------------------------------------------------------------------------
def test_run_json_greedy_matches_api(json_run, greedy_ids, smollm2):
    assert len(greedy_ids) == N_GEN  # no end-of-generation within 8 tokens for this prompt
    assert json_run["ids"] == greedy_ids
    assert json_run["text"] == smollm2.detokenize(greedy_ids)
    assert json_run["text"].strip()
    assert json_run["prompt"] == PROMPT
    assert json_run["prompt_ids"] == smollm2.tokenize(PROMPT, parse_special=True)
    assert json_run["stop_reason"] == "length"
    assert json_run["seed"] is None  # greedy: no random draw
    assert json_run["model"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert json_run["n_ctx"] == N_CTX
    assert json_run["backend"] == "cpu"  # the best available backend


def test_run_json_timings(json_run):
    t = json_run["timings"]
    assert t["prompt_tokens"] == len(json_run["prompt_ids"]) == 5
    assert t["gen_tokens"] == N_GEN
    assert t["eval_runs"] == N_GEN - 1  # the last token is not fed back when the limit stops it
    for key in ("load_ms", "prompt_ms", "eval_ms", "total_ms", "prompt_tok_s", "eval_tok_s"):
        assert t[key] > 0, key
    assert t["total_ms"] >= t["load_ms"] + t["prompt_ms"] + t["eval_ms"] - 1e-3
    assert t["prompt_tok_s"] == pytest.approx(5 / t["prompt_ms"] * 1000, rel=1e-3)
    assert t["eval_tok_s"] == pytest.approx((N_GEN - 1) / t["eval_ms"] * 1000, rel=1e-3)


def test_run_stream_writes_the_json_text(json_run, smollm2_path):
    rc, out, err = call("run", "-m", str(smollm2_path), "-p", PROMPT, "-n", str(N_GEN),
                        "--temp", "0", "-c", str(N_CTX))
    assert rc == 0, err
    assert out == json_run["text"] + "\n"
    lines = err.splitlines()
    assert any(re.search(r"load time =\s+[\d.]+ ms$", line) for line in lines), err
    assert any(re.search(r"prompt eval time =\s+[\d.]+ ms /\s+5 tokens \(\s*[\d.]+ ms per token,"
                         r"\s+[\d.]+ tokens per second\)", line) for line in lines), err
    assert any(re.search(rf"eval time =\s+[\d.]+ ms /\s+{N_GEN - 1} runs", line)
               for line in lines if "prompt" not in line), err
    assert any(re.search(rf"total time =\s+[\d.]+ ms /\s+{5 + N_GEN - 1} tokens", line)
               for line in lines), err
    assert "greedy" in err and "stop: length" in err


# run: options and errors (tiny model) ------------------------------------------------------
def test_run_seeded_sampling_is_reproducible(tiny_path):
    def run(seed: int, *extra: str) -> tuple[int, str, str]:
        return call("run", "-m", str(tiny_path), "-p", "the", "-n", "12", "-c", "256",
                    "--seed", str(seed), "--temp", "1.5", "--top-k", "0", "--top-p", "1",
                    "--min-p", "0", *extra)

    rc1, out1, _ = run(1234, "--json")
    rc2, out2, err2 = run(1234)
    rc3, out3, _ = run(1235, "--json")
    assert rc1 == rc2 == rc3 == 0
    first, other = json.loads(out1), json.loads(out3)
    assert first["seed"] == 1234 and other["seed"] == 1235 and "seed 1234" in err2
    assert out2 == first["text"] + "\n"  # same seed: the stream writes the same text
    assert len(first["ids"]) == 12 and first["stop_reason"] == "length"
    # 12 draws at temperature 1.5 over 320 random logits: another seed changes them
    assert other["ids"] != first["ids"]


def test_run_mirostat(tiny_path):
    """--mirostat 1/2 with llama-cli's --mirostat-ent (tau) and --mirostat-lr (eta): a seed
    reproduces the ids, which differ from the default chain's; a target entropy near 0
    keeps only the most probable token (greedy)."""
    def ids(*extra: str) -> list[int]:
        rc, out, err = call("run", "-m", str(tiny_path), "-p", "the", "-n", "10", "-c", "256",
                            "--json", "--temp", "1.5", *extra)
        assert rc == 0, err
        return json.loads(out)["ids"]

    for version in ("1", "2"):
        miro = ids("--mirostat", version, "--mirostat-ent", "6", "--mirostat-lr", "0.2", "--seed", "99")
        assert miro == ids("--mirostat", version, "--mirostat-ent", "6", "--mirostat-lr", "0.2", "--seed", "99")
        assert miro != ids("--seed", "99", "--top-k", "0", "--top-p", "1", "--min-p", "0")
        assert ids("--mirostat", version, "--mirostat-ent", "0.01", "--seed", "5") == ids("--temp", "0")


def test_run_dry_and_sampler_order(tiny_path):
    """llama-cli's DRY options change a greedy loop; --samplers / --sampling-seq choose the
    chain (top-k alone with k = 1 is greedy at any temperature)."""
    def ids(*extra: str) -> list[int]:
        rc, out, err = call("run", "-m", str(tiny_path), "-p", "the the the the", "-n", "16",
                            "-c", "256", "--json", *extra)
        assert rc == 0, err
        return json.loads(out)["ids"]

    greedy = ids("--temp", "0")
    assert len(set(greedy)) < len(greedy)   # the tiny model repeats itself
    dry = ["--temp", "0", "--dry-multiplier", "5", "--dry-allowed-length", "1"]
    assert ids(*dry) != greedy
    assert ids(*dry, "--dry-sequence-breaker", "none") == ids(*dry)   # no breaker in this text
    assert ids(*dry, "--dry-penalty-last-n", "0") == greedy          # 0: DRY off
    assert ids("--temp", "1.5", "--seed", "3", "--sampling-seq", "k", "--top-k", "1") == greedy
    assert ids("--temp", "1.5", "--seed", "3", "--samplers", "top_k", "--top-k", "1") == greedy


def _greedy_ids(model: llama.Model, ctx: llama.Context, prompt: str, n: int) -> list[int]:
    """What `run --temp 0 -n n` should print: argmax ids until n or an end-of-generation."""
    ctx.decode(llama.Batch.from_tokens(model.tokenize(prompt, parse_special=True)))
    expect = []
    for _ in range(n):
        tok = int(np.argmax(ctx.get_logits_ith(-1)))
        if model.vocab.is_eog(tok):
            break
        expect.append(tok)
        ctx.decode(llama.Batch.from_tokens([tok]))
    return expect


def test_run_greedy_tiny_matches_api(tiny_path):
    model = llama.Model.load(tiny_path)
    expect = _greedy_ids(model, llama.Context(model, n_ctx=256), "the", 6)
    rc, out, err = call("run", "-m", str(tiny_path), "-p", "the", "-n", "6", "--temp", "0",
                        "-c", "256", "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["ids"] == expect
    assert got["stop_reason"] == ("length" if len(expect) == 6 else "eog")


def test_run_lora_matches_api(tiny_path, tmp_path):
    """--lora-scaled: the ids of a Context with the adapter at that scale; a missing file is
    one line naming it."""
    from ggmlpy.testing.lora import write_lora
    adapter = write_lora(tiny_path, tmp_path / "lora.gguf", rank=4, magnitude=3.0)
    model = llama.Model.load(tiny_path)
    ctx = llama.Context(model, n_ctx=256)
    ctx.set_adapter_lora(model.load_lora(adapter), 0.5)
    expect = _greedy_ids(model, ctx, "the", 6)
    rc, out, err = call("run", "-m", str(tiny_path), "-p", "the", "-n", "6", "--temp", "0",
                        "-c", "256", "--json", "--lora-scaled", f"{adapter}:0.5")
    assert rc == 0, err
    assert json.loads(out)["ids"] == expect
    rc, out, err = call("run", "-m", str(tiny_path), "-p", "the", "-n", "6", "--temp", "0",
                        "-c", "256", "--json")
    assert json.loads(out)["ids"] != expect   # the adapter changed them
    rc, out, err = call("run", "-m", str(tiny_path), "-p", "the", "--lora", str(tmp_path / "no.gguf"))
    assert rc == 1 and "no such LoRA adapter file" in err and err.count("\n") == 1


@pytest.mark.parametrize("option, value, message", [
    ("--top-p", "1.5", "top_p"),
    ("--min-p", "-0.1", "min_p"),
    ("--temp", "nan", "temp"),
    ("--repeat-penalty", "0", "repeat_penalty"),
    ("--seed", "4294967296", "seed"),
    ("--repeat-last-n", "-2", "repeat_last_n"),
    ("-n", "-3", "-n must be"),
    ("--threads", "0", "n_threads"),
    ("--backend", "nope", "unknown backend"),
    ("--mirostat-ent", "nan", "mirostat_tau"),
    ("--dry-allowed-length", "-1", "dry_allowed_length"),
    ("--samplers", "top_k;bogus", "unknown sampler 'bogus'"),
    ("--sampling-seq", "kz", "unknown sampler character"),
])
def test_run_bad_values_exit_1_with_one_line(tiny_path, option, value, message):
    rc, out, err = call("run", "-m", str(tiny_path), "-p", "the", "-n", "2", option, value)
    assert rc == 1
    assert out == ""
    assert err.startswith("ggmlpy run: error: ") and message in err
    assert err.count("\n") == 1, err  # one line, no traceback


def test_run_prompt_longer_than_context(tiny_path):
    rc, out, err = call("run", "-m", str(tiny_path), "-p", "the " * 300, "-c", "256", "-n", "1")
    assert rc == 1
    assert "ggmlpy run: error:" in err and "context" in err and err.count("\n") == 1


def test_run_unknown_model():
    rc, _, err = call("run", "-m", "no-such-model", "-p", "x")
    assert rc == 1 and "no-such-model" in err and "known model" in err


# tokenize -----------------------------------------------------------------------------------
TEXTS = ["Hello world, 日本 héllo!", "  two  spaces\nand a newline", "<|im_start|>user hi<|im_end|>"]


def parse_lines(out: str) -> list[tuple[int, str]]:
    rows = []
    for line in out.splitlines():
        m = re.fullmatch(r"\s*(\d+) -> '(.*)'", line, re.S)
        assert m, line
        rows.append((int(m.group(1)), m.group(2)))
    return rows


def piece(model, tok: int) -> str:
    return model.token_to_piece(tok, special=True).decode("utf-8", "backslashreplace")


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_lines_match_model(text, smollm2, smollm2_path, capsys):
    assert main(["tokenize", "-m", str(smollm2_path), text]) == 0
    out = capsys.readouterr().out
    ids = smollm2.tokenize(text)
    # the whole output, since a piece may itself hold a newline
    assert out == "".join(f"{i:6d} -> '{piece(smollm2, i)}'\n" for i in ids)
    if "\n" not in text:
        assert [tok for tok, _ in parse_lines(out)] == ids


def test_tokenize_split_utf8_shown_as_escapes(smollm2_path, capsys):
    # '日' is split over three byte-level tokens by SmolLM2's BPE
    assert main(["tokenize", "-m", str(smollm2_path), " 日本"]) == 0
    rows = parse_lines(capsys.readouterr().out)
    assert rows[0][1] == " \\xe6" and rows[-1][1] == "本"


def test_tokenize_json_ids_and_parse_special(smollm2, smollm2_path, capsys):
    text = TEXTS[2]
    assert main(["tokenize", "-m", str(smollm2_path), text, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["tokenize", "-m", str(smollm2_path), text, "--parse-special", "--ids"]) == 0
    out = capsys.readouterr().out
    special = json.loads(out)
    assert plain == smollm2.tokenize(text, parse_special=False)
    assert special == smollm2.tokenize(text, parse_special=True)
    assert special[0] == 1 and special[-1] == 2  # <|im_start|> and <|im_end|> as single tokens
    assert len(plain) > len(special)
    assert out == "[" + ", ".join(map(str, special)) + "]\n"  # llama-tokenize's --ids layout


def test_tokenize_no_bos(tmp_path, capsys):
    """The tiny vocabulary with add_bos_token switched on: BOS only without --no-bos."""
    tiny = write_tiny_llama(tmp_path / "t.gguf", n_layer=1)
    with GGUFFile(tiny) as f:
        w = GGUFWriter(version=f.version)
        for key, fl in f.fields.items():
            value = True if key == "tokenizer.ggml.add_bos_token" else fl.value
            w.add_key_value(key, value, fl.type, fl.element_type)
        for t in f.tensors.values():
            w.add_tensor(t.name, t.data, type=t.type, ne=t.ne)
    path = w.write(tmp_path / "bos.gguf")
    model = llama.Model.load(path, vocab_only=True)
    assert main(["tokenize", "-m", str(path), "the ther", "--json", "--show-count"]) == 0
    out = capsys.readouterr().out.splitlines()
    with_bos = json.loads(out[0])
    assert out[1] == f"Total number of tokens: {len(with_bos)}"
    assert main(["tokenize", "-m", str(path), "the ther", "--no-bos", "--json"]) == 0
    without = json.loads(capsys.readouterr().out)
    assert with_bos == model.tokenize("the ther") == [model.vocab.bos_id] + without
    assert without == model.tokenize("the ther", add_special=False)
    model.close()


def test_tokenize_reads_stdin(smollm2, smollm2_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("from stdin"))
    assert main(["tokenize", "-m", str(smollm2_path), "-", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == smollm2.tokenize("from stdin")


# offloading (-ngl, --devices, --tensor-split) -------------------------------------------------
@pytest.mark.parametrize("ngl, more", [("-1", []), ("16", []), ("-1", ["-ot", r"token_embd=cpu,blk\.[0-9]\.ffn_down=CPU"])])
def test_run_offloaded_to_a_second_cpu_device_gives_the_same_greedy_ids(smollm2_path, greedy_ids, ngl, more):
    """All layers (-1, as llama-cpp-python's) or the last 15 and the output (16) on cpu:1,
    or all of them but the output product and ten feed-forward products (-ot): the
    scheduler splits the graph and copies between the two backends, and the tokens stay
    those of one device."""
    rc, out, err = call("run", "-m", str(smollm2_path), "-p", PROMPT, "-n", str(N_GEN), "--temp", "0",
                        "-c", str(N_CTX), "--json", "--devices", "cpu:1", "-ngl", ngl, *more)
    assert rc == 0, err
    result = json.loads(out)
    assert result["devices"] == ["cpu:1"] and result["n_gpu_layers"] == int(ngl)
    assert result["ids"] == greedy_ids


def test_placement_options_resolve_like_llama_cpp(caplog):
    import argparse

    from ggmlpy.cli.placement_args import add_placement_args, load_kwargs, placement_kwargs

    p = argparse.ArgumentParser()
    add_placement_args(p)
    parse = p.parse_args
    assert placement_kwargs(parse(["-dev", "cpu:1", "-ngl", "-1"])) == \
        {"devices": ["cpu:1"], "n_gpu_layers": -1, "tensor_split": None, "override_tensor": None}
    assert placement_kwargs(parse(["--devices", "cpu:1,cpu:2", "-ts", "3,1", "-ngl", "8"])) == \
        {"devices": ["cpu:1", "cpu:2"], "n_gpu_layers": 8, "tensor_split": [3.0, 1.0], "override_tensor": None}
    assert placement_kwargs(parse([])) == {"devices": None, "n_gpu_layers": 0, "tensor_split": None,
                                           "override_tensor": None}
    # llama.cpp's -nr / --no-repack, and --repack back on (the last one given wins): Model.load's
    assert load_kwargs(parse(["-nr", "-ngl", "2", "-dev", "cpu:1"])) == \
        {"devices": ["cpu:1"], "n_gpu_layers": 2, "tensor_split": None, "override_tensor": None, "repack": False}
    assert load_kwargs(parse(["--no-repack", "--repack"]))["repack"] is True
    # -ot: comma-separated within one value (as llama.cpp), repeatable, in the order given
    got = placement_kwargs(parse(["-dev", "cpu:1", "-ngl", "99", "-ot", r"ffn_(up|down)=CPU,token_embd=cpu",
                                  "--override-tensor", r"blk\.0\.=cpu:1"]))
    assert got["override_tensor"] == [r"ffn_(up|down)=CPU", "token_embd=cpu", r"blk\.0\.=cpu:1"]
    # --cpu-moe / --n-cpu-moe: llama.cpp's expert pattern kept on the CPU, after -ot's items
    exps = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
    assert placement_kwargs(parse(["-ot", "a=cpu", "--cpu-moe"]))["override_tensor"] == ["a=cpu", exps + "=cpu"]
    assert placement_kwargs(parse(["-ncmoe", "2"]))["override_tensor"] == \
        [r"blk\.0" + exps + "=cpu", r"blk\.1" + exps + "=cpu"]
    with pytest.raises(ValueError, match="2 shares for 1 devices"):
        placement_kwargs(parse(["--devices", "cpu:1", "-ts", "1,1", "-ngl", "4"]))
    for bad in (["-ts", "1,x"], ["-ot", "no_device"], ["-ot", "=CPU"], ["--n-cpu-moe", "-1"]):
        with pytest.raises(SystemExit):  # argparse names the bad option
            parse(bad)


def test_ngl_without_a_gpu_is_ignored_with_a_warning(tiny_path, caplog):
    from ggmlpy.codegen_cuda import cuda_available

    if cuda_available()[0]:
        pytest.skip("a GPU is present: -ngl offloads to it")
    with caplog.at_level("WARNING", logger="ggmlpy.cli"):
        rc, out, err = call("run", "-m", str(tiny_path), "-p", "the", "-n", "3", "--temp", "0", "-c", "256",
                            "--json", "-ngl", "99")
    assert rc == 0, err
    result = json.loads(out)
    assert result["devices"] == [] and result["n_gpu_layers"] == 0 and len(result["ids"]) == 3
    assert any("-ngl 99 ignored: no GPU device" in r.getMessage() for r in caplog.records)


def test_run_no_repack_gives_the_same_greedy_ids(smollm2_path, greedy_ids):
    """-nr (llama.cpp's --no-repack): every weight read as the file stores it, the same tokens."""
    rc, out, err = call("run", "-m", str(smollm2_path), "-p", PROMPT, "-n", str(N_GEN), "--temp", "0",
                        "-c", str(N_CTX), "--json", "-nr")
    assert rc == 0, err
    assert json.loads(out)["ids"] == greedy_ids


def test_bench_offloaded_reports_its_devices(tiny_path):
    rc, out, err = call("bench", "-m", str(tiny_path), "-p", "8", "-n", "4", "-r", "1", "--no-start-times",
                        "--devices", "cpu:1", "-ngl", "99")
    assert rc == 0, err
    result = json.loads(out)
    assert result["devices"] == ["cpu:1"] and result["ngl"] == 99
    assert result["backend"] == "cpu:1"  # every layer and the output on the device
    assert result["pp8_tok_s"] > 0 and result["tg4_tok_s"] > 0
