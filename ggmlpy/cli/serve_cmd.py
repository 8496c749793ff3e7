"""`ggmlpy serve`: the OpenAI-compatible server with continuous batching (llama/server).

The flags are llama-server's, by the same names and meanings, for what ggmlpy implements;
an unknown flag is an error naming it. ggmlpy adds --max-queue, --body-limit and
--backend, and `--ray` with its flags: replicas of the server on Ray
Serve behind one endpoint (ggmlpy/distributed, docs/distributed.md).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ggmlpy.cli.cache_args import add_cache_type_args
from ggmlpy.cli.lora_args import add_lora_args
from ggmlpy.cli.placement_args import add_placement_args, load_kwargs
from ggmlpy.cli.speculative_args import add_speculative_args, spec_type_names


def _on_off(value: str) -> str:
    v = value.lower()
    if v not in ("on", "off", "auto"):
        raise argparse.ArgumentTypeError(f"expected on, off or auto, got {value!r}")
    return v


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="serve a model over HTTP (OpenAI API, llama-server's)",
                              description="An OpenAI-compatible HTTP server with continuous "
                              "batching over parallel slots.", allow_abbrev=False)
    a = p.add_argument
    a("-m", "--model", required=True, help="a GGUF file or a known model name")
    a("--host", default="127.0.0.1", help="address(es) to listen on, comma-separated (default 127.0.0.1)")
    a("--port", type=int, default=8080, help="port to listen on (default 8080)")
    a("-c", "--ctx-size", type=int, default=4096,
      help="total context, shared by the slots (default 4096; 0 = the model's)")
    a("-np", "--parallel", type=int, default=1, help="number of slots (default 1)")
    a("-t", "--threads", type=int, default=None, help="threads (default: every CPU)")
    a("-b", "--batch-size", type=int, default=2048, help="logical batch size (default 2048)")
    a("-ub", "--ubatch-size", type=int, default=512, help="physical batch size (default 512)")
    a("--api-key", action="append", default=[], help="an API key (repeatable, or comma-separated)")
    a("--api-key-file", type=Path, default=None, help="a file with one API key per line")
    a("--alias", default=None, help="the model's names the API reports, comma-separated")
    a("--tags", default=None, help="the model's tags, comma-separated (listed by /v1/models)")
    a("-v", "--verbose", action="store_true", help="log at debug level")
    a("-n", "--n-predict", type=int, default=-1, help="default max tokens; -1 = up to the context")
    a("-s", "--seed", type=int, default=-1, help="default sampling seed; -1 = random")
    a("--temp", type=float, default=0.8, help="default temperature (default 0.8)")
    a("--embedding", "--embeddings", dest="embedding", action="store_true",
      help="serve embeddings only")
    a("--pooling", choices=["none", "mean", "cls", "last", "rank"], default=None)
    a("--reranking", "--rerank", dest="reranking", action="store_true",
      help="serve /rerank: embeddings with rank pooling (the score is the pooled state's first value)")
    a("--metrics", action="store_true", help="enable the Prometheus /metrics endpoint")
    a("--slots", dest="slots", action="store_true", default=True, help="enable /slots (default)")
    a("--no-slots", dest="slots", action="store_false", help="disable /slots")
    a("--props", action="store_true", help="enable POST /props (llama-server's: it changes no property yet)")
    a("--jinja", dest="jinja", action="store_true", default=True,
      help="use the jinja chat template (default; ggmlpy's templates are all jinja)")
    a("--no-jinja", dest="jinja", action="store_false")
    a("--chat-template", default=None, help="a built-in template name (chatml, llama3, ...)")
    a("--chat-template-file", type=Path, default=None, help="a jinja chat template file")
    a("--chat-template-kwargs", default=None, metavar="JSON",
      help="extra variables for the chat template, a JSON object (e.g. '{\"enable_thinking\": false}')")
    a("-rea", "--reasoning", type=_on_off, default="auto",
      help="thinking in chats: on, off or auto (default: where the template shows it)")
    a("--reasoning-budget", type=int, default=-1,
      help="reasoning tokens before the end of thinking is forced (-1: unlimited, 0: none)")
    a("--reasoning-budget-message", default=None,
      help="text forced before the end of thinking when the budget runs out")
    a("--reasoning-format", default="auto", choices=["auto", "deepseek", "deepseek-legacy", "none"],
      help="how reasoning is returned: auto/deepseek (message.reasoning_content), deepseek-legacy "
      "(also left in content), none (left in content)")
    a("--context-shift", dest="context_shift", action="store_true", default=False)
    a("--no-context-shift", dest="context_shift", action="store_false")
    a("--spm-infill", action="store_true",
      help="/infill prompts in Suffix/Prefix/Middle order (default: Prefix/Suffix/Middle)")
    a("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", dest="ctx_checkpoints", type=int, default=32,
      help="context checkpoints kept per slot where the memory cannot drop tokens (recurrent models)")
    a("--cache-reuse", type=int, default=0,
      help="least chunk of cached tokens to move by KV shifting instead of decoding again (default 0, off)")
    a("--sse-ping-interval", type=int, default=30,
      help="seconds a stream may stay silent before an SSE ping (-1: never; default 30)")
    a("--slot-save-path", default=None, help="directory for /slots save and restore")
    a("-cb", "--cont-batching", dest="cont_batching", action="store_true", default=True)
    a("-nocb", "--no-cont-batching", dest="cont_batching", action="store_false")
    a("-fa", "--flash-attn", type=_on_off, default="auto", help="on, off or auto")
    add_cache_type_args(p)
    a("-kvu", "--kv-unified", action="store_true",
      help="every slot may fill the whole context, the slots sharing the cache (default: each its share)")
    a("--swa-full", action="store_true", help="full-size cache for sliding-window layers")
    a("--offline", action="store_true", help="never download (ggmlpy never does)")
    a("--no-webui", "--no-ui", dest="no_webui", action="store_true",
      help="no chat page at / (default: served, public, its API calls carrying --api-key's key)")
    a("--sleep-idle-seconds", type=float, default=-1,
      help="unload the model after this many seconds without a request (-1: never; default)")
    add_speculative_args(p)
    a("--max-queue", type=int, default=64, help="requests that may wait for a slot (ggmlpy)")
    a("--body-limit", type=int, default=8 << 20, help="largest request body in bytes (ggmlpy)")
    a("--cors-origins", default=None,
      help="allowed CORS origins: * (default: any, reflected; localhost with tools), localhost, or a list")
    a("--cors-methods", default="GET, POST, DELETE, OPTIONS", help="CORS preflight's allowed methods")
    a("--cors-headers", default="*", help="CORS preflight's allowed headers")
    a("--backend", default=None, help="compute backend by name (ggmlpy)")
    t = p.add_argument_group("tools for agents (POST /tools; never on an untrusted network)")
    t.add_argument("--tools", default=None, metavar="TOOL1,TOOL2",
                   help="built-in tools to serve, or all: read_file, file_glob_search, grep_search, "
                   "exec_shell_command, write_file, edit_file, ... (limits --cors-origins to localhost)")
    t.add_argument("--tools-runtime", default=None, metavar="SPEC",
                   help="where tools run: docker:<image>, docker-container:<id>, podman-..., ssh:<target>")
    t.add_argument("--mcp-servers-config", default=None, metavar="PATH",
                   help="a JSON file of MCP servers ({\"mcpServers\": {...}}) whose tools to serve")
    t.add_argument("--mcp-servers-json", default=None, metavar="JSON", help="the same, inline")
    t.add_argument("--ui-mcp-proxy", action="store_true", help="serve /cors-proxy for pages that reach MCP servers")
    add_placement_args(p)
    add_lora_args(p)
    a("--lora-init-without-apply", action="store_true",
      help="load the adapters with scale 0 (apply them with POST /lora-adapters)")
    r = p.add_argument_group("replicas on Ray Serve (pip install 'ggmlpy[ray]'; docs/distributed.md)")
    r.add_argument("--ray", action="store_true",
                   help="serve replicas of the model on Ray Serve behind one endpoint")
    r.add_argument("--replicas", type=int, default=None, help="engine replicas (default 1)")
    r.add_argument("--autoscaling-min", type=int, default=None,
                   help="autoscale the replicas: at least this many")
    r.add_argument("--autoscaling-max", type=int, default=None,
                   help="autoscale the replicas: at most this many")
    r.add_argument("--autoscaling-config", default=None, metavar="JSON",
                   help="Serve's autoscaling_config as a JSON object (target_ongoing_requests, "
                   "upscale_delay_s, ...); --autoscaling-min/max override its replica bounds")
    r.add_argument("--ray-address", default=None,
                   help="join this Ray cluster (auto, or HOST:PORT); default: a new local one "
                   "on 127.0.0.1")
    r.add_argument("--replica-cpus", type=float, default=None,
                   help="CPUs Ray reserves per replica (default: --threads, or 1)")
    p.set_defaults(func=run)


RAY_FLAGS = ("replicas", "autoscaling_min", "autoscaling_max", "autoscaling_config",
             "ray_address", "replica_cpus")


def json_object_flag(flag: str, value: str | None) -> dict | None:
    """A flag whose value is a JSON object, parsed (None when not given)."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{flag} must be a JSON object")
    return parsed


