"""Host time per CUDA decode token without a GPU, for three host setups side by side in one
process (interleaved rounds, so a noisy machine moves them alike), as JSON:

- `ref`: the host part (the token embedding lookup) on the reference backend;
- `cpu`: on the CPU backend, as llama.Context and `ggmlpy run` use it;
- `cpu_pool`: the CPU backend with every run handed to its thread pool, as before small
  runs stayed on the calling thread (codegen_cpu/backend.py, SMALL_RUN_BYTES).

The CUDA side runs on the dry-run driver (launches nothing), so the figures are the host's
cost alone.

    python bench/cuda_host_ab.py [--model smollm2-135m] [--rounds 9] [-n 128]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama  # noqa: E402
import ggmlpy.codegen_cpu.backend as cpu_backend  # noqa: E402
from bench_cuda import use_driver  # noqa: E402
from ggmlpy.codegen_cuda.driver import DryRunDriver  # noqa: E402
from ggmlpy.hub import resolve_model  # noqa: E402

SETUPS = {"ref": "ref", "cpu": "cpu", "cpu_pool": "cpu"}
PROMPT = list(range(1, 9))


def _set_small_runs(ctx: llama.Context, limit: int) -> None:
    """Every CPU split of ctx decides again, under `limit`, whether its runs are small."""
    cpu_backend.SMALL_RUN_BYTES = limit
    for entry in ctx.graph_cache.entries.values():
        for split in entry.compiled:
            if isinstance(split, cpu_backend.CpuSplit):
                split._env_key = None  # recompute the per-env state, _n_threads included


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    args = ap.parse_args(argv)
    use_driver(DryRunDriver(compile=False))
    model = llama.Model.load(resolve_model(args.model), devices=["cuda:0"], n_gpu_layers=99)
    default_limit = cpu_backend.SMALL_RUN_BYTES
    contexts = {}
    for name, host in SETUPS.items():
        contexts[name] = ctx = llama.Context(model, n_ctx=args.n_gen + 64, n_batch=16, n_ubatch=16, backend=host)
        assert ctx.decode(llama.Batch.from_tokens(PROMPT)) == 0  # compile and capture
    ms: dict[str, list[float]] = {name: [] for name in SETUPS}
    for _ in range(args.rounds):
        for name, ctx in contexts.items():
            ctx.memory.clear()
            assert ctx.decode(llama.Batch.from_tokens(PROMPT)) == 0
            _set_small_runs(ctx, 0 if name == "cpu_pool" else default_limit)
            t0 = time.perf_counter()
            for t in range(args.n_gen):
                assert ctx.decode(llama.Batch.from_tokens([7 * t % 1000])) == 0
            ms[name].append(1e3 * (time.perf_counter() - t0) / args.n_gen)
    cpu_backend.SMALL_RUN_BYTES = default_limit
    print(json.dumps({"model": Path(resolve_model(args.model)).name, "rounds": args.rounds,
                      "host_ms_per_token_median": {k: round(statistics.median(v), 4) for k, v in ms.items()},
                      "host_ms_per_token_runs": {k: [round(x, 4) for x in v] for k, v in ms.items()}},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
