"""Prompt and generation speed with every layer on the GPU, llama-bench style, as JSON.

pp<P>: one batch of P random tokens into an empty cache; tg<N>: N tokens decoded one at a
time from an empty cache. Each is run once to warm up (compiling and capturing), then
`--reps` times; the median tokens/s is reported, with every run's value. The report also
gives the GPU time of one decode step (its CUDA graph replayed alone) and of one prompt
(its launches alone), and per kernel family, so launch overhead, Python overhead and kernel
time can be told apart.

    python bench/bench_cuda.py --model smollm2-135m [-p 512 -n 128 --reps 3 --ngl 99]
    python bench/bench_cuda.py --synthetic smollm2   # same shapes, random Q4_1 weights
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama  # noqa: E402
from ggmlpy.hub import resolve_model  # noqa: E402
from ggmlpy.ir.types import GGMLType  # noqa: E402

HOST = "ref"  # the host backend: with -ngl 99 it only looks up token embeddings

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


def gpu_times(split, reps: int = 20) -> dict:
    """GPU milliseconds of the split's most recent plan: as a whole (graph or launches) and
    per kernel family (each launch timed on its own)."""
    drv = split.backend.driver
    plan = next(reversed(split._plans.values()))
    start, end = drv.event(), drv.event()
    drv.record(start)
    for _ in range(reps):
        if plan.graph is not None:
            drv.graph_launch(plan.graph)
        else:
            for pl in plan.launches:
                drv.launch(pl)
    drv.record(end)
    whole = drv.elapsed_ms(start, end) / reps
    families: dict[str, float] = {}
    for pl in plan.launches:
        a, b = drv.event(), drv.event()
        drv.record(a)
        drv.launch(pl)
        drv.record(b)
        fam = pl.name.split("_")[1]
        families[fam] = families.get(fam, 0.0) + drv.elapsed_ms(a, b)
    return {"ms": round(whole, 4), "launches": len(plan.launches), "graph": plan.graph is not None,
            "ms_by_family_timed_alone": {k: round(v, 4) for k, v in sorted(families.items(), key=lambda kv: -kv[1])}}


def bench(model, n_prompt: int, n_gen: int, reps: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n_vocab = model.hparams.n_vocab
    out: dict = {}
    if n_prompt:
        ctx = llama.Context(model, n_ctx=n_prompt + n_gen, n_batch=n_prompt, n_ubatch=n_prompt, backend=HOST)
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
        if split is not None:
            out[f"pp{n_prompt}"]["gpu"] = gpu_times(split, reps=3)
    if n_gen:
        ctx = llama.Context(model, n_ctx=n_prompt + n_gen, n_batch=max(n_prompt, 1), backend=HOST)
        runs = []
        for i in range(reps + 1):
            ctx.memory.clear()
            t0 = time.perf_counter()
            for _ in range(n_gen):
                assert ctx.decode(llama.Batch.from_tokens([int(rng.integers(0, n_vocab))])) == 0
            dt = time.perf_counter() - t0
            if i:
                runs.append(n_gen / dt)
        out[f"tg{n_gen}"] = {"tokens_per_s": round(statistics.median(runs), 1),
                             "runs": [round(r, 1) for r in runs]}
        split = cuda_split(ctx, single=True)
        if split is not None:
            out[f"tg{n_gen}"]["gpu"] = gpu_times(split)
            out[f"tg{n_gen}"]["backend_stats"] = vars(split.backend.stats)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF path or known model name")
    ap.add_argument("--synthetic", choices=sorted(SYNTHETIC), help="random weights with a known model's shapes")
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ngl", type=int, default=99)
    args = ap.parse_args(argv)

    import ggmlpy.codegen_cuda as cg

    ok, device = cg.cuda_available()
    if not ok:
        print(json.dumps({"error": f"no CUDA device: {device}"}))
        return 1
    cg.register()
    if args.synthetic:
        from ggmlpy.testing_models import write_tiny_llama

        path = write_tiny_llama(Path(tempfile.mkdtemp()) / f"{args.synthetic}-random.gguf", **SYNTHETIC[args.synthetic])
        name = f"{args.synthetic} shapes, random Q4_1 weights"
    else:
        path = resolve_model(args.model)
        name = Path(path).name
    t0 = time.perf_counter()
    model = llama.Model.load(path, devices=["cuda:0"], n_gpu_layers=args.ngl)
    result = {"model": name, "device": device, "ngl": args.ngl, "load_s": round(time.perf_counter() - t0, 2)}
    result.update(bench(model, args.n_prompt, args.n_gen, args.reps))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
