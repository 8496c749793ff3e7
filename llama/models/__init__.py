"""One file per architecture; importing this package registers them all."""
from llama.models import llama  # noqa: F401
