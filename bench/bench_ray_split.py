"""What a `ray:` device costs: decode tokens/s of one process against the same model split
across two Ray nodes on this machine, the added milliseconds per hop, bytes per hop, and
the raw cost of a hop: a numpy argument, a hop's message of bytes pieces, ray.put object refs. JSON on stdout.

Usage: python bench/bench_ray_split.py [-m MODEL] [-ngl N] [-n TOKENS] [-ot PATTERN=DEVICE]
                                      [--address ADDR --device ray:...]

Without --address it starts a local two-node cluster on loopback (ray.cluster_utils.Cluster,
one CPU each, no dashboard, no usage stats) and offloads to the second node (`ray:node-b`).
With --address it joins that cluster and offloads to --device, so the same numbers can be
taken across two machines. A hop is one crossing between host and actor: a remote split is
one actor call per token, two hops (activations there, results back). With the output
layer on the device (the default -ngl placement) the hop back carries a row of logits
(n_vocab floats); `-ot token_embd=cpu` (SmolLM2's output is tied to its token embeddings;
`output.weight=cpu` for a model with an output matrix) keeps the output product on the host,
and both hops carry one hidden state.
"""
from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local cluster on loopback only
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import llama  # noqa: E402
from ggmlpy.distributed.hops import message, unpack  # noqa: E402
from ggmlpy.distributed.ray_target import resolve  # noqa: E402
from ggmlpy.hub import resolve_model  # noqa: E402

PROMPT = [1, 450, 4996, 17354, 1701, 432, 17204, 975, 278, 17366, 11203, 29889]


def decode_times(path: Path, n_tokens: int, threads: int, **load: Any) -> tuple[list[float], dict]:
    """Seconds of each of n_tokens greedy one-token decodes after the prompt, and the
    device's run_stats over those decodes (none for one process)."""
    model = llama.Model.load(path, **load)
    ctx = llama.Context(model, n_ctx=512, n_batch=64, n_ubatch=64, n_threads=threads)
    try:
        assert ctx.decode(llama.Batch.from_tokens(PROMPT)) == 0
        tok = int(np.argmax(ctx.get_logits_ith(-1)))
        for _ in range(3):  # warm: compile waits, first binds
            assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
            tok = int(np.argmax(ctx.get_logits_ith(-1)))
        before = ctx.backends[0].run_stats() if load.get("devices") else {}
        times = []
        for _ in range(n_tokens):
            t0 = time.perf_counter()
            assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
            times.append(time.perf_counter() - t0)
            tok = int(np.argmax(ctx.get_logits_ith(-1)))
        after = ctx.backends[0].run_stats() if load.get("devices") else {}
        stats = {k: after[k] - before[k] for k in ("runs", "bytes_sent", "bytes_received", "call_ms",
                                                    "actor_ms", "remote_native_ms") if k in after}
        return times, stats
    finally:
        for be in ctx.backends:
            be.close()
        model.close()


def hop_cost(ray: Any, placement: dict, sizes: list[int], n: int = 200) -> list[dict]:
    """Round-trip milliseconds of an actor call carrying `size` bytes there and back: as one
    numpy argument (inlined by Ray up to 100 KiB, through the object store above), as a
    hop's message (hops.py: `bytes` pieces, each inlined) and through ray.put object refs."""

    @ray.remote(num_cpus=0)
    class Echo:
        def echo(self, data):
            return data

        def echo_ref(self, data):
            return ray.put(data)

        def echo_pieces(self, *pieces):
            return pieces if len(pieces) > 1 else pieces[0]

    actor = Echo.options(**placement).remote()
    out = []
    for size in sizes:
        x = np.zeros(size, np.uint8)
        for _ in range(10):
            ray.get(actor.echo.remote(x))
        t0 = time.perf_counter()
        for _ in range(n):
            ray.get(actor.echo.remote(x))
        inline = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for _ in range(n):
            ray.get(ray.get(actor.echo_ref.remote(ray.put(x))))
        put = (time.perf_counter() - t0) / n
        parts = message(b"", [x])
        call = actor.echo_pieces.options(num_returns=len(parts)) if len(parts) > 1 else actor.echo_pieces
        t0 = time.perf_counter()
        for _ in range(n):
            got = ray.get(call.remote(*message(b"", [x])))
            unpack(got if len(parts) > 1 else [got])
        pieces = (time.perf_counter() - t0) / n
        out.append({"bytes": size, "numpy_argument_round_trip_ms": round(inline * 1e3, 3),
                    "message_round_trip_ms": round(pieces * 1e3, 3), "pieces": len(parts),
                    "object_ref_round_trip_ms": round(put * 1e3, 3)})
    ray.kill(actor)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=12)
    ap.add_argument("-n", "--tokens", type=int, default=48)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--address", default=None, help="an existing cluster (default: start a local one)")
    ap.add_argument("--device", default="ray:node-b")
    ap.add_argument("-ot", "--override-tensor", action="append", default=None, metavar="PATTERN=DEVICE",
                    help="llama.cpp's -ot for the split run (repeatable)")
    args = ap.parse_args()
    import ray

    cluster = None
    if args.address is None:
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        cluster.add_node(num_cpus=1, resources={"node-b": 1})
        ray.init(address=cluster.address, log_to_driver=False)
    else:
        ray.init(address=args.address, log_to_driver=False)
    try:
        path = resolve_model(args.model)
        one, _ = decode_times(path, args.tokens, args.threads)
        split, stats = decode_times(path, args.tokens, args.threads, devices=[args.device],
                                    n_gpu_layers=args.n_gpu_layers, override_tensor=args.override_tensor)
        med_one, med_split = statistics.median(one), statistics.median(split)
        runs_per_token = stats["runs"] / args.tokens
        hops = 2 * runs_per_token
        placement = resolve(args.device).actor_options  # the hop test's actor goes where the device's does
        result = {
            "model": Path(path).name, "device": args.device, "n_gpu_layers": args.n_gpu_layers,
            "override_tensor": args.override_tensor or [],
            "threads": args.threads, "tokens": args.tokens,
            "one_process_tok_s": round(1 / med_one, 2), "split_tok_s": round(1 / med_split, 2),
            "one_process_ms_per_token": round(med_one * 1e3, 3),
            "split_ms_per_token": round(med_split * 1e3, 3),
            "added_ms_per_token": round((med_split - med_one) * 1e3, 3),
            "actor_calls_per_token": runs_per_token, "hops_per_token": hops,
            "added_ms_per_hop": round((med_split - med_one) * 1e3 / hops, 3),
            "call_ms_per_token": round(stats["call_ms"] / args.tokens, 3),
            "actor_ms_per_token": round(stats["actor_ms"] / args.tokens, 3),
            "remote_native_ms_per_token": round(stats["remote_native_ms"] / args.tokens, 3),
            "bytes_per_hop_to_actor": stats["bytes_sent"] // stats["runs"],
            "bytes_per_hop_from_actor": stats["bytes_received"] // stats["runs"],
            "hop_cost": hop_cost(ray, placement, [2304, 64 << 10, 192 << 10, 1 << 20]),
        }
        print(json.dumps(result, indent=1))
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
