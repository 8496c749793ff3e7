"""Benchmarks in llama-bench's conventions, printed as JSON by `ggmlpy bench` and bench/.
They run the runtime (llama.Model, llama.Context), so they live with the command line,
which stands above both the compiler library and the runtime.

pp512: one 512-token prompt decoded as one batch (tokens/s); tg128: 128 tokens decoded one
at a time after a one-token start. Each is the median of several runs after a warm-up. Cold
start (empty compile cache: load, compile, first token) and warm start (disk cache hit) run in
fresh subprocesses so nothing in this process helps them. Peak RSS is this process's maximum.
`context_and_compile_s` is the time `Context()` takes: on a cache miss LLVM still runs in
worker processes after it returns (the first decode waits for its graph), so a first run's
cost is `cold_start_s`.

The roofline: decode reads every weight once per step, so the machine's read bandwidth
(codegen_cpu/bandwidth.py, a native loop on the context's own thread pool) over the weight
bytes a step reads is the most steps a second can reach. A shared VM's bandwidth moves by 2x
within a minute, so the loop runs between tg128's segments of 32 tokens (not timed with
them): each run's roofline is its tokens/s over what that run's own bandwidth allows
(`tg128_runs`), and `tg128_roofline` the median of the runs'. `tg128_batched` is one token
from each of N sequences per step (the server's step), aggregate tokens/s, with its own
fraction per N, the loop run before and after each N's runs. The KV cache's reads (a few %
at these lengths) are left out of the bytes.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

import numpy as np

import llama
from ggmlpy.ir.tensor import Flag

if TYPE_CHECKING:
    from ggmlpy.codegen_cpu.bandwidth import ReadLoop


def _tokens(model: llama.Model, n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(100, model.n_vocab - 100, n)]


def run_bench(model_name: str, *, threads: int = 2, backend: str | None = None, n_prompt: int = 512,
              n_gen: int = 128, reps: int = 3, start_times: bool = True, devices: list[str] | None = None,
              n_gpu_layers: int = 0, tensor_split: list[float] | None = None,
              override_tensor: list[str] | None = None, repack: bool = True,
              batched: tuple[int, ...] = (1, 2, 4, 8), depth: int = 0, kv: dict[str, Any] | None = None) -> dict:
    """`devices`, `n_gpu_layers`, `tensor_split`, `override_tensor`, `repack`: offloading and
    weight layouts, as llama.Model.load takes them (llama-bench's -ngl, -ts, -ot and --repack). `batched`: the sequence
    counts of `tg128_batched` (empty: skipped). `depth` > 0 adds tg at that depth
    (`tg128_d{depth}_tok_s`, llama-bench's -d). `kv`: the KV cache's Context keywords
    (type_k, type_v, flash_attn: llama-bench's -ctk, -ctv, -fa) for every context measured."""
    kv = dict(kv or {})
    where = {"devices": devices, "n_gpu_layers": n_gpu_layers, "tensor_split": tensor_split,
             "override_tensor": override_tensor, "repack": repack}
    t0 = time.perf_counter()
    model = llama.Model.load(model_name, **where)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ctx = llama.Context(model, n_ctx=1024, n_batch=n_prompt, n_ubatch=n_prompt, n_threads=threads,
                        backend=backend, **kv)
    ctx_s = time.perf_counter() - t0
    toks = _tokens(model, n_prompt)
    pp, tg, overhead, runs_gb_s = [], [], [], []
    be = ctx.backends[0]
    on_host = not devices and not n_gpu_layers
    rss_before_loop = _peak_rss_mib()
    loop = read_loop(ctx, threads) if on_host else None
    for rep in range(reps + 1):
        ctx.memory.clear()
        t0 = time.perf_counter()
        if ctx.decode(llama.Batch.from_tokens(toks)) != 0:
            raise RuntimeError("prompt decode failed")
        pp_s = time.perf_counter() - t0
        ctx.memory.clear()
        ctx.decode(llama.Batch.from_tokens(toks[:1]))
        native0 = be.native_seconds
        tg_s, gb_s = 0.0, [loop.gb_s()] if loop else []
        for seg0 in range(0, n_gen, SEGMENT):
            t0 = time.perf_counter()
            for i in range(seg0, min(seg0 + SEGMENT, n_gen)):
                if ctx.decode(llama.Batch.from_tokens([toks[(i + 1) % n_prompt]])) != 0:
                    raise RuntimeError("generation decode failed")
            tg_s += time.perf_counter() - t0
            if loop:
                gb_s.append(loop.gb_s())
        native = be.native_seconds - native0
        if rep:  # the first round is the warm-up
            pp.append(n_prompt / pp_s)
            tg.append(n_gen / tg_s)
            runs_gb_s.append(statistics.mean(gb_s) if gb_s else None)
            if native:  # a backend that reports its native time (the CPU's)
                overhead.append((tg_s - native) / n_gen * 1e6)
    result = {
        "model": model.path.name, "backend": ctx.backend_name, "threads": threads,
        "devices": list(devices or []), "ngl": n_gpu_layers, "repack": repack,
        "type_k": str(ctx.type_k), "type_v": str(ctx.type_v),
        f"pp{n_prompt}_tok_s": round(statistics.median(pp), 2),
        f"tg{n_gen}_tok_s": round(statistics.median(tg), 2),
        # null where the first backend does not time its native code (CUDA): JSON has no NaN
        "python_overhead_us_per_token": round(statistics.median(overhead), 1) if overhead else None,
        "load_s": round(load_s, 3),
        "context_and_compile_s": round(ctx_s, 3),
        "compile_s_per_graph": round(ctx_s / max(len(ctx.graph_cache.entries), 1), 3),
        # the read loop's buffer, resident from its start to the end, is not the model's
        "peak_rss_mib": round(max(rss_before_loop, _peak_rss_mib() - (loop.n_bytes / 2**20 if loop else 0)), 1),
    }
    result.update(device_stats(ctx))
    step_bytes = weight_bytes_per_step(ctx)
    result["weight_mb_per_token"] = round(step_bytes / 1e6, 2)
    if on_host:  # the host's bandwidth bounds decode only when every weight is in host memory
        runs = [{"tok_s": round(r, 2), "read_gb_s": round(g, 2), "roofline": round(step_bytes * r / (g * 1e9), 3)}
                for r, g in zip(tg, runs_gb_s)]
        result[f"tg{n_gen}_runs"] = runs
        result["read_gb_s"] = round(statistics.median(r["read_gb_s"] for r in runs), 2)
        result[f"tg{n_gen}_roofline"] = round(statistics.median(r["roofline"] for r in runs), 3)
    del loop
    if batched:
        agg, gb_s = batched_decode(model, threads, backend, batched, n_gen, reps, on_host, kv)
        result[f"tg{n_gen}_batched"] = {str(n): round(v, 2) for n, v in agg.items()}
        if on_host:
            result[f"tg{n_gen}_batched_roofline"] = {
                str(n): round(step_bytes * v / n / (gb_s[n] * 1e9), 3) for n, v in agg.items()}
    if depth:
        result[f"tg{n_gen}_d{depth}_tok_s"] = round(decode_at_depth(model, threads, backend, depth, n_gen, reps,
                                                                    kv=kv), 2)
    if start_times:
        result["cold_start_s"], result["warm_start_s"] = start_times_s(model_name, threads, backend, where)
    return result


def decode_at_depth(model: llama.Model, threads: int, backend: str | None, depth: int, n_gen: int,
                    reps: int, n_batch: int = 512, kv: dict[str, Any] | None = None) -> float:
    """tokens/s of n_gen one-token steps after a depth-token prompt (llama-bench's -d): the
    prompt is decoded once, untimed, and the memory put back to it before each round (a
    copy of its buffers), so each round starts from the same cache."""
    ctx = llama.Context(model, n_ctx=depth + n_gen + 256, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads,
                        backend=backend, **(kv or {}))
    toks = _tokens(model, depth + n_gen, seed=2)
    for i in range(0, depth, n_batch):
        if ctx.decode(llama.Batch.from_tokens(toks[i:min(i + n_batch, depth)])) != 0:
            raise RuntimeError("depth prompt decode failed")
    mem = ctx.memory
    saved, cells = {k: a.copy() for k, a in mem.bindings().items()}, mem.snapshot()
    rates = []
    for rep in range(reps + 1):
        for k, a in mem.bindings().items():
            np.copyto(a, saved[k])
        mem.restore(cells)
        t0 = time.perf_counter()
        for i in range(n_gen):
            if ctx.decode(llama.Batch.from_tokens([toks[depth + i]])) != 0:
                raise RuntimeError("decode at depth failed")
        if rep:
            rates.append(n_gen / (time.perf_counter() - t0))
    return statistics.median(rates)


def weight_bytes_per_step(ctx: llama.Context) -> int:
    """The model bytes a decode step reads: every weight an op reads whole (a get_rows
    lookup reads a row, left out), each once, in the largest graph compiled so far; of a
    mixture of experts' stacked experts (mul_mat_id), the share one token selects."""
    most = 0
    for entry in ctx.graph_cache.entries.values():
        read: dict[int, int] = {}
        for node in entry.graph.nodes:
            srcs = node.src[1:] if node.op == "get_rows" else node.src
            for j, src in enumerate(srcs):
                if src is not None and src.flags & Flag.WEIGHT:
                    nbytes = int(src.nb[3]) * int(src.ne[3])
                    if node.op == "mul_mat_id" and j == 0:   # n_used of n_expert matrices
                        nbytes = nbytes * int(node.src[2].ne[0]) // int(src.ne[2])
                    read[id(src)] = nbytes
        most = max(most, sum(read.values()))
    return most


def batched_decode(model: llama.Model, threads: int, backend: str | None, counts: tuple[int, ...],
                   n_gen: int, reps: int, measure_bandwidth: bool = True,
                   kv: dict[str, Any] | None = None) -> tuple[dict[int, float], dict[int, float]]:
    """Aggregate tokens/s of n_gen steps that each decode one token of every one of N
    sequences (each with its logits), the median of `reps` rounds after a warm-up; and per
    N the mean read bandwidth (GB/s) measured before and after each timed round (empty
    without `measure_bandwidth`)."""
    n_max = max(counts)
    ctx = llama.Context(model, n_ctx=n_max * (n_gen + 2), n_batch=max(n_max, 8), n_ubatch=max(n_max, 8),
                        n_seq_max=n_max, n_threads=threads, backend=backend, **(kv or {}))
    toks = _tokens(model, (n_gen + 1) * n_max, seed=1)
    loop = read_loop(ctx, threads) if measure_bandwidth else None
    out, bandwidth = {}, {}
    for n in counts:
        seqs = [[s] for s in range(n)]
        rates, gb_s = [], []
        for rep in range(reps + 1):
            if loop and rep:
                gb_s.append(loop.gb_s())
            ctx.memory.clear()
            step = llama.Batch(tokens=toks[:n], seq_ids=seqs, logits=[True] * n)
            if ctx.decode(step) != 0:
                raise RuntimeError("batched decode failed")
            t0 = time.perf_counter()
            for i in range(n_gen):
                first = (i + 1) * n_max
                step = llama.Batch(tokens=toks[first:first + n], seq_ids=seqs, logits=[True] * n)
                if ctx.decode(step) != 0:
                    raise RuntimeError("batched decode failed")
            if rep:
                rates.append(n * n_gen / (time.perf_counter() - t0))
                if loop:
                    gb_s.append(loop.gb_s())
        out[n] = statistics.median(rates)
        if gb_s:
            bandwidth[n] = statistics.mean(gb_s)
    return out, bandwidth


SEGMENT = 32   # tg tokens between two passes of the read loop


def read_loop(ctx: llama.Context, threads: int) -> "ReadLoop":
    """The read loop on the thread pool of the context's CPU backend (a pool of its own
    when the first backend is another), its buffer touched now."""
    from ggmlpy.codegen_cpu.backend import CpuBackend
    from ggmlpy.codegen_cpu.bandwidth import READ_LOOP_BYTES, ReadLoop
    from ggmlpy.codegen_cpu.runtime import ThreadPool

    be = ctx.backends[0]
    return ReadLoop(be.pool if isinstance(be, CpuBackend) else ThreadPool(threads), READ_LOOP_BYTES)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def device_stats(ctx: llama.Context) -> dict:
    """What an offload backend reports about its runs (CUDA: graph captures and replays)."""
    out = {}
    for be in ctx.backends:
        for key, value in be.run_stats().items():
            out[f"{be.name}_{key}"] = value
    return out


_START = """
import json, sys, time
t0 = time.perf_counter()
import llama
m = llama.Model.load(sys.argv[1], **json.loads(sys.argv[4]))
ctx = llama.Context(m, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=int(sys.argv[2]),
                    backend=None if sys.argv[3] == "-" else sys.argv[3])
ctx.decode(llama.Batch.from_tokens(m.tokenize("Hello")))
ctx.get_logits_ith(-1)
print(time.perf_counter() - t0)
"""


def start_times_s(model_name: str, threads: int, backend: str | None,
                  where: dict | None = None) -> tuple[float, float]:
    """(cold, warm): a fresh process with an empty compile cache, then again with it filled."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, GGMLPY_CACHE=cache)
        out = []
        for _ in range(2):
            proc = subprocess.run([sys.executable, "-c", _START, model_name, str(threads), backend or "-",
                                   json.dumps(where or {})],
                                  env=env, capture_output=True, text=True, check=True)
            out.append(round(float(proc.stdout.strip().splitlines()[-1]), 3))
    return out[0], out[1]


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="llama-bench style numbers as JSON")
    p.add_argument("-m", "--model", default="smollm2-135m")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--backend", default=None)
    p.add_argument("-r", "--reps", type=int, default=3)
    a = p.parse_args(argv)
    print(json.dumps(run_bench(a.model, threads=a.threads, backend=a.backend, reps=a.reps)))
    return 0
