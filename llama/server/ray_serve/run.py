"""`ggmlpy serve --ray`: start (or join) Ray, deploy the replicas, serve until a signal.

Without `--ray-address` a new single-machine Ray cluster starts on 127.0.0.1 only, with
no dashboard and with Ray's token authentication on. Ray runs any code sent to its ports,
and `ray.init` alone cannot keep them on loopback: it turns 127.0.0.1 into the machine's
address and its gRPC servers then listen on every interface. The switch Ray reads for
single-machine macOS/Windows installs, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, makes the
node's address 127.0.0.1, and with it every Ray server listens on loopback alone
(verified with `ss -ltnp`); it is read when Ray is imported, so `keep_ray_on_loopback`
runs first. Ray 2.60's `ray.init` turns token auth on for a new cluster (a warning says
when it is off). Serve's HTTP port follows --host (127.0.0.1 by default). With
`--ray-address` (`auto`, or HOST:PORT of a head started with `ray start --head`) it joins
that cluster, whose security is its own (docs/distributed.md).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

APP_NAME = "ggmlpy"


def keep_ray_on_loopback() -> None:
    """Before Ray is imported: a cluster started here listens on 127.0.0.1 only."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


def _exit(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def main(config, *, replicas: int, autoscaling: dict | None, address: str | None,
         replica_cpus: float | None) -> int:
    import ray
    from ray import serve

    from llama.server.ray_serve.app import REPLICA_ENV, build_app

    app = build_app(config, num_replicas=replicas, autoscaling=autoscaling,
                    replica_cpus=replica_cpus)  # bad settings fail before Ray starts
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address is None:  # the proxy and controller a new cluster starts inherit these
        for name, value in REPLICA_ENV.items():
            os.environ.setdefault(name, value)
    if address is None:
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    if os.environ.get("RAY_AUTH_MODE") != "token":  # ray.init sets it when auth is on
        print("ggmlpy serve: warning: Ray token authentication is off: whoever reaches Ray's "
              "ports can run code on this machine (docs/distributed.md, Security)",
              file=sys.stderr)
    signal.signal(signal.SIGTERM, _exit)  # after ray.init, which installs its own
    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        n = (f"{autoscaling.get('min_replicas', 1)}..{autoscaling.get('max_replicas', 1)}"
             if autoscaling else str(replicas))
        print(f"ggmlpy serve: {config.model} on http://{config.host}:{config.port} "
              f"({n} replicas x {config.parallel} slots, Ray Serve); /health is 503 until "
              "a replica has loaded", file=sys.stderr)
        serve.run(app, name=APP_NAME, route_prefix="/")
        print("ggmlpy serve: replicas ready", file=sys.stderr)
        threading.Event().wait()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        if address is None:
            serve.shutdown()
        else:  # a shared cluster: remove this application only
            serve.delete(APP_NAME)
        ray.shutdown()
    return 0
