"""llama-server's `chat_template_caps` (its /props) for every real template in
tests/llama/chat/templates, for tests/llama/chat/test_template_caps.py: llama-server is started
on a tiny model with each template (`--jinja --chat-template-file`) and asked. Not a test and
not a dependency; rerun it with the llama-server built from the llama.cpp that
llama-cpp-python 0.3.36 vendors when the templates change:

    python -m tests.tools.template_caps PATH/llama-server > tests/llama/chat/data/template_caps.json
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from ggmlpy.testing.models import write_tiny_llama
from tests.tools.llama_server import llama_server

TEMPLATES = Path(__file__).resolve().parents[1] / "llama" / "chat" / "templates"


def main() -> None:
    server = sys.argv[1]
    out = {}
    with tempfile.TemporaryDirectory() as d:
        model = write_tiny_llama(Path(d) / "tiny.gguf")
        for path in sorted(TEMPLATES.glob("*.jinja")):
            args = ["-m", str(model), "--jinja", "--chat-template-file", str(path), "-c", "256"]
            try:
                with llama_server(server, args, timeout=60) as call:
                    status, props = call("GET", "/props")
                out[path.name] = props.get("chat_template_caps") if status == 200 else None
            except Exception as e:   # a template llama-server refuses: recorded as such
                out[path.name] = None
                print(f"{path.name}: {e}", file=sys.stderr)
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
