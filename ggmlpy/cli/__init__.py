"""The `ggmlpy` command line. Each subcommand is a module here with `register(subparsers)`."""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module under ggmlpy.cli that defines it
COMMANDS = {
    "inspect": "ggmlpy.cli.inspect_cmd",
    "bench": "ggmlpy.cli.bench_cmd",
    "run": "ggmlpy.cli.run_cmd",
    "chat": "ggmlpy.cli.chat_cmd",
    "tokenize": "ggmlpy.cli.tokenize_cmd",
    "graph": "ggmlpy.cli.graph_cmd",
    "serve": "ggmlpy.cli.serve_cmd",
    "viz": "ggmlpy.cli.viz_cmd",
    "quantize": "ggmlpy.cli.quantize_cmd",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ggmlpy", description="Run and inspect GGUF models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMANDS.values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:   # llama-server's spellings, and its flags ggmlpy lacks refused by name
        from ggmlpy.cli.server_flags import preprocess
        argv = argv[:1] + preprocess(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (OSError, ValueError) as e:
        # bad files and bad arguments are the user's to fix: one clear line, no traceback
        print(f"ggmlpy {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
