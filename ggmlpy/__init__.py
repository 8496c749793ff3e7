"""ggmlpy: a Python dataflow-graph compiler that runs GGUF models the way llama.cpp does."""

__version__ = "0.1.0"
