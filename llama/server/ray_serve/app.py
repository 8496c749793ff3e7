"""Replicas of `ggmlpy serve` behind one endpoint on Ray Serve (docs/distributed.md).

    from ray import serve
    from llama.server import ServerConfig
    from llama.server.ray_serve.app import build_app

    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    serve.run(build_app(ServerConfig(model="smollm2-135m", parallel=4), num_replicas=2),
              name="ggmlpy", route_prefix="/")

or `serve run llama.server.ray_serve.app:app_builder model=smollm2-135m replicas=2`,
or `ggmlpy serve --ray --replicas 2 -m smollm2-135m`. Two deployments: `GgmlpyIngress`
(one replica, no CPU reserved: it only relays) and `GgmlpyEngine` (each replica a whole
`ggmlpy serve`: model, scheduler, `parallel` slots), routed by prefix affinity.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from llama.server.ray_serve.engine import EngineReplica
from llama.server.ray_serve.ingress import create_ingress_app
from llama.server.ray_serve.router import PrefixAffinityRouter
from llama.server.config import ServerConfig

ENGINE, INGRESS = "GgmlpyEngine", "GgmlpyIngress"
# Serve's own knobs for replicas that relay many small stream items (a subset of what
# RAY_SERVE_THROUGHPUT_OPTIMIZED sets, without its direct ingress): user code and the
# handles' router on the replica's event loop instead of one more thread each, so a
# streamed token crosses no extra thread in the ingress or the engine.
REPLICA_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
               "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}
QUIET = {"enable_access_log": False}  # a log line per request and per internal call


@serve.ingress()
class Ingress:
    """The HTTP front (ingress.py); its FastAPI app is built on the replica."""

    def __init__(self, engine: DeploymentHandle, config: ServerConfig):
        self.engine, self.config = engine, config

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_ingress_app(self.engine, self.config)


def build_app(config: ServerConfig, *, num_replicas: int = 1,
              autoscaling: dict[str, Any] | None = None, replica_cpus: float | None = None,
              replica_gpus: float = 0, router_options: dict[str, Any] | None = None
              ) -> Application:
    """The Serve application: `num_replicas` engines (or Serve's `autoscaling_config`,
    passed through: min_replicas, max_replicas, initial_replicas,
    target_ongoing_requests, ...).

    Each engine reserves `replica_cpus` CPUs (default: its threads, or 1) so Ray places
    replicas where their threads can run. An engine takes up to `parallel + max_queue`
    requests at once, as `ggmlpy serve` does; past that its scheduler answers 503."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
    if autoscaling is not None:
        if not isinstance(autoscaling, dict):
            raise ValueError("autoscaling must be a dict of Serve's autoscaling_config fields")
        lo, hi = autoscaling.get("min_replicas", 1), autoscaling.get("max_replicas", 1)
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi and hi >= 1):
            raise ValueError(f"autoscaling needs 0 <= min_replicas <= max_replicas, 1 <= "
                             f"max_replicas; got {lo} and {hi}")
        # the scheduler keeps `parallel` slots busy: scale out when they all are
        autoscaling = {"target_ongoing_requests": config.parallel, **autoscaling}
    per_engine = config.parallel + config.max_queue
    n_max = autoscaling.get("max_replicas", 1) if autoscaling else num_replicas
    cpus = replica_cpus if replica_cpus is not None else float(config.threads or 1)
    engine = serve.deployment(EngineReplica).options(
        name=ENGINE, num_replicas="auto" if autoscaling else num_replicas,
        autoscaling_config=autoscaling, max_ongoing_requests=per_engine + 4,
        ray_actor_options={"num_cpus": cpus, "num_gpus": replica_gpus,
                           "runtime_env": {"env_vars": REPLICA_ENV}}, logging_config=QUIET,
        health_check_period_s=10, graceful_shutdown_timeout_s=config.timeout_graceful_shutdown,
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"slots": config.parallel, **(router_options or {})}))
    ingress = serve.deployment(Ingress).options(
        name=INGRESS, num_replicas=1, max_ongoing_requests=per_engine * n_max + 16,
        ray_actor_options={"num_cpus": 0, "runtime_env": {"env_vars": REPLICA_ENV}},
        logging_config=QUIET)
    return ingress.bind(engine.bind(config), config)


def app_builder(args: dict[str, str]) -> Application:
    """For `serve run llama.server.ray_serve.app:app_builder model=... replicas=2`:
    ServerConfig's fields by name, plus `replicas`, `autoscaling` (JSON), `replica_cpus`."""
    args = dict(args)
    replicas = int(args.pop("replicas", 1))
    autoscaling = json.loads(args.pop("autoscaling")) if "autoscaling" in args else None
    cpus = float(args.pop("replica_cpus")) if "replica_cpus" in args else None
    return build_app(config_from_strings(args), num_replicas=replicas, autoscaling=autoscaling,
                     replica_cpus=cpus)


def config_from_strings(args: dict[str, str]) -> ServerConfig:
    """A ServerConfig from `serve run`'s key=value strings, each read as its field's type
    (lists comma-separated)."""
    fields = {f.name: f for f in dataclasses.fields(ServerConfig)}
    unknown = sorted(set(args) - set(fields))
    if unknown:
        raise ValueError(f"unknown arguments {unknown}; known: {sorted(fields)}")
    kwargs: dict[str, Any] = {}
    for name, value in args.items():
        kind = str(fields[name].type)  # a string: this module's annotations are postponed
        if kind.startswith("bool"):
            kwargs[name] = value.lower() in ("1", "true", "yes", "on")
        elif kind.startswith("int"):
            kwargs[name] = int(value)
        elif kind.startswith("float"):
            kwargs[name] = float(value)
        elif kind.startswith("list[float]"):
            kwargs[name] = [float(v) for v in value.split(",") if v]
        elif kind.startswith("list"):
            kwargs[name] = [v for v in value.split(",") if v]
        else:
            kwargs[name] = value
    return ServerConfig(**kwargs)
