"""A model split across two Ray nodes (`ray:` devices, ggmlpy/distributed/remote_backend.py):
a real local Ray cluster (`ray.cluster_utils.Cluster`, two nodes of one CPU each, loopback
only, no dashboard, no usage stats) runs the last layers on an actor pinned to the second
node; the logits match one process, greedy tokens too, for the tiny test model and SmolLM2
and for a batch of several sequences. A killed actor makes decode fail fast with the fatal
code and a message naming the device; a new context then works again.

Without Ray installed, the Ray tests skip (visibly, with the reason) and the one test of
what a program without Ray gets still runs."""
from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import llama
from ggmlpy.sched.registry import PlacementError
from ggmlpy.testing.models import write_tiny_llama
from tests.ggmlpy.sched.test_split_models import check_split

# read when Ray is imported: a cluster started here then has 127.0.0.1 as its address and
# every Ray server listens on loopback only (the same as tests/llama/server/ray/test_serve.py, which may
# run in this process after this module)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

MAX_DELTA = 1e-3
PROMPT = [5, 17, 42, 99, 7, 250, 3, 64, 128, 11]
NEXT = [33, 200]
N_GREEDY = 6
DEVICE = "ray:node-b"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on this machine: the head (the driver's, resource node-a) and node-b."""
    ray = pytest.importorskip("ray", reason="the Ray split tests need the extra: pip install 'ggmlpy[ray]'")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        pytest.fail("Ray is already connected in this process: another test module left it so")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                      "resources": {"node-a": 1}})
    c.add_node(num_cpus=1, resources={"node-b": 1})
    try:
        ray.init(address=c.address, log_to_driver=False)
        yield ray
    finally:
        gc.collect()  # contexts of the tests: their actors are killed while Ray is still up
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("ray") / "tiny.gguf", n_layer=3)


def run_model(path: Path, **load) -> tuple[np.ndarray, list[int], llama.Context]:
    """Every prompt position's logits, those of two one-token decodes, then N_GREEDY
    greedy tokens."""
    model = llama.Model.load(path, **load)
    ctx = llama.Context(model, n_ctx=256, n_batch=16, n_ubatch=16, n_threads=1)
    assert ctx.decode(llama.Batch.from_tokens(PROMPT, logits_all=True)) == 0
    rows = [ctx.get_logits().copy()]
    for tok in NEXT:
        assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
        rows.append(ctx.get_logits().copy())
    greedy = []
    for _ in range(N_GREEDY):
        greedy.append(int(np.argmax(ctx.get_logits_ith(-1))))
        assert ctx.decode(llama.Batch.from_tokens([greedy[-1]])) == 0
    return np.concatenate(rows), greedy, ctx


def close(ctx: llama.Context) -> None:
    for be in ctx.backends:
        be.close()
    ctx.model.close()


def node_b(ray) -> str:
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "node-b" in n["Resources"])


def test_cluster_is_loopback_only(cluster):
    nodes = [n for n in cluster.nodes() if n["Alive"]]
    assert len(nodes) == 2 and {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}


def test_tiny_model_split_across_two_ray_nodes_matches_one_process(cluster, tiny):
    base, base_greedy, ctx0 = run_model(tiny)
    close(ctx0)
    got, greedy, ctx = run_model(tiny, devices=[DEVICE], n_gpu_layers=2)
    p = ctx.model.placement
    assert p.layers == ("cpu", "cpu", DEVICE) and p.output == DEVICE
    assert [b.name for b in ctx.backends] == [DEVICE, "cpu", "ref"]
    check_split(ctx, {"cpu", DEVICE})
    remote = ctx.backends[0]
    assert cluster.get(remote.actor.describe.remote())["node_id"] == node_b(cluster)
    assert np.abs(got - base).max() <= MAX_DELTA
    assert greedy == base_greedy
    stats = remote.run_stats()
    n_steps = 1 + len(NEXT) + N_GREEDY
    assert stats["runs"] == n_steps  # one actor call per ubatch
    n_embd, n_vocab = 64, ctx.n_vocab
    # a decode step sends two hidden states (the residual and the FFN output) and the
    # graph inputs, and gets one row of logits back
    assert stats["bytes_received"] >= n_vocab * 4 * (len(PROMPT) + n_steps - 1)
    assert stats["bytes_sent"] >= 2 * n_embd * 4 * n_steps
    assert remote.native_seconds > 0
    close(ctx)


def test_output_product_kept_on_the_host_by_override_tensor(cluster, tiny):
    """`-ot output.weight=cpu`: the device runs its layers and the output norm; the hop back
    carries the normed hidden state instead of a row of logits, and the host runs the
    output product. Same logits and greedy tokens as one process."""
    base, base_greedy, ctx0 = run_model(tiny)
    close(ctx0)
    got, greedy, ctx = run_model(tiny, devices=[DEVICE], n_gpu_layers=2, override_tensor=[r"^output\.weight$=cpu"])
    assert ctx.model.placement.output == DEVICE
    for cg in ctx.graph_cache.entries.values():
        assert cg.assignment[cg.graph.outputs[0].id].backend == "cpu"
    assert np.abs(got - base).max() <= MAX_DELTA
    assert greedy == base_greedy
    stats = ctx.backends[0].run_stats()
    n_embd, n_rows = 64, len(PROMPT) + len(NEXT) + N_GREEDY
    assert stats["bytes_received"] == n_embd * 4 * n_rows  # one hidden state per row, no logits
    close(ctx)


