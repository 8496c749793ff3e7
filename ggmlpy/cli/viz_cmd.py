"""`ggmlpy viz`: the compiler's view of one ubatch as an offline HTML page (graph collapsed by
layer and fusion group, backends, splits, copies, buffer plan, generated code, pass diffs,
profile), or as Model Explorer JSON, a Chrome/Perfetto trace, or the `ggmlpy graph` dumps.

Nothing runs unless --profile (or --format trace, which needs one) asks for it: the graph is
built, optimised and scheduled as a Context would, and the code is generated without being
compiled. A CUDA placement works without a GPU (the CUDA backend's dry-run driver).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from ggmlpy.cli.graph_cmd import render as render_dump
from ggmlpy.cli.placement_args import add_placement_args, placement_kwargs
from ggmlpy.cli.run_cmd import DEFAULT_N_CTX, add_model_arg

FORMATS = ("html", "model-explorer", "trace", "txt", "json", "dot")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "viz", help="visualise one ubatch's graph, schedule, buffers and code (HTML page)",
        description="Write one self-contained HTML page (works from file://) showing the graph of "
                    "one ubatch, its backends, splits, copies, buffer plan, generated code and the "
                    "pass pipeline; or export it for Model Explorer or as a Perfetto trace.")
    add_model_arg(p)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--ubatch", type=int, default=None,
                      help="tokens in the ubatch: 1 is the decode graph, more the prompt graph "
                           "(default 512; 1 for --format trace)")
    size.add_argument("--decode", action="store_true", help="the one-token decode graph (--ubatch 1)")
    p.add_argument("-c", "--n-ctx", type=int, default=DEFAULT_N_CTX,
                   help=f"context size (default {DEFAULT_N_CTX})")
    p.add_argument("--format", choices=FORMATS, default="html", help="what to write (default html)")
    p.add_argument("-o", "--output", metavar="FILE", required=True, help="the file to write")
    p.add_argument("--profile", action="store_true",
                   help="run the model with profiling on (as GGMLPY_PROFILE=1) and show time per node (CPU backend)")
    p.add_argument("--steps", type=int, default=16, help="decode steps profiled (default 16)")
    p.add_argument("-t", "--threads", type=int, default=2, help="threads for --profile (default 2)")
    p.add_argument("--no-code", action="store_true", help="leave out the generated code (smaller, faster)")
    p.add_argument("--serve", type=int, nargs="?", const=0, default=None, metavar="PORT",
                   help="then serve the page on 127.0.0.1 (any free port unless given) until Ctrl-C")
    add_placement_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ggmlpy.viz import model_explorer, page, trace
    from ggmlpy.viz.snapshot import Snapshot

    profile = args.profile or args.format == "trace"
    n_tokens = 1 if args.decode else args.ubatch if args.ubatch is not None else (1 if args.format == "trace" else 512)
    if n_tokens < 1:
        raise ValueError(f"--ubatch must be at least 1, got {n_tokens}")
    snap: Snapshot = _profiled(args, n_tokens) if profile else _static(args, n_tokens)
    out = args.output
    if args.format == "html":
        size = page.write_page(snap, out)
        print(f"wrote {out}: {size / (1 << 20):.2f} MiB, {len(snap.graph.nodes)} nodes, "
              f"{len(snap.schedule.splits)} splits, {len(snap.kernels.kernels)} kernels", file=sys.stderr)
    elif args.format == "model-explorer":
        _write_json(out, model_explorer.graph_collection(snap))
        data = model_explorer.node_data(snap)
        if data is not None:
            _write_json(node_data_path(out), data)
            print(f"wrote {node_data_path(out)} (profile times as node data)", file=sys.stderr)
    elif args.format == "trace":
        _write_json(out, trace.trace_events(snap))
    else:
        text = render_dump(snap.graph, args.format, snap.title, snap.schedule)
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
    if args.format != "html":
        print(f"wrote {out}", file=sys.stderr)
    if args.serve is not None:
        from ggmlpy.viz.serve import serve

        serve(out, args.serve)
    return 0


def node_data_path(path: str) -> str:
    """Where the Model Explorer node data goes beside the graph JSON: graph.json -> graph.nodedata.json."""
    root, ext = os.path.splitext(path)
    return f"{root}.nodedata{ext or '.json'}"


def _write_json(path: str, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, separators=(",", ":"))


def _title(model_name: str, n_tokens: int, n_ctx: int, where: dict[str, Any]) -> str:
    kind = "decode" if n_tokens == 1 else "prompt"
    title = f"{model_name}: ubatch {n_tokens} ({kind}), n_ctx {n_ctx}"
    if where["devices"]:
        title += f", devices {','.join(where['devices'])}, ngl {where['n_gpu_layers']}"
    return title


def _static(args: argparse.Namespace, n_tokens: int):
    """The snapshot of the graph as built and scheduled, nothing run."""
    from ggmlpy.cli.viz_model import build_graph, place
    from ggmlpy.viz.snapshot import take_snapshot
    from llama.model import Model

    model = Model.load(args.model, repack=args.repack)
    where = placement_kwargs(args)
    graph, n_ctx = build_graph(model, n_tokens, args.n_ctx)
    placement, backends = place(model, **where)
    return take_snapshot(model.path.name, graph, n_tokens, n_ctx, backends, placement, code=not args.no_code,
                         title=_title(model.path.name, n_tokens, n_ctx, where))


def _profiled(args: argparse.Namespace, n_tokens: int):
    """The snapshot of a Context's own graph after a profiled run: the context's backends are
    made with profiling on (backend_options), the rest of the environment's settings kept."""
    from ggmlpy.cli.viz_model import profile_context
    from ggmlpy.options import Options
    from ggmlpy.viz.snapshot import take_snapshot
    from llama.context import Context
    from llama.model import Model

    where = placement_kwargs(args)
    model = Model.load(args.model, repack=args.repack, **where)
    ctx = Context(model, n_ctx=args.n_ctx, n_batch=max(n_tokens, 16), n_ubatch=max(n_tokens, 16),
                  n_threads=args.threads, backend_options=dataclasses.replace(Options.from_env(), profile=True))
    if n_tokens > 1 and n_tokens != ctx.n_ubatch:
        raise ValueError(f"--ubatch {n_tokens} exceeds the context size {ctx.n_ctx}")
    graph, prof = profile_context(ctx, n_tokens, args.steps)
    snap = take_snapshot(model.path.name, graph, n_tokens, ctx.n_ctx, ctx.backends,
                         model.placement, code=not args.no_code,
                         title=_title(model.path.name, n_tokens, ctx.n_ctx, where) + ", profiled")
    if snap.graph.signature() != prof.signature:
        raise RuntimeError("the replayed pipeline's graph differs from the compiled one; "
                           "profile times cannot be attached")
    snap.profile = prof
    return snap
