"""The llama.cpp-like runtime: model loading, vocab, KV cache, batches, decode, sampling,
and llama-cpp-python's high-level `Llama` over them.

    import llama
    model = llama.Model.load("smollm2-135m")
    ctx = llama.Context(model, n_ctx=512)
    ctx.decode(llama.Batch.from_tokens(model.tokenize("Hello")))
    logits = ctx.get_logits_ith(-1)

    from llama import Llama
    llm = Llama("smollm2-135m")
    llm.create_chat_completion([{"role": "user", "content": "Hi"}])
"""
from llama.arch import UnsupportedModel
from llama.batch import Batch, BatchError
from llama.context import Context
from llama.model import LoadCancelled, Model

__all__ = ["Batch", "BatchError", "Context", "Llama", "LlamaGrammar", "LlamaState", "LoadCancelled",
           "Model", "LLAMA_DEFAULT_SEED", "LlamaTokenizer", "LogitsProcessorList", "MinTokensLogitsProcessor",
           "StoppingCriteriaList", "LlamaCache", "LlamaRAMCache", "UnsupportedModel"]
_COMPAT = ("LlamaTokenizer", "LogitsProcessorList", "MinTokensLogitsProcessor", "StoppingCriteriaList")


def __getattr__(name: str):
    """`Llama`, `LlamaGrammar` and llama-cpp-python's helper classes load on first use: the runtime alone (the CLI's run, the
    tests of the compiler) does not pay for jinja2 and llguidance."""
    if name in ("Llama", "LlamaState"):
        from llama.api import llama as api
        return getattr(api, name)
    if name == "LlamaGrammar":
        from llama.grammar import LlamaGrammar
        return LlamaGrammar
    if name in _COMPAT:   # llama-cpp-python's names (llama.api.compat)
        from llama.api import compat
        return getattr(compat, name)
    if name in ("LlamaCache", "LlamaRAMCache"):
        from llama.api import state_cache
        return getattr(state_cache, name)
    if name == "LLAMA_DEFAULT_SEED":
        from llama.sampling.pick import LLAMA_DEFAULT_SEED
        return LLAMA_DEFAULT_SEED
    raise AttributeError(f"module 'llama' has no attribute {name!r}")