def test_smollm2_split_across_two_ray_nodes_matches_one_process(cluster, smollm2_path):
    base, base_greedy, ctx0 = run_model(smollm2_path)
    close(ctx0)
    got, greedy, ctx = run_model(smollm2_path, devices=[DEVICE], n_gpu_layers=12)
    p = ctx.model.placement
    assert p.layers == ("cpu",) * 19 + (DEVICE,) * 11 and p.output == DEVICE
    assert "token_embd.weight" in p.tied  # also on the device, for the output: from its file
    check_split(ctx, {"cpu", DEVICE})
    assert np.abs(got - base).max() <= MAX_DELTA
    assert greedy == base_greedy
    close(ctx)


def multi_sequence(path: Path, **load) -> tuple[np.ndarray, llama.Context]:
    """Three sequences of different lengths in one batch, then one token for each."""
    model = llama.Model.load(path, **load)
    ctx = llama.Context(model, n_ctx=256, n_batch=32, n_ubatch=32, n_seq_max=3, n_threads=1)
    prompts = [PROMPT, PROMPT[:4], PROMPT[3:9]]
    tokens = [t for p in prompts for t in p]
    seqs = [[s] for s, p in enumerate(prompts) for _ in p]
    pos = [i for p in prompts for i in range(len(p))]
    assert ctx.decode(llama.Batch(tokens=tokens, pos=pos, seq_ids=seqs, logits=[True] * len(tokens))) == 0
    rows = [ctx.get_logits().copy()]
    step = llama.Batch(tokens=NEXT + [7], pos=[len(p) for p in prompts], seq_ids=[[0], [1], [2]],
                       logits=[True] * 3)
    assert ctx.decode(step) == 0
    rows.append(ctx.get_logits().copy())
    return np.concatenate(rows), ctx


def test_multi_sequence_batch_split_across_ray_nodes(cluster, tiny):
    base, ctx0 = multi_sequence(tiny)
    close(ctx0)
    got, ctx = multi_sequence(tiny, devices=[DEVICE], n_gpu_layers=3)
    assert ctx.model.placement.layers == ("cpu", DEVICE, DEVICE)
    assert got.shape == base.shape and np.abs(got - base).max() <= MAX_DELTA
    close(ctx)


def _wait_dead(ray, actor, timeout: float = 30.0) -> None:
    """Until a call to `actor` fails as a dead actor's (a busy machine may run one more
    call that was sent before the kill took effect)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=5)   # still answering, or slow
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            continue
        time.sleep(0.1)
    raise AssertionError("the killed actor still answers")


def test_killed_actor_is_a_fatal_decode_then_a_new_context_works(cluster, tiny, caplog):
    base, _, ctx0 = run_model(tiny)
    close(ctx0)
    model = llama.Model.load(tiny, devices=[DEVICE], n_gpu_layers=2)
    ctx = llama.Context(model, n_ctx=256, n_batch=16, n_ubatch=16, n_threads=1)
    assert ctx.decode(llama.Batch.from_tokens(PROMPT, logits_all=True)) == 0
    actor = ctx.backends[0].actor
    cluster.kill(actor, no_restart=True)
    _wait_dead(cluster, actor)   # ray.kill returns before the actor is gone
    t0 = time.perf_counter()
    with caplog.at_level(logging.ERROR, logger="llama.context"):
        rc = ctx.decode(llama.Batch.from_tokens(NEXT[:1]))
    assert rc == llama.context.DECODE_FATAL
    assert time.perf_counter() - t0 < 30  # nothing waits for the timeout
    text = caplog.text
    assert f"device {DEVICE}" in text and "actor died" in text, text
    # the device stays failed, fast, with the same message
    assert ctx.decode(llama.Batch.from_tokens(NEXT[:1])) == llama.context.DECODE_FATAL
    # a new context starts a fresh actor and computes what one process does
    ctx2 = llama.Context(model, n_ctx=256, n_batch=16, n_ubatch=16, n_threads=1)
    assert ctx2.decode(llama.Batch.from_tokens(PROMPT, logits_all=True)) == 0
    assert np.abs(ctx2.get_logits() - base[:len(PROMPT)]).max() <= MAX_DELTA
    for c in (ctx, ctx2):
        for be in c.backends:
            be.close()
    model.close()


def test_unknown_node_is_refused_at_load(cluster, tiny):
    with pytest.raises(PlacementError, match=r"ray:node-z: no live Ray node has id, IP or custom "
                                             r"resource 'node-z' \(live nodes: node .*node-b"):
        llama.Model.load(tiny, devices=["ray:node-z"], n_gpu_layers=1)
    with pytest.raises(PlacementError, match=r"2 live nodes have IP 127.0.0.1"):
        llama.Model.load(tiny, devices=["ray:127.0.0.1"], n_gpu_layers=1)
    with pytest.raises(PlacementError, match=r"has no GPU"):
        llama.Model.load(tiny, devices=["ray:" + node_b(cluster)[:12] + "/cuda"], n_gpu_layers=1)


def test_without_ray_ggmlpy_works_and_a_ray_device_says_how_to_install(tiny):
    """Runs with or without Ray: a child process where `import ray` fails."""
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import llama, ggmlpy.sched.registry\n"
        f"m = llama.Model.load({str(tiny)!r})\n"
        "ctx = llama.Context(m, n_ctx=256, n_threads=1)\n"
        "assert ctx.decode(llama.Batch.from_tokens([1, 2, 3])) == 0\n"
        "try:\n"
        f"    llama.Model.load({str(tiny)!r}, devices=['ray:node-b'], n_gpu_layers=1)\n"
        "except ggmlpy.sched.registry.PlacementError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ERR device ray:node-b needs Ray" in out.stdout and "pip install 'ggmlpy[ray]'" in out.stdout


def test_importing_ggmlpy_imports_no_ray():
    code = "import sys, ggmlpy, llama, ggmlpy.sched.registry, ggmlpy.distributed; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
