"""One file per architecture; importing this package registers them all."""
from llama.models import gemma3  # noqa: F401
from llama.models import llama  # noqa: F401
from llama.models import gemma  # noqa: F401
from llama.models import gemma2  # noqa: F401
from llama.models import mistral  # noqa: F401
from llama.models import phi3  # noqa: F401
from llama.models import qwen2  # noqa: F401
from llama.models import qwen3  # noqa: F401
from llama.models import qwen3moe  # noqa: F401
from llama.models import qwen2moe  # noqa: F401
from llama.models import olmoe  # noqa: F401
from llama.models import granite  # noqa: F401
from llama.models import gpt_oss  # noqa: F401
from llama.models import glm4moe  # noqa: F401
from llama.models import qwen35  # noqa: F401
from llama.models import qwen35moe  # noqa: F401
from llama.models import qwen3next  # noqa: F401
