"""GGUF files: a strict zero-copy reader, a writer, and the format's constants."""
from ggmlpy.gguf.constants import GGUFValueType
from ggmlpy.gguf.errors import GGUFError
from ggmlpy.gguf.file import GGUFFile, split_path
from ggmlpy.gguf.reader import GGUFField, TensorInfo
from ggmlpy.gguf.strings import StringArray
from ggmlpy.gguf.writer import GGUFWriter
from ggmlpy.ir.types import GGMLType

__all__ = ["GGMLType", "GGUFError", "GGUFField", "GGUFFile", "GGUFValueType", "GGUFWriter", "StringArray",
           "TensorInfo", "split_path"]
