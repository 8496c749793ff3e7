"""Speculative decoding: a cheap guess of the next tokens, checked by one decode of them all.

A *drafter* proposes the tokens it expects after a sequence's history (`drafters.py`:
llama-cpp-python's prompt lookup, llama.cpp's `ngram-simple`, any callable; `draft_model.py`:
a smaller model of the same vocabulary, llama.cpp's `draft-simple`; `mtp.py`: Gemma 4's
assistant continuing from the target's hidden state and cache, llama.cpp's `draft-mtp`).
`DraftFile` and `MtpDraft` name a drafter that is made once its target exists
(`Llama(draft_model=...)`). The caller decodes the
pending token and the draft in one batch, with logits for every position, and `accept`
samples those rows in turn with the sequence's own sampler chain while the samples agree
with the draft. Every token is therefore the one the sequence would have sampled without a
draft (the same sampler, grammar and seed, fed the same logits up to the batch's rounding);
a draft only decides how many of them one decode yields. The rejected guesses leave the
cache (`Engine.settle_draft`); a recurrent state, which cannot drop tokens, goes back to
the copy taken before the draft and decodes the kept tokens again, as llama-server does
with its checkpoints.
"""
from llama.speculative.accept import accept, draft_budget
from llama.speculative.drafters import (CallableDrafter, Drafter, FirstOf, LlamaDraftModel,
                                        LlamaPromptLookupDecoding, NgramSimple, TargetDraft, as_drafter)

__all__ = ["accept", "draft_budget", "Drafter", "CallableDrafter", "FirstOf", "LlamaDraftModel",
           "LlamaPromptLookupDecoding", "NgramSimple", "TargetDraft", "as_drafter"]
