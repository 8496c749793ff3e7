"""`ggmlpy graph`: dump the compute graph of one ubatch (text table, JSON or Graphviz DOT).

The graph is built by a real `Context` (reference backend), exactly as `decode` builds it,
so the dump shows what runs. Sizes are symbolic (n_tokens, n_kv, n_outputs): `--ubatch`
only chooses the tokens class, 1 for the "single" (one-token decode) graph and anything
larger for the "multi" (prompt) graph. `--n-ctx` sets the KV cache size seen in the cache
tensors' shapes.

`--backends` runs the scheduler over the graph (nothing is compiled): with `--devices cpu:1
-ngl 10` the model's layers are placed as `llama.Model.load(..., devices, n_gpu_layers)`
would place them, and the dump shows every tensor's backend, the splits, the copies between
them and the cause of every assignment; `--format dot` colours nodes by backend.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ggmlpy.cli.placement_args import add_placement_args, placement_kwargs
from ggmlpy.cli.run_cmd import DEFAULT_N_CTX, add_model_arg
from ggmlpy.ir import dump
from ggmlpy.ir.graph import Graph
from ggmlpy.codegen_cpu.fusion import CPU_RULES
from ggmlpy.passes.fusion import FUSION_HINT, describe_groups
from ggmlpy.passes.pipeline import PIPELINES, pass_names, pipeline_for, run_pipeline
from ggmlpy.sched.registry import host_backends
from ggmlpy.sched.scheduler import Schedule, schedule
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
    p.add_argument("--dump-after", metavar="PASS", choices=pass_names(), default=None,
                   help="show the graph after this pass of the backend's pipeline "
                        f"({', '.join(pass_names())}) instead of the graph as built")
    p.add_argument("--pipeline", default="cpu", choices=sorted(PIPELINES),
                   help="whose pass pipeline --dump-after runs (default cpu)")
    s = add_placement_args(p, "scheduling (implied by --devices, -ngl, --tensor-split)")
    s.add_argument("--backends", action="store_true",
                   help="assign backends: show each tensor's backend, the splits, the copies "
                        "between them and why every node went where it did")
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


def schedule_graph(model: Model, graph: Graph, devices: list[str] | None = None,
                   n_gpu_layers: int = 0, tensor_split: list[float] | None = None,
                   override_tensor: list[str] | None = None) -> Schedule:
    """The scheduler's decisions for graph with the model placed on devices, as a Context
    with those devices would make them: device backends, then the host CPU, then "ref"."""
    placement = model.place(devices, n_gpu_layers, tensor_split, override_tensor=override_tensor)
    backends = placement.make_backends() + host_backends("cpu")
    return schedule(graph, backends, placement)


def schedule_record(sched: Schedule) -> dict[str, Any]:
    """The splits, copies and causes as JSON values (tensors by dump key)."""
    keys = dump.tensor_keys(sched.graph)
    return {
        "backends": [b.name for b in sched.backends],
        "splits": [{"backend": s.backend.name, "nodes": [keys[n.id] for n in s.nodes],
                    "copies": [{"tensor": keys[c.tensor.id], "from": c.src_backend, "to": c.dst_backend}
                               for c in s.copies]} for s in sched.splits],
        "causes": {keys[t.id]: a.cause for t in sched.graph.tensors for a in [sched.assignment[t.id]]},
        "fallbacks": [keys[n.id] for n in sched.fallbacks],
    }


def render(graph: Graph, fmt: str, title: str, sched: Schedule | None = None) -> str:
    backends = sched.backend_of() if sched is not None else None
    if fmt == "json":
        if sched is None:
            return dump.to_json(graph) + "\n"
        record = dump.to_dict(graph, backends)
        record["schedule"] = schedule_record(sched)
        return json.dumps(record, indent=1) + "\n"
    if fmt == "dot":
        return dump.to_dot(graph, title, backends)
    text = f"# {title}\n" + dump.to_text(graph, backends)
    if sched is not None:
        text += "\n# schedule\n" + sched.describe(causes=True) + "\n"
    return text


def run(args: argparse.Namespace) -> int:
    model = Model.load(args.model, repack=args.repack)
    graph, n_ctx = build_ubatch_graph(model, args.ubatch, args.n_ctx)
    kind = "single" if args.ubatch == 1 else "multi"
    title = f"{model.path.name}: ubatch {args.ubatch} ({kind}), n_ctx {n_ctx}"
    if args.dump_after:
        if args.dump_after not in pipeline_for(args.pipeline):
            raise ValueError(f"--dump-after {args.dump_after}: the {args.pipeline} pipeline runs "
                             f"{', '.join(pipeline_for(args.pipeline))}")
        seen: list[Graph] = []  # the graph at the dump point (later passes still run)
        result = run_pipeline(graph, backend=args.pipeline, env={
            "n_tokens": args.ubatch, "n_kv": n_ctx, "n_outputs": args.ubatch, "n_kv_swa": n_ctx},
            dump_after=args.dump_after, dump=lambda text: None, rules=CPU_RULES,
            render=lambda g: seen.append(g) or "")
        graph = seen[0]
        title += f", after pass {args.dump_after} ({len(graph.nodes)} nodes)"
        if args.dump_after == "buffers" and result.plan is not None and args.format == "txt":
            title += "\n# " + result.plan.describe().strip()
    sched = None
    if args.backends or args.devices or args.n_gpu_layers is not None or args.tensor_split is not None \
            or args.override_tensor is not None:
        where = placement_kwargs(args)
        sched = schedule_graph(model, graph, **where)
        title += f", devices {','.join(where['devices'] or []) or 'none'}, ngl {where['n_gpu_layers']}"
    text = render(graph, args.format, title, sched)
    if args.format == "txt" and graph.hints.get(FUSION_HINT):
        text += "\n" + describe_groups(graph)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {args.output}: {dump.summary_line(graph)}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
