"""Server benchmark: ggmlpy serve vs llama-server, alternated in one run, JSON out.

For each number of concurrent clients (1, 2, 4, 8), each server is started with
`-np` = clients and every client streams chat completions of exactly `--tokens` tokens
(ignore_eos). Reported per server and client count: aggregate output tokens/s, time to
first token p50/p99, inter-token latency p50/p99, and failed requests.

    python bench/bench_server.py --llama-server /tmp/llama-server-build/bin/llama-server

`--scaling N --repeats R`: instead, each server is started once with `-np N` and loads of 1
and of N clients alternate R times against it; reported per server: the aggregate tok/s of
each load and the median of the per-repeat ratios (N clients / 1 client). A neighbour that
comes and goes then weighs on both sides of a ratio alike, where the table's 1-client and
N-client rows are minutes apart. The servers run with `--metrics`, and each load's decodes
of ggmlpy are split from its `/metrics` counters: milliseconds per decode call
(`decode_ms_*`) and the slots' sampling after each decode (`sampling_ms_*`). llama-server's
counters of the same names add up the time of every slot, so they are not split.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx

from ggmlpy.hub import resolve_model

PROMPT = [{"role": "user", "content": "Write a long story about a fox who learns to sail."}]


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def start(cmd: list[str], url: str, timeout: float = 300) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.terminate()
    raise TimeoutError(f"{cmd} did not become healthy")


def counters(url: str) -> dict[str, float]:
    """The `llamacpp:*_total` counters of `/metrics` (the server runs with --metrics)."""
    out = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("llamacpp:") and name.endswith("_total"):
            out[name[len("llamacpp:"):-len("_total")]] = float(value)
    return out


def per_decode(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """ggmlpy's milliseconds per decode call between two scrapes: decoding and sampling
    (nothing for a server without ggmlpy's `sampling_seconds`)."""
    if "sampling_seconds" not in after:
        return {}
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    n = d["n_decode"] or float("nan")
    return {"decode_ms": 1e3 * (d["prompt_seconds"] + d["tokens_predicted_seconds"]) / n,
            "sampling_ms": 1e3 * d["sampling_seconds"] / n}


def one_stream(url: str, n_tokens: int, seed: int) -> dict:
    """One streamed chat completion; the arrival time of each content chunk.

    The client shares this machine's cores with the server it measures, so it is the
    standard library's http.client: httpx's `iter_lines` took 470 us of CPU per streamed
    token here, http.client 120-200 us, and what the client spends is taken from the
    server (the same for both servers)."""
    body = {"messages": PROMPT, "max_tokens": n_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0.8, "seed": seed, "cache_prompt": False}
    address = urlsplit(url)
    t0 = time.perf_counter()
    stamps = []
    conn = http.client.HTTPConnection(address.hostname, address.port, timeout=300)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        while line := r.readline():  # http.client undoes the chunked transfer encoding
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
    finally:
        conn.close()
    return {"ttft": stamps[0] - t0, "itl": [b - a for a, b in zip(stamps, stamps[1:])],
            "n": n_tokens, "t0": t0, "t1": stamps[-1]}


def run_load(url: str, clients: int, n_tokens: int, rounds: int) -> dict:
    results, failed = [], 0
    with ThreadPoolExecutor(clients) as ex:
        t0 = time.perf_counter()
        futures = [ex.submit(one_stream, url, n_tokens, i) for i in range(clients * rounds)]
        for f in futures:
            try:
                results.append(f.result())
            except Exception:
                failed += 1
        wall = time.perf_counter() - t0
    ttft = [r["ttft"] for r in results]
    itl = [x for r in results for x in r["itl"]]
    return {"clients": clients, "requests": len(results), "failed": failed,
            "tokens_per_s": sum(r["n"] for r in results) / wall,
            "ttft_p50_ms": percentile(ttft, 50) * 1e3, "ttft_p99_ms": percentile(ttft, 99) * 1e3,
            "itl_p50_ms": percentile(itl, 50) * 1e3, "itl_p99_ms": percentile(itl, 99) * 1e3}


def scaling(name: str, base: list[str], model: str, port: int, args) -> dict:
    """1 client and args.scaling clients alternated on one server with -np args.scaling."""
    n = args.scaling
    url = f"http://127.0.0.1:{port}"
    cmd = base + ["-m", model, "--port", str(port), "-np", str(n), "-t", str(args.threads),
                  "-c", str(args.ctx_per_slot * n), "--metrics"]
    proc = start(cmd, url)
    one, many = [], []
    split: dict[str, list[float]] = {}

    def load(clients: int) -> dict:
        before = counters(url)
        row = run_load(url, clients, args.tokens, args.rounds)
        for k, v in per_decode(before, counters(url)).items():
            split.setdefault(f"{k}_{clients}", []).append(v)
        return row

    try:
        run_load(url, n, 8, 1)  # warm-up
        for _ in range(args.repeats):
            one.append(load(1))
            many.append(load(n))
    finally:
        proc.terminate()
        proc.wait(30)
    ratios = [m["tokens_per_s"] / o["tokens_per_s"] for o, m in zip(one, many)]
    return {"server": name, "slots": n, "tok_s_1": [round(o["tokens_per_s"], 1) for o in one],
            f"tok_s_{n}": [round(m["tokens_per_s"], 1) for m in many],
            "ratios": [round(r, 2) for r in ratios], "ratio_median": round(statistics.median(ratios), 2),
            **{k: round(statistics.median(v), 3) for k, v in sorted(split.items())},
            "failed": sum(o["failed"] + m["failed"] for o, m in zip(one, many))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", default="/tmp/llama-server-build/bin/llama-server")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="requests per client")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-per-slot", type=int, default=512)
    ap.add_argument("--scaling", type=int, default=0, help="N: 1 vs N clients on one -np N server")
    ap.add_argument("--repeats", type=int, default=5, help="alternations of --scaling")
    args = ap.parse_args()
    model = str(resolve_model(args.model))
    servers = {"ggmlpy": [sys.executable, "-m", "ggmlpy", "serve"]}
    if os.path.exists(args.llama_server):
        servers["llama-server"] = [args.llama_server]
    out = {"model": args.model, "threads": args.threads, "tokens": args.tokens, "results": []}
    port = 18080
    if args.scaling:
        for name, base in servers.items():
            port += 1
            out["results"].append(scaling(name, base, model, port, args))
            print(json.dumps(out["results"][-1]), file=sys.stderr)
        print(json.dumps(out, indent=1))
        return 0
    for clients in [int(c) for c in args.clients.split(",")]:
        for name, base in servers.items():  # alternated: both servers at each client count
            port += 1
            url = f"http://127.0.0.1:{port}"
            cmd = base + ["-m", model, "--port", str(port), "-np", str(clients), "-t",
                          str(args.threads), "-c", str(args.ctx_per_slot * clients)]
            proc = start(cmd, url)
            try:
                run_load(url, clients, 8, 1)  # warm-up
                row = run_load(url, clients, args.tokens, args.rounds)
            finally:
                proc.terminate()
                proc.wait(30)
            row["server"] = name
            out["results"].append(row)
            print(json.dumps(row), file=sys.stderr)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
