"""The llama.cpp-like runtime: model loading, vocab, KV cache, batches, decode, sampling.

    import llama
    model = llama.Model.load("smollm2-135m")
    ctx = llama.Context(model, n_ctx=512)
    ctx.decode(llama.Batch.from_tokens(model.tokenize("Hello")))
    logits = ctx.get_logits_ith(-1)
"""
from llama.batch import Batch, BatchError
from llama.context import Context
from llama.model import LoadCancelled, Model

__all__ = ["Batch", "BatchError", "Context", "LoadCancelled", "Model"]
