"""llama-cpp-python's surface beyond the three front ends' keywords: positional arguments in
its order, `generate`, `tokenizer()`, its list types, static helpers and error types."""
import inspect

import numpy as np
import pytest

from llama import (LLAMA_DEFAULT_SEED, Llama, LlamaTokenizer, LogitsProcessorList,
                   MinTokensLogitsProcessor, StoppingCriteriaList)
from llama.api import compat
from llama.api.logprobs import log_softmax

PROMPT = "The capital of France is"


def _text(out: dict) -> str:
    return out["choices"][0]["text"]


def test_positional_arguments_follow_llama_cpp_pythons_order(smol):
    assert compat.COMPLETION_ARGS[:3] == ("suffix", "max_tokens", "temperature")
    keyword = smol(PROMPT, max_tokens=5, temperature=0.0)
    assert _text(smol(PROMPT, None, 5, 0.0)) == _text(keyword)
    assert _text(smol.create_completion(PROMPT, None, 5, 0.0)) == _text(keyword)
    msgs = [{"role": "user", "content": "Hi"}]
    chat = smol.create_chat_completion(msgs, None, None, None, None, 0.0, max_tokens=5)
    assert chat["choices"][0]["message"] == smol.create_chat_completion(
        msgs, temperature=0.0, max_tokens=5)["choices"][0]["message"]
    with pytest.raises(TypeError, match="multiple values for argument 'max_tokens'"):
        smol(PROMPT, None, 5, max_tokens=3)
    with pytest.raises(TypeError, match="positional arguments"):
        smol(PROMPT, *([None] * (len(compat.COMPLETION_ARGS) + 1)))


def test_positional_orders_are_the_keyword_functions_parameters():
    """Every name in the orders is a parameter of the function the call ends in (a typo
    would turn a positional value into an unexpected keyword)."""
    from llama.api.chat_completion import prepare_chat
    from llama.api.completion import prepare_completion
    completion = set(inspect.signature(prepare_completion).parameters) | {"stream"}
    assert set(compat.COMPLETION_ARGS) <= completion
    chat = set(inspect.signature(prepare_chat).parameters) | {"stream"}
    assert set(compat.CHAT_ARGS) <= chat


def test_generate_yields_the_greedy_tokens_and_stops_on_criteria(smol):
    ids = smol.tokenize(PROMPT.encode())
    greedy = smol(PROMPT, max_tokens=6, temperature=0.0, logprobs=0)["choices"][0]["logprobs"]["tokens"]
    gen = smol.generate(ids, temp=0.0)
    got = [next(gen) for _ in range(6)]
    gen.close()
    assert [smol.detokenize([t]).decode() for t in got] == greedy
    seen = []

    def third(input_ids, logits):
        seen.append(len(input_ids))
        return len(seen) == 3
    assert list(smol.generate(ids, temp=0.0, stopping_criteria=StoppingCriteriaList([third]))) == got[:2]
    assert seen == [len(ids), len(ids) + 1, len(ids) + 2]
    eos = smol.token_eos()
    forced = LogitsProcessorList([MinTokensLogitsProcessor(0, eos), lambda i, s: np.where(
        np.arange(len(s)) == eos, 0.0, -np.inf).astype(np.float32)])
    gen = smol.generate(ids, temp=0.0, logits_processor=forced)
    assert [next(gen), next(gen)] == [eos, eos]   # end-of-generation tokens are yielded, the caller stops
    gen.close()


def test_min_tokens_processor_holds_eos_back(smol):
    eos = smol.token_eos()
    scores = np.zeros(smol.n_vocab(), dtype=np.float32)
    proc = MinTokensLogitsProcessor(2, eos)
    assert proc(np.arange(5), scores.copy())[eos] == -np.inf
    assert proc(np.arange(6), scores.copy())[eos] == -np.inf
    assert proc(np.arange(7), scores.copy())[eos] == 0.0


