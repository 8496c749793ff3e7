"""Chat templates: a model's jinja template rendered in jinja2's sandbox exactly as Hugging
Face transformers renders it, llama.cpp's built-in named formats as small templates of the
same kind, llama.cpp's format detection, and the rule that picks a model's template."""
from llama.chat.builtin import BUILTIN_FORMATS, builtin_template
from llama.chat.detect import detect_format
from llama.chat.errors import ChatTemplateError
from llama.chat.select import select_template
from llama.chat.template import ChatTemplate

__all__ = ["BUILTIN_FORMATS", "ChatTemplate", "ChatTemplateError", "builtin_template", "detect_format",
           "select_template"]
