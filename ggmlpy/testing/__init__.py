"""Test harnesses and fixtures shared by tests/ and bench/.

They live in their own package, apart from the IR and the runtime, because they depend on
everything (the op harness drives `ggmlpy.sched`, the model writers the GGUF writer and the
quantizers) while nothing in the engine may depend on them:

- `ggmlpy.testing.ops`: registry op cases as one-op graphs, run on any backend and compared.
- `ggmlpy.testing.models`: a tiny llama GGUF writer with a byte-level BPE vocabulary.
- `ggmlpy.testing.models_archs`: tiny GGUF writers for every registered architecture.
"""