def test_tokenizer_and_static_helpers(smol):
    tok = smol.tokenizer()
    assert isinstance(tok, LlamaTokenizer)
    text = "Héllo <|im_end|> wörld"
    assert tok.encode(text) == smol.tokenize(text.encode(), special=True)
    assert tok.decode(tok.encode(text, add_bos=False)) == "Héllo  wörld"
    assert smol.pooling_type() == 0
    assert smol.chat_format == "chat_template.default"   # llama-cpp-python's name for the file's template
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 50)).astype(np.float32) * 4
    lp = Llama.logits_to_logprobs(logits)
    assert lp.dtype == np.float32
    np.testing.assert_allclose(lp, [log_softmax(r) for r in logits], atol=1e-5)
    assert Llama.longest_token_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 == smol.longest_token_prefix([1, 2], [1, 2])
    assert LLAMA_DEFAULT_SEED == 0xFFFFFFFF


def test_missing_model_is_a_value_error_too():
    with pytest.raises(ValueError, match="no such file"):
        Llama("/no/such/model.gguf", verbose=False)
    with pytest.raises(FileNotFoundError):
        Llama("/no/such/model.gguf", verbose=False)


def test_attention_type_default_is_accepted(smollm2_path):
    llm = Llama(str(smollm2_path), vocab_only=True, attention_type=-1, verbose=False)
    assert llm.n_vocab() == 49152
    with pytest.raises(ValueError, match="attention_type"):
        Llama(str(smollm2_path), vocab_only=True, attention_type=1, verbose=False)


def test_n_tokens_rewinds_before_eval(smol):
    """llama-cpp-python's idiom: `llm.n_tokens = k; llm.eval(rest)` continues from the first
    k tokens, with the logits a fresh decode of those tokens gives."""
    ids = smol.tokenize(b"The capital of France is Paris. The capital of Italy is")
    smol.reset()
    smol.eval(ids)
    direct = smol.scores.copy()
    smol.eval(smol.tokenize(b" Rome", add_bos=False))
    smol.n_tokens = len(ids) - 2
    assert smol.n_tokens == len(ids) - 2 and list(smol.input_ids) == ids[:-2]
    smol.eval(ids[-2:])
    np.testing.assert_allclose(smol.scores, direct, atol=1e-3)
    with pytest.raises(ValueError, match="rewind"):
        smol.n_tokens = len(ids) + 5


def test_ram_cache_restores_an_earlier_conversation(smol):
    """With set_cache, a prompt that continues a conversation older than the last one starts
    from its stored state: only the new tokens are decoded, and the text is the same."""
    from llama import LlamaCache, LlamaRAMCache
    assert LlamaCache is LlamaRAMCache
    a = "The capital of France is Paris. The capital of Germany is"
    b = "Once upon a time, in a land far away, there lived a"
    plain = [_text(smol(p, max_tokens=4, temperature=0)) for p in (a, b, a + " Berlin. The capital of Spain is")]
    smol.set_cache(LlamaRAMCache(capacity_bytes=1 << 30))
    try:
        smol.reset()
        first = _text(smol(a, max_tokens=4, temperature=0))
        _text(smol(b, max_tokens=4, temperature=0))
        assert len(smol.cache.states) == 2
        new = smol.tokenize((a + " Berlin. The capital of Spain is").encode())
        stored_a = next(k for k in smol.cache.states if compat.longest_token_prefix(k, new) > 10)
        n_shared = compat.longest_token_prefix(stored_a, new)
        assert n_shared > len(smol.tokenize(a.encode())) - 1
        before = smol.engine.n_prompt_decoded
        third = _text(smol(a + " Berlin. The capital of Spain is", max_tokens=4, temperature=0))
        assert smol.engine.n_prompt_decoded - before == len(new) - n_shared
        assert [first, third] == [plain[0], plain[2]]
        state = smol.cache[smol.tokenize(a.encode())]
        assert state.n_tokens == len(state.input_ids) > 0
        small = LlamaRAMCache(capacity_bytes=state.llama_state_size)   # room for one state
        small[[1, 2]], small[[3, 4]] = state, state
        assert list(small.states) == [(3, 4)] and [1, 2, 9] not in small
    finally:
        smol.set_cache(None)


def test_a_llama_pickles_as_its_arguments(smollm2_path):
    import pickle
    llm = Llama(str(smollm2_path), n_ctx=256, n_threads=1, verbose=False, seed=7)
    copy = pickle.loads(pickle.dumps(llm))
    assert copy.n_ctx() == 256 and copy._init_args == llm._init_args
    assert _text(copy(PROMPT, max_tokens=4, temperature=0)) == _text(llm(PROMPT, max_tokens=4, temperature=0))
