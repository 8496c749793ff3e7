"""Ray Serve replicas vs `ggmlpy serve` alone, JSON out (docs/distributed.md).

Both are started by their CLI on loopback with the same total slots (`--slots`):
`ggmlpy serve -np S` alone, then `ggmlpy serve --ray` with 1 replica of S slots (the
same compute: what differs is the path through Serve's proxy, the ingress and the engine
deployment) and, with `--replicas 2`, 2 replicas of S/2 slots sharing the threads.
Each is measured with bench_server.py's client loop (streamed chat completions of
`--tokens` tokens, ignore_eos) at each client count, plus a per-request latency of
/tokenize requests (the HTTP path and the engine, no decode) and of one-token
completions. Reported: aggregate tokens/s, TTFT and inter-token
latency per setup and client count; the Serve overhead per request (median /tokenize latency
difference), per streamed token (median inter-token latency difference, one client),
and in aggregate tokens/s at the largest client count, against the 10% target.

    python bench/bench_ray_serve.py [--clients 1,4] [--tokens 128] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import run_load, start  # noqa: E402  (the same client loop)

from ggmlpy.hub import resolve_model  # noqa: E402


def request_latency_ms(url: str, path: str, body: dict, n: int) -> float:
    """Median wall time of `n` requests, one at a time."""
    times = []
    with httpx.Client(timeout=60) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            c.post(url + path, json=body).raise_for_status()
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(name: str, cmd: list[str], url: str, clients: list[int], args) -> list[dict]:
    proc = start(cmd, url, timeout=600)
    rows = []
    try:
        run_load(url, max(clients), 8, 1)  # warm-up: every slot's graphs compiled
        # /tokenize runs in the engine without a decode: the path alone
        path_ms = request_latency_ms(url, "/tokenize", {"content": "Hello"}, args.requests)
        one_ms = request_latency_ms(url, "/v1/completions",
                                    {"prompt": "Hi", "max_tokens": 1, "temperature": 0},
                                    args.requests)
        for n in clients:
            row = run_load(url, n, args.tokens, args.rounds)
            row.update(setup=name, tokenize_ms_p50=path_ms, one_token_ms_p50=one_ms)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(60)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--slots", type=int, default=4, help="total slots of every setup")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="requests per client")
    ap.add_argument("--requests", type=int, default=20, help="for the per-request latency")
    ap.add_argument("--threads", type=int, default=2, help="threads in all, split by replicas")
    ap.add_argument("--ctx-per-slot", type=int, default=512)
    ap.add_argument("--no-two-replicas", action="store_true")
    args = ap.parse_args()
    model = str(resolve_model(args.model))
    clients = [int(c) for c in args.clients.split(",")]
    base = [sys.executable, "-m", "ggmlpy", "serve", "-m", model]
    setups = [("ggmlpy serve", 1, []), ("ray serve, 1 replica", 1, ["--ray", "--replicas", "1"])]
    if not args.no_two_replicas:
        setups.append(("ray serve, 2 replicas", 2, ["--ray", "--replicas", "2"]))
    out = {"model": args.model, "threads": args.threads, "tokens": args.tokens,
           "slots": args.slots, "results": []}
    port = 18380
    for name, replicas, extra in setups:
        port += 1
        slots, threads = args.slots // replicas, max(1, args.threads // replicas)
        cmd = base + ["--port", str(port), "-np", str(slots), "-t", str(threads),
                      "-c", str(args.ctx_per_slot * slots), *extra]
        for row in measure(name, cmd, f"http://127.0.0.1:{port}", clients, args):
            out["results"].append({**row, "replicas": replicas, "slots_per_replica": slots})
    by = {(r["setup"], r["clients"]): r for r in out["results"]}
    plain, serve1, top = "ggmlpy serve", "ray serve, 1 replica", max(clients)
    tps_plain, tps_serve = by[(plain, top)]["tokens_per_s"], by[(serve1, top)]["tokens_per_s"]
    out["overhead"] = {
        "per_request_ms": by[(serve1, top)]["tokenize_ms_p50"] - by[(plain, top)]["tokenize_ms_p50"],
        "per_one_token_completion_ms": (by[(serve1, top)]["one_token_ms_p50"]
                                        - by[(plain, top)]["one_token_ms_p50"]),
        "per_streamed_token_ms": (by[(serve1, min(clients))]["itl_p50_ms"]
                                  - by[(plain, min(clients))]["itl_p50_ms"]),
        f"tokens_per_s_loss_pct_at_{top}_clients": 100 * (1 - tps_serve / tps_plain),
    }
    out["target_met"] = tps_serve >= 0.9 * tps_plain
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