def ray_options_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The `--ray` settings for llama.server.ray_serve.run.main, or None without --ray."""
    if not args.ray:
        given = [f"--{name.replace('_', '-')}" for name in RAY_FLAGS if getattr(args, name) is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: only with --ray")
        return None
    replicas = 1 if args.replicas is None else args.replicas
    if replicas < 1:
        raise ValueError(f"--replicas must be at least 1, got {replicas}")
    autoscaling = json_object_flag("--autoscaling-config", args.autoscaling_config)
    if args.autoscaling_min is not None or args.autoscaling_max is not None:
        autoscaling = dict(autoscaling or {})
        if args.autoscaling_min is not None:
            autoscaling["min_replicas"] = args.autoscaling_min
        if args.autoscaling_max is not None:
            autoscaling["max_replicas"] = args.autoscaling_max
    if autoscaling is not None and args.replicas is not None:
        raise ValueError("--replicas is fixed; autoscaling takes --autoscaling-min/max instead")
    return {"replicas": replicas, "autoscaling": autoscaling, "address": args.ray_address,
            "replica_cpus": args.replica_cpus}


def config_from_args(args: argparse.Namespace):
    from llama.server.config import ServerConfig
    keys = [k for arg in args.api_key for k in arg.split(",") if k]
    if args.api_key_file is not None:
        keys += [line.strip() for line in args.api_key_file.read_text().splitlines() if line.strip()]
    if args.parallel < 1:
        raise ValueError(f"--parallel must be at least 1, got {args.parallel}")
    if args.reasoning_budget < -1:
        raise ValueError(f"--reasoning-budget must be -1 (unlimited) or a number of tokens, got {args.reasoning_budget}")
    where = load_kwargs(args)
    template = args.chat_template
    if args.chat_template_file is not None:
        template = args.chat_template_file.read_text(encoding="utf-8")
    from llama.server.gcp import VertexRoutes
    from llama.server.tools.mcp import load_config
    tools = [n.strip() for n in (args.tools or "").split(",") if n.strip()]
    mcp = load_config(args.mcp_servers_config, args.mcp_servers_json)
    cors = args.cors_origins or ("localhost" if tools or mcp else "*")   # llama-server's default
    kwargs = json_object_flag("--chat-template-kwargs", args.chat_template_kwargs) or {}
    return ServerConfig(
        model=args.model, host=args.host, port=args.port, ctx_size=args.ctx_size,
        parallel=args.parallel, threads=args.threads, batch_size=args.batch_size,
        ubatch_size=args.ubatch_size, n_gpu_layers=where["n_gpu_layers"], devices=where["devices"],
        tensor_split=where["tensor_split"], override_tensor=where["override_tensor"], repack=where["repack"],
        api_keys=keys,
        alias=args.alias, tags=args.tags, n_predict=args.n_predict, seed=args.seed, temp=args.temp,
        embedding=args.embedding or args.reranking, reranking=args.reranking,
        pooling="rank" if args.reranking else args.pooling, metrics=args.metrics, slots=args.slots,
        props=args.props, jinja=args.jinja, chat_template=template, chat_template_kwargs=kwargs,
        reasoning=args.reasoning,
        reasoning_format=args.reasoning_format, reasoning_budget=args.reasoning_budget,
        reasoning_budget_message=args.reasoning_budget_message, context_shift=args.context_shift,
        cache_reuse=args.cache_reuse, ctx_checkpoints=args.ctx_checkpoints, spm_infill=args.spm_infill,
        sse_ping_interval=args.sse_ping_interval,
        slot_save_path=args.slot_save_path, cont_batching=args.cont_batching,
        flash_attn=args.flash_attn, cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v, kv_unified=args.kv_unified, swa_full=args.swa_full,
        offline=args.offline, webui=not args.no_webui, backend=args.backend,
        max_queue=args.max_queue, body_limit=args.body_limit, cors_origins=cors,
        cors_methods=args.cors_methods, cors_headers=args.cors_headers,
        lora=args.lora, lora_init_without_apply=args.lora_init_without_apply, verbose=args.verbose,
        sleep_idle_seconds=args.sleep_idle_seconds, vertex=VertexRoutes.from_env(os.environ),
        tools=tools, tools_runtime=args.tools_runtime, mcp_servers=mcp, ui_mcp_proxy=args.ui_mcp_proxy,
        spec_type=spec_type_names(args),
        model_draft=args.model_draft, spec_draft_n_max=args.spec_draft_n_max,
        spec_draft_n_min=args.spec_draft_n_min, spec_draft_p_min=args.spec_draft_p_min,
        spec_ngram_size_n=args.spec_ngram_simple_size_n, spec_ngram_size_m=args.spec_ngram_simple_size_m)


def run(args: argparse.Namespace) -> int:
    if args.ray:
        return _run_ray(args)
    try:
        from llama.server import Server, create_app
    except ImportError as e:  # the web stack is the optional extra, not a core dependency
        print(f"ggmlpy serve: error: {e.name} is not installed; the server needs the extra: "
              "pip install 'ggmlpy[server]'", file=sys.stderr)
        return 1
    config = config_from_args(args)
    ray_options_from_args(args)  # a Ray flag without --ray is an error
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    print(f"ggmlpy serve: {config.model} on http://{config.host}:{config.port} "
          f"({config.parallel} slots)", file=sys.stderr)
    hosts = [h.strip() for h in config.host.split(",") if h.strip()]   # llama-server: several addresses
    server = Server(create_app(config), host=hosts[0], port=config.port, log_level="warning",
                    timeout_graceful_shutdown=config.timeout_graceful_shutdown)
    # uvicorn stops accepting on SIGTERM, lets running requests finish (cancelling them after
    # the grace period), then raises the signal again once it is done; with this handler in
    # place that last raise returns, and the process exits 0 instead of dying by the signal
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    server.run(sockets=[_listening_socket(h, config.port) for h in hosts] if len(hosts) > 1 else None)
    return 0


def _listening_socket(host: str, port: int):
    """A socket bound to host (IPv4 or IPv6) and port, for uvicorn to serve on."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, port))
    return sock


def _run_ray(args: argparse.Namespace) -> int:
    config, options = config_from_args(args), ray_options_from_args(args)
    from llama.server.ray_serve import run as serve_run  # imports no Ray
    if options["address"] is None:
        serve_run.keep_ray_on_loopback()  # read when Ray is imported: before the import
    try:
        import fastapi  # noqa: F401 - the ingress is a FastAPI app
        import ray.serve  # noqa: F401
    except ImportError as e:  # Ray is the optional extra, not a core dependency
        print(f"ggmlpy serve: error: {e.name} is not installed; --ray needs the extra: "
              "pip install 'ggmlpy[ray]'", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return serve_run.main(config, **options)
