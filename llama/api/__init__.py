"""llama-cpp-python's high-level API (`Llama`) over ggmlpy's runtime; see llama.api.llama."""
from llama.api.llama import Llama, LlamaState

__all__ = ["Llama", "LlamaState"]
