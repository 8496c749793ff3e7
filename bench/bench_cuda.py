"""Prompt and generation speed with every layer on the GPU, llama-bench style, as JSON.

pp<P>: one batch of P random tokens into an empty cache; tg<N>: N tokens decoded one at a
time from an empty cache. Each is run once to warm up (compiling and capturing), then
`--reps` times; the median tokens/s is reported, with every run's value.

Where a decode token's time goes (tg "per_token_ms"): `wall` per token; `blocked`, the time
the host waits for the GPU (in the logits download and the stream synchronisation);
`host` = wall - blocked, of which `backend_host` is spent in the CUDA split's own Python
(the rest is llama's and the scheduler's); `gpu_graph`, one decode graph replayed
back-to-back (CUDA events). "gpu" also gives each kernel family's share, every launch
timed over repeated back-to-back launches (plain launches: programmatic dependent launch
applies inside captured graphs only, so these sums exceed the graph's time).

    python bench/bench_cuda.py --model smollm2-135m [-p 512 -n 128 --reps 3 --ngl 99]
    python bench/bench_cuda.py --synthetic smollm2   # same shapes, random Q4_1 weights
    python bench/bench_cuda.py --model M --dry        # no GPU: the host's cost per token
    python bench/bench_cuda.py --model M --prebuild   # no GPU: fill the kernel cache (sm_90)
    python bench/bench_cuda.py --summarize a.json b.json [--golden-log golden.log]

GGMLPY_CUDA_PDL=0 turns programmatic dependent launch off; GGMLPY_CUDA_MATVEC_ROWS=2 gives
the matrix-vector kernel two rows per warp (for comparisons).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama  # noqa: E402
import llama.model  # noqa: E402
import llama.placement as placement  # noqa: E402
from ggmlpy.hub import resolve_model  # noqa: E402
from ggmlpy.ir.types import GGMLType  # noqa: E402

HOST = "auto"  # the host backend (--host): auto = cpu, as llama.Context and `ggmlpy run` use,
# where this machine's llvmlite can build it, else ref (with -ngl 99 the host part only looks
# up token embeddings, but how: the reference backend's numpy lookup costs about 65 us a
# token more than the CPU backend's kernel)


def resolve_host(choice: str) -> tuple[str, str | None]:
    """The host backend to use, and why auto fell back to ref (None when it did not)."""
    if choice != "auto":
        return choice, None
    try:
        from ggmlpy.codegen_cpu.backend import CpuBackend
        from ggmlpy.ir.builder import GraphBuilder
        from ggmlpy.sched.store import TensorStore

        b = GraphBuilder()
        x = b.input("x", GGMLType.F32, (4, 1, 1, 1))
        y = b.scale(x, 2.0)
        g = b.build([y])
        store = TensorStore({"x": np.arange(4, dtype=np.float32)})
        CpuBackend(n_threads=1).compile(g, g.nodes).run(store, {})
        if store.array(y, {}).reshape(-1).tolist() != [0.0, 2.0, 4.0, 6.0]:
            return "ref", "the CPU backend computed a wrong result"
        return "cpu", None
    except Exception as e:  # noqa: BLE001 - any failure to build or run means: measure on ref
        return "ref", f"{type(e).__name__}: {e}"[:300]

SYNTHETIC = {  # SmolLM2-135M's shapes
    "smollm2": dict(n_layer=30, n_embd=576, n_head=9, n_head_kv=3, n_ff=1536, n_vocab=49152,
                    n_ctx_train=8192, weight_type=GGMLType.Q4_1, tied=True, rope_base=100000.0),
}


def cuda_split(ctx, single: bool):
    """The CUDA split of the context's decode (single) or prompt graph."""
    from ggmlpy.codegen_cuda.runtime import CudaSplit

    for compiled in ctx.graph_cache.entries.values():
        if (compiled.graph.hints.get("tokens") == "single") == single:
            for split in compiled.compiled:
                if isinstance(split, CudaSplit):
                    return split
    return None


