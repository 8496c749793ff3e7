"""`ggmlpy graph`: dump the compute graph of one ubatch (text table, JSON or Graphviz DOT).

The graph is built by a real `Context` (reference backend), exactly as `decode` builds it,
so the dump shows what runs. Sizes are symbolic (n_tokens, n_kv, n_outputs): `--ubatch`
only chooses the tokens class, 1 for the "single" (one-token decode) graph and anything
larger for the "multi" (prompt) graph. `--n-ctx` sets the KV cache size seen in the cache
tensors' shapes.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from ggmlpy.cli.run_cmd import DEFAULT_N_CTX, add_model_arg
from ggmlpy.ir import dump
from ggmlpy.ir.graph import Graph
from llama.context import Context
from llama.graph_inputs import GraphParams
from llama.model import Model

FORMATS = ("txt", "json", "dot")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "graph", help="dump the compute graph of one ubatch",
        description="Dump the graph one ubatch runs: every node with op, type, shape, name, "
                    "sources, flags (W weight, I input, C cache, O output) and op params.")
    add_model_arg(p)
    p.add_argument("--ubatch", type=int, default=512,
                   help="tokens in the ubatch: 1 gives the one-token decode graph, more the "
                        "prompt graph (default 512)")
    p.add_argument("-c", "--n-ctx", type=int, default=DEFAULT_N_CTX,
                   help=f"context size, the KV cache's cell count (default {DEFAULT_N_CTX})")
    p.add_argument("--format", choices=FORMATS, default="txt", help="output format (default txt)")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=run)


def build_ubatch_graph(model: Model, n_tokens: int, n_ctx: int) -> tuple[Graph, int]:
    """The graph `decode` builds for a ubatch of n_tokens tokens, and the context size it
    was built for (n_ctx rounded up to 256 as the Context does)."""
    if n_tokens < 1:
        raise ValueError(f"--ubatch must be at least 1, got {n_tokens}")
    ctx = Context(model, n_ctx=n_ctx, n_batch=n_tokens, n_ubatch=1, backend="ref")
    if n_tokens > ctx.n_ctx:
        raise ValueError(f"--ubatch {n_tokens} exceeds the context size {ctx.n_ctx}")
    params = GraphParams("single" if n_tokens == 1 else "multi", False, ctx.n_ctx)
    return ctx.build_graph(params).graph, ctx.n_ctx


def render(graph: Graph, fmt: str, title: str) -> str:
    if fmt == "json":
        return dump.to_json(graph) + "\n"
    if fmt == "dot":
        return dump.to_dot(graph, title)
    return f"# {title}\n" + dump.to_text(graph)


def run(args: argparse.Namespace) -> int:
    model = Model.load(args.model)
    graph, n_ctx = build_ubatch_graph(model, args.ubatch, args.n_ctx)
    kind = "single" if args.ubatch == 1 else "multi"
    title = f"{model.path.name}: ubatch {args.ubatch} ({kind}), n_ctx {n_ctx}"
    text = render(graph, args.format, title)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {args.output}: {dump.summary_line(graph)}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
