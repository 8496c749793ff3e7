"""How the CPU backend uses its threads: small runs stay on the calling thread (no worker is
woken: the embedding lookup before a GPU decode), larger ones are shared, both with the same
results; and the workers are stopped before the interpreter exits."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ggmlpy.codegen_cpu.backend import SMALL_RUN_BYTES, CpuBackend, run_bytes
from ggmlpy.codegen_cpu.runtime import GEN
from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.store import TensorStore

F32 = GGMLType.F32


def _scaled_sum(n: int):
    b = GraphBuilder()
    x, y = b.input("x", F32, (n, 1, 1, 1)), b.input("y", F32, (n, 1, 1, 1))
    out = b.scale(b.add(x, y), 0.5)
    return b.build([out]), out


def _launches(backend: CpuBackend) -> int:
    return int(backend.pool.pool[GEN])  # the generation counter: one per launch to the workers


@pytest.mark.parametrize("n,shared", [(256, False), (SMALL_RUN_BYTES // 4, True)])
def test_small_runs_stay_on_the_calling_thread(n, shared):
    graph, out = _scaled_sum(n)
    backend = CpuBackend(n_threads=2)
    split = backend.compile(graph, graph.nodes)
    rng = np.random.default_rng(n)
    x, y = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    before = _launches(backend)
    for _ in range(3):
        store = TensorStore({"x": x, "y": y})
        split.run(store, {})
        np.testing.assert_array_equal(store.array(out, {}).reshape(-1), (x + y) * np.float32(0.5))
    assert _launches(backend) - before == (3 if shared else 0)
    backend.close()


def test_run_bytes_counts_results_and_the_products_matrices():
    b = GraphBuilder()
    w = b.weight("w", GGMLType.Q8_0, (64, 32, 1, 1))
    x = b.input("x", F32, (64, 2, 1, 1))
    y = b.mul_mat(w, x)
    graph = b.build([y])
    # the product's 2 x 32 floats, and the whole matrix: 32 rows of 2 Q8_0 blocks (34 bytes)
    assert run_bytes(graph.nodes, {}) == 2 * 32 * 4 + 32 * 2 * 34


def test_run_bytes_stops_counting_at_the_threshold():
    b = GraphBuilder()
    x = b.input("x", F32, (1024, 1, 1, 1))
    outs = [b.scale(x, float(i)) for i in range(10)]  # 4 KiB each
    nodes = b.build(outs).nodes
    full = run_bytes(nodes, {})
    assert full == 10 * 4096
    assert run_bytes(nodes, {}, stop_at=10_000) == 3 * 4096  # stops after the third result
    assert run_bytes(nodes, {}, stop_at=full + 1) == full  # below the threshold: all of it


def test_workers_stop_before_the_interpreter_exits(tmp_path):
    """A backend still alive at exit: by the time later exit handlers run, its workers are
    gone (a worker spinning in native code while finalisation frees the compiled runtime
    crashed the process)."""
    script = textwrap.dedent("""
        import atexit, sys, threading
        import numpy as np

        def check():  # registered first, so it runs after ggmlpy's own exit handler
            alive = [t.name for t in threading.enumerate() if t.name.startswith("ggmlpy-cpu")]
            print("alive at exit:", alive, flush=True)
            if alive:
                sys.stdout.flush()
                import os; os._exit(3)
        atexit.register(check)

        from ggmlpy.codegen_cpu.backend import CpuBackend
        from ggmlpy.ir.builder import GraphBuilder
        from ggmlpy.ir.types import GGMLType
        from ggmlpy.sched.store import TensorStore

        n = 1 << 16
        b = GraphBuilder()
        x = b.input("x", GGMLType.F32, (n, 1, 1, 1))
        out = b.scale(x, 2.0)
        graph = b.build([out])
        backend = CpuBackend(n_threads=2)
        split = backend.compile(graph, graph.nodes)
        store = TensorStore({"x": np.ones(n, np.float32)})
        split.run(store, {})
        assert float(store.array(out, {}).sum()) == 2.0 * n
        sys.modules["__main__"].keep = (backend, split)  # alive until finalisation
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GGMLPY_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "alive at exit: []" in done.stdout
