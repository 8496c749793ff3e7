"""The Llama class's llama-cpp-python surface: constructor, accessors, tokens, state,
prompt cache and from_pretrained through a local Hugging Face cache."""
import json
import os
import subprocess
import sys

import pytest

from llama import Batch, Context, Llama
from llama.api.logprobs import log_softmax

PROMPT = "The capital of France is"


def test_constructor_takes_llama_cpp_python_keywords(smollm2_path):
    with pytest.raises(TypeError, match="no_such_option"):
        Llama(str(smollm2_path), no_such_option=1, vocab_only=True, verbose=False)
    with pytest.raises(ValueError, match="rpc_servers"):
        Llama(str(smollm2_path), rpc_servers="host:50052", vocab_only=True, verbose=False)
    llm = Llama(str(smollm2_path), vocab_only=True, split_mode=1, offload_kqv=True, verbose=False)
    with pytest.raises(RuntimeError, match="vocab_only"):
        llm.n_ctx()


def test_accessors_and_tokens(smol):
    vocab = smol.model.vocab
    assert smol.n_vocab() == 49152 and smol.n_ctx() == 1024 and smol.n_embd() == 576
    assert smol.token_bos() == vocab.special.bos == 1 and smol.token_eos() == vocab.special.eos == 2
    md = smol.metadata
    assert md["general.architecture"] == "llama" and md["llama.block_count"] == "30"
    assert md["tokenizer.chat_template"] == smol.model.gguf.metadata["tokenizer.chat_template"]
    ids = smol.tokenize("Héllo <|im_end|> wörld".encode(), add_bos=False, special=True)
    assert 2 in ids  # the control token is parsed with special=True
    assert 2 not in smol.tokenize("Héllo <|im_end|> wörld".encode(), add_bos=False, special=False)
    assert smol.detokenize(ids, special=True) == "Héllo <|im_end|> wörld".encode()
    assert smol.detokenize(ids) == "Héllo  wörld".encode()


def test_prompt_cache_decodes_only_the_new_suffix_with_the_same_logits(smol):
    first = smol(PROMPT, max_tokens=8, temperature=0)
    ids1 = smol.tokenize(PROMPT.encode(), add_bos=True, special=True)
    follow = PROMPT + first["choices"][0]["text"] + " And the capital of Italy is"
    ids2 = smol.tokenize(follow.encode(), add_bos=True, special=True)
    cached = list(smol.input_ids)
    assert cached[:len(ids1)] == ids1 and len(cached) == len(ids1) + 7  # the 8th token was never decoded
    shared = next(i for i, (a, b) in enumerate(zip(cached + [-1], ids2)) if a != b)
    before = smol.engine.n_prompt_decoded
    second = smol(follow, max_tokens=1, temperature=0, logprobs=3)
    assert smol.engine.n_prompt_decoded - before == len(ids2) - shared
    ctx = Context(smol.model, n_ctx=1024, n_threads=2)
    assert ctx.decode(Batch.from_tokens(ids2)) == 0
    fresh = log_softmax(ctx.get_logits_ith(-1))
    lp = second["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] == pytest.approx(fresh.max(), abs=2e-3)
    assert max(smol.scores - ctx.get_logits_ith(-1), key=abs) == pytest.approx(0, abs=2e-2)


def test_save_and_load_state_restore_the_cache(smol):
    a = smol("Once upon a time", max_tokens=6, temperature=0)
    state = smol.save_state()
    assert state.llama_state_size > 0 and state.tokens == list(smol.input_ids)
    smol("Something else entirely", max_tokens=4, temperature=0)
    smol.load_state(state)
    before = smol.engine.n_prompt_decoded
    again = smol("Once upon a time", max_tokens=6, temperature=0)
    assert again["choices"][0]["text"] == a["choices"][0]["text"]
    assert smol.engine.n_prompt_decoded - before == 1  # only the last prompt token, for its logits
    smol.reset()
    before = smol.engine.n_prompt_decoded
    smol("Once upon a time", max_tokens=1, temperature=0)
    assert smol.engine.n_prompt_decoded - before == a["usage"]["prompt_tokens"]


def test_from_pretrained_reads_a_local_hub_cache_offline(tmp_path, smollm2_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "smollm2-135m-instruct-q4_1.gguf").symlink_to(smollm2_path)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    script = (
        "import json, sys\n"
        "from llama import Llama\n"
        "llm = Llama.from_pretrained('HuggingFaceTB/SmolLM2-135M-Instruct-GGUF', '{name}',\n"
        "    cache_dir=sys.argv[1], vocab_only=True, verbose=False)\n"
        "print(json.dumps([llm.model_path, llm.n_vocab()]))\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for name in ("smollm2-135m-instruct-q4_1.gguf", "*q4_1.gguf"):
        res = subprocess.run([sys.executable, "-c", script.format(name=name), str(tmp_path / "hub")],
                             capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == 0, res.stderr
        path, n_vocab = json.loads(res.stdout.strip().splitlines()[-1])
        assert path == str(snap / "smollm2-135m-instruct-q4_1.gguf") and n_vocab == 49152
    res = subprocess.run([sys.executable, "-c", script.format(name="missing.gguf"), str(tmp_path / "hub")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode != 0 and "not in the local hub cache" in res.stderr