class Timers:
    """Wall time inside chosen methods of an object (the driver, the split class)."""

    def __init__(self):
        self.s: dict[str, float] = {}

    def wrap(self, obj, name: str, label: str) -> None:
        fn = getattr(obj, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.s[label] = self.s.get(label, 0.0) + time.perf_counter() - t0

        setattr(obj, name, timed)

    def reset(self) -> None:
        self.s.clear()


def gpu_times(split, reps: int = 20, per_launch_reps: int = 10) -> dict:
    """GPU milliseconds of the split's most recent plan as a whole (graph or launches), and
    per kernel family: every launch repeated back-to-back, its mean time summed by family."""
    drv = split.backend.driver
    plan = next(reversed(split._plans.values()))
    start, end = drv.event(), drv.event()

    def whole():
        if plan.graph is not None:
            drv.graph_launch(plan.graph)
        else:
            for pl in plan.launches:
                drv.launch(pl)

    whole()
    drv.record(start)
    for _ in range(reps):
        whole()
    drv.record(end)
    ms = drv.elapsed_ms(start, end) / reps
    families: dict[str, float] = {}
    counts: dict[str, int] = {}
    for pl in plan.launches:
        drv.launch(pl)
        drv.record(start)
        for _ in range(per_launch_reps):
            drv.launch(pl)
        drv.record(end)
        fam = pl.name.split("_")[1]
        families[fam] = families.get(fam, 0.0) + drv.elapsed_ms(start, end) / per_launch_reps
        counts[fam] = counts.get(fam, 0) + 1
    return {"ms": round(ms, 4), "launches": len(plan.launches), "graph": plan.graph is not None,
            "us_per_launch": round(1e3 * ms / max(1, len(plan.launches)), 2),
            "ms_by_family_back_to_back": {k: round(v, 4) for k, v in sorted(families.items(), key=lambda kv: -kv[1])},
            "launches_by_family": counts}


def bench(model, n_prompt: int, n_gen: int, reps: int, timers: Timers | None, seed: int = 0,
          gpu: bool = True, host: str = HOST) -> dict:
    rng = np.random.default_rng(seed)
    n_vocab = model.hparams.n_vocab
    out: dict = {}
    if n_prompt:
        ctx = llama.Context(model, n_ctx=n_prompt + n_gen, n_batch=n_prompt, n_ubatch=n_prompt, backend=host)
        runs = []
        for i in range(reps + 1):
            ctx.memory.clear()
            tokens = rng.integers(0, n_vocab, n_prompt).tolist()
            t0 = time.perf_counter()
            assert ctx.decode(llama.Batch.from_tokens(tokens)) == 0
            dt = time.perf_counter() - t0
            if i:
                runs.append(n_prompt / dt)
        out[f"pp{n_prompt}"] = {"tokens_per_s": round(statistics.median(runs), 1),
                                "runs": [round(r, 1) for r in runs]}
        split = cuda_split(ctx, single=False)
        if split is not None and gpu:
            out[f"pp{n_prompt}"]["gpu"] = gpu_times(split, reps=3, per_launch_reps=2)
    if n_gen:
        n_batch = max(n_prompt, 1)
        ctx = llama.Context(model, n_ctx=n_prompt + n_gen, n_batch=n_batch, n_ubatch=n_batch, backend=host)
        runs, splits = [], []
        for i in range(reps + 1):
            ctx.memory.clear()
            if timers is not None:
                timers.reset()
            t0 = time.perf_counter()
            for _ in range(n_gen):
                assert ctx.decode(llama.Batch.from_tokens([int(rng.integers(0, n_vocab))])) == 0
            dt = time.perf_counter() - t0
            if i:
                runs.append(n_gen / dt)
                if timers is not None:
                    splits.append((dt, dict(timers.s)))
        res = {"tokens_per_s": round(statistics.median(runs), 1), "runs": [round(r, 1) for r in runs]}
        if splits:
            dt, s = sorted(splits, key=lambda x: x[0])[len(splits) // 2]
            blocked = s.get("dtoh", 0.0) + s.get("synchronize", 0.0)
            per = {"wall": dt, "blocked": blocked, "host": dt - blocked,
                   "backend_host": s.get("split.run", 0.0) - blocked,
                   "graph_launch_call": s.get("graph_launch", 0.0), "htod_call": s.get("htod", 0.0)}
            res["per_token_ms"] = {k: round(1e3 * v / n_gen, 4) for k, v in per.items()}
        split = cuda_split(ctx, single=True)
        if split is not None:  # known without a GPU too: what one decode token launches
            res["launches_per_token"] = max(len(p.launches) for p in split._plans.values())
            res["graph_captures"] = split.backend.stats.graph_captures
        if split is not None and gpu:
            if timers is not None:
                timers.reset()
            res["gpu"] = gpu_times(split)
            res["per_token_ms"]["gpu_graph"] = res["gpu"]["ms"]
            res["backend_stats"] = vars(split.backend.stats)
            res["pdl"] = getattr(split.backend.driver, "pdl", None)
        out[f"tg{n_gen}"] = res
    return out


def summarize(paths: list[str], golden_log: str | None = None) -> dict:
    """The headline numbers of several reports (files of one or more JSON objects each) and
    of the golden tests' log, in one small JSON (a device session prints only its tail)."""
    out: dict = {"runs": []}
    dec = json.JSONDecoder()
    for path in paths:
        text = Path(path).read_text() if Path(path).exists() else ""
        i = text.find("{")
        while 0 <= i < len(text):
            try:
                rep, end = dec.raw_decode(text, i)
            except json.JSONDecodeError:
                break
            row = {"label": rep.get("label"), "model": rep.get("model"), "env": rep.get("env"),
                   "host": rep.get("host_backend"), "host_fallback": rep.get("host_fallback")}
            for key, val in rep.items():
                if key.startswith("pp") and isinstance(val, dict):
                    row[key] = val.get("tokens_per_s")
                    row[key + "_gpu_ms"] = val.get("gpu", {}).get("ms")
                if key.startswith("tg") and isinstance(val, dict):
                    row[key] = val.get("tokens_per_s")
                    row[key + "_per_token_ms"] = val.get("per_token_ms")
                    gpu = val.get("gpu", {})
                    row[key + "_gpu"] = {k: gpu.get(k) for k in ("launches", "us_per_launch",
                                                                 "ms_by_family_back_to_back")}
                    row["pdl"] = val.get("pdl")
                    stats = val.get("backend_stats", {})
                    if stats.get("graph_captures"):
                        row["capture_ms_each"] = round(1e3 * stats["capture_s"] / stats["graph_captures"], 2)
            if "error" in rep:
                row["error"] = rep["error"]
            out["runs"].append(row)
            i = text.find("{", end)
    if golden_log and Path(golden_log).exists():
        lines = Path(golden_log).read_text().splitlines()
        out["golden"] = [ln.strip() for ln in lines if ln.startswith(("smollm2", ".smollm2", "..smollm2"))
                         or " passed" in ln or " failed" in ln]
    return out


def use_driver(driver) -> None:
    """Every "cuda:N" device of models loaded from now on gets a backend on `driver`."""
    from ggmlpy.codegen_cuda.backend import CudaBackend

    def make(name: str, options=None):
        be = CudaBackend(driver=driver, options=options)  # options: the context's backend_options
        be.buffer_type = name
        return be

    placement.make_device_backend = make
    llama.model.make_device_backend = make


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF path or known model name")
    ap.add_argument("--synthetic", choices=sorted(SYNTHETIC), help="random weights with a known model's shapes")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ngl", type=int, default=99)
    ap.add_argument("--dry", action="store_true", help="no GPU: a driver that does nothing (host cost)")
    ap.add_argument("--prebuild", action="store_true", help="no GPU: compile every kernel for sm_90 into the cache")
    ap.add_argument("--label", default=None, help="a name for this configuration in the JSON")
    ap.add_argument("--host", default=HOST, help="backend of the host part: cpu (as ggmlpy run uses), ref, or auto (cpu where it builds)")
    ap.add_argument("--summarize", nargs="+", metavar="JSON", help="one compact JSON of earlier reports")
    ap.add_argument("--golden-log", default=None, help="with --summarize: the golden tests' output")
    args = ap.parse_args(argv)
    if args.summarize:
        print(json.dumps(summarize(args.summarize, args.golden_log), indent=1))
        return 0

    import ggmlpy.codegen_cuda as cg

    if args.dry or args.prebuild:
        from ggmlpy.codegen_cuda.driver import DryRunDriver

        driver = DryRunDriver(compile=args.prebuild)
        use_driver(driver)
        device = f"{driver.name} (compile={args.prebuild})"
        if args.prebuild:
            from ggmlpy.codegen_cuda.driver import PDL_PROBE_SOURCE
            from ggmlpy.codegen_cuda.nvcc import compile_cuda
            from ggmlpy.disk_cache import DiskCache

            compile_cuda(PDL_PROBE_SOURCE, driver.arch, "cubin", DiskCache("cuda"))
    else:
        ok, device = cg.cuda_available()
        if not ok:
            print(json.dumps({"error": f"no CUDA device: {device}"}))
            return 1
    if args.synthetic:
        from ggmlpy.testing.models import write_tiny_llama

        path = Path(tempfile.gettempdir()) / f"ggmlpy-{args.synthetic}-random.gguf"  # reused by later runs
        if not path.exists():
            write_tiny_llama(path.with_suffix(".tmp"), **SYNTHETIC[args.synthetic])
            path.with_suffix(".tmp").rename(path)
        name = f"{args.synthetic} shapes, random Q4_1 weights"
    else:
        path = resolve_model(args.model)
        name = Path(path).name
    t0 = time.perf_counter()
    model = llama.Model.load(path, devices=["cuda:0"], n_gpu_layers=args.ngl)
    result = {"label": args.label, "model": name, "device": device, "ngl": args.ngl,
              "env": {k: v for k, v in os.environ.items() if k.startswith("GGMLPY_CUDA_")},
              "load_s": round(time.perf_counter() - t0, 2)}
    timers = None
    if not args.prebuild:
        from ggmlpy.codegen_cuda.driver import get_driver
        from ggmlpy.codegen_cuda.runtime import CudaSplit

        timers = Timers()
        drv = driver if args.dry else get_driver()
        for meth in ("dtoh", "synchronize", "graph_launch", "htod"):
            timers.wrap(drv, meth, meth)
        run = CudaSplit.run

        def timed_run(self, store, env):
            t = time.perf_counter()
            try:
                return run(self, store, env)
            finally:
                timers.s["split.run"] = timers.s.get("split.run", 0.0) + time.perf_counter() - t

        CudaSplit.run = timed_run
    reps = 1 if args.prebuild else args.reps
    host, why = resolve_host(args.host)
    result["host_backend"] = host
    if why:
        result["host_fallback"] = why
    result.update(bench(model, args.n_prompt, args.n_gen, reps, timers, gpu=not (args.dry or args.prebuild),
                        host=host))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
