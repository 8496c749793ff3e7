"""Replicas on Ray Serve: a real local Ray cluster on loopback, two engine replicas of
SmolLM2 behind the ingress on an ephemeral loopback port, driven by the `openai` client
and plain HTTP, against `ggmlpy serve`'s own app with the same settings."""
from __future__ import annotations

import os
import threading
import time

import pytest

# read when Ray is imported: a cluster started here has 127.0.0.1 as its address, and
# every Ray server then listens on loopback only (llama/server/ray_serve/run.py)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray", reason="Ray Serve tests need the extra: pip install 'ggmlpy[ray]'")
serve = pytest.importorskip("ray.serve", reason="Ray Serve tests need the extra: "
                            "pip install 'ggmlpy[ray]'")

import httpx  # noqa: E402
import openai  # noqa: E402

from llama.server.ray_serve.app import ENGINE, build_app  # noqa: E402
from llama.server import ServerConfig  # noqa: E402
from tests.llama.server.conftest import RunningServer, free_port  # noqa: E402

APP = "ggmlpy-test"
MSGS = [{"role": "user", "content": "Name three colors."}]
SYSTEM = "You are a terse assistant. Answer in one short sentence, in English."


def _config(path, port: int, **kw) -> ServerConfig:
    return ServerConfig(model=str(path), port=port, parallel=2, ctx_size=1024, threads=1,
                        metrics=True, alias="smol", **kw)


@pytest.fixture(scope="module")
def cluster(smollm2_path):
    """Ray on loopback (a new local cluster, never one found on the machine), Serve's HTTP
    on an ephemeral loopback port, the app first scaled to zero, then two engine replicas;
    /health is polled meanwhile and the answers recorded for the test."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    with pytest.MonkeyPatch.context() as mp:  # in case another module imported Ray first
        mp.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
        ctx = ray.init(address="local", num_cpus=2, include_dashboard=False,
                       log_to_driver=False)
    port = free_port()
    try:
        assert ctx.address_info["gcs_address"].startswith("127.0.0.1:")
        assert ray.util.get_node_ip_address() == "127.0.0.1"
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        url = f"http://127.0.0.1:{port}"
        config = _config(smollm2_path, port)
        # first scaled to zero (autoscaling passed through): the front is up, no replica
        serve.run(build_app(config, autoscaling={"min_replicas": 0, "initial_replicas": 0,
                                                 "max_replicas": 1}), name=APP, route_prefix="/")
        before = httpx.get(url + "/health", timeout=30)
        seen: list[tuple[int, str]] = []
        deployed = threading.Event()

        def poll() -> None:
            while not deployed.is_set():
                r = httpx.get(url + "/health", timeout=30)
                seen.append((r.status_code, r.text))
                time.sleep(0.2)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        serve.run(build_app(config, num_replicas=2), name=APP, route_prefix="/")
        deployed.set()
        poller.join(timeout=30)
        yield {"url": url, "before": (before.status_code, before.text), "seen": seen}
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def plain(smollm2_path):
    """`ggmlpy serve`'s app alone, same slots and threads: the reference answers."""
    server = RunningServer(_config(smollm2_path, free_port())).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oai(cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster["url"] + "/v1", api_key="none", timeout=60,
                         max_retries=0)


def test_health_is_503_until_a_replica_has_loaded(cluster):
    status, text = cluster["before"]
    assert status == 503 and "Loading model" in text
    assert all(s in (200, 503) for s, _ in cluster["seen"])  # never an error while loading
    r = httpx.get(cluster["url"] + "/health", timeout=30)
    assert r.status_code == 200 and r.json()["replicas"] == 2


def test_chat_completion_and_stream_match_ggmlpy_serve(oai, plain):
    ref = openai.OpenAI(base_url=plain.url + "/v1", api_key="none", timeout=60, max_retries=0)
    args = {"model": "smol", "messages": MSGS, "max_tokens": 10, "temperature": 0}
    full = oai.chat.completions.create(**args)
    assert full.choices[0].message.content == ref.chat.completions.create(**args).choices[0].message.content
    assert full.usage.completion_tokens == 10 and full.choices[0].finish_reason == "length"
    parts = [c.choices[0].delta.content or "" for c in
             oai.chat.completions.create(**args, stream=True) if c.choices]
    assert "".join(parts) == full.choices[0].message.content != ""
    comp = {"model": "smol", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    text = oai.completions.create(**comp).choices[0].text
    assert text == ref.completions.create(**comp).choices[0].text != ""
    streamed = "".join(c.choices[0].text for c in oai.completions.create(**comp, stream=True))
    assert streamed == text


def test_errors_have_the_servers_shapes(oai, cluster):
    with pytest.raises(openai.NotFoundError):   # an unknown route (any model name is served)
        oai.post("/no-such-route", cast_to=object, body={})
    r = httpx.post(cluster["url"] + "/v1/chat/completions", json={"messages": "x"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    big = httpx.post(cluster["url"] + "/v1/completions", content=b"x" * (9 << 20), timeout=30)
    assert big.status_code == 413


def test_a_conversation_stays_on_its_replica(oai):
    served = []
    for topic in ("the sea", "mountains", "a red fox", "the moon"):
        chat = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Say something about {topic}."}]
        first = oai.chat.completions.with_raw_response.create(
            model="smol", messages=chat, max_tokens=6, temperature=0)
        reply = first.parse().choices[0].message.content
        chat += [{"role": "assistant", "content": reply}, {"role": "user", "content": "More."}]
        second = oai.chat.completions.with_raw_response.create(
            model="smol", messages=chat, max_tokens=4, temperature=0)
        served.append((first.headers["x-ggmlpy-replica"], second.headers["x-ggmlpy-replica"]))
    assert all(a == b for a, b in served), served  # chance alone: 1 in 16


def test_metrics_and_slots_sum_the_replicas(cluster):
    url = cluster["url"]

    def prompt_tokens() -> float:
        text = httpx.get(url + "/metrics", timeout=30).text
        assert "ggmlpy:replicas 2" in text
        return float(next(line.split()[1] for line in text.splitlines()
                          if line.startswith("llamacpp:prompt_tokens_total")))

    before, evaluated, replicas = prompt_tokens(), 0, set()

    def complete(i: int) -> httpx.Response:
        r = httpx.post(url + "/completion", json={"prompt": f"Number {i}: once upon a time",
                                                 "n_predict": 16, "cache_prompt": False},
                       timeout=60)
        r.raise_for_status()
        return r

    from concurrent.futures import ThreadPoolExecutor
    for round_ in range(3):  # 4 at once over 2 replicas of 2 slots: the router spreads them
        with ThreadPoolExecutor(4) as pool:
            for r in pool.map(complete, range(4 * round_, 4 * round_ + 4)):
                evaluated += r.json()["tokens_evaluated"]
                replicas.add(r.headers["x-ggmlpy-replica"])
        if len(replicas) == 2:
            break
    assert len(replicas) == 2
    assert prompt_tokens() - before == evaluated
    slots = httpx.get(url + "/slots", timeout=30).json()
    assert len(slots) == 4 and {s["replica"] for s in slots} == replicas


def test_a_dropped_stream_frees_its_slot_on_the_replica(cluster):
    url = cluster["url"]

    def busy() -> int:
        return sum(s["is_processing"] for s in httpx.get(url + "/slots", timeout=30).json())

    with httpx.Client(timeout=60) as c:
        with c.stream("POST", url + "/v1/completions", json={
                "prompt": "Count: 1, 2, 3,", "max_tokens": 400, "stream": True,
                "ignore_eos": True}) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
            assert busy() == 1
    deadline = time.monotonic() + 15
    while busy() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert busy() == 0


def test_one_replica_killed_the_other_keeps_serving(oai, cluster):
    victim = oai.completions.with_raw_response.create(
        model="smol", prompt="Hello", max_tokens=2).headers["x-ggmlpy-replica"]
    name = f"SERVE_REPLICA::{APP}#{ENGINE}#{victim}"
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    _wait_dead(name)   # ray.kill returns before the actor is gone: loaded, it still answered
    served = _serving_again(oai, within_s=45)
    assert victim not in served


def _wait_dead(name: str, within_s: float = 30) -> None:
    """Until the named actor has left Ray's registry (its death processed)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace="serve")
        except ValueError:
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} still registered {within_s} s after ray.kill")


def test_a_replica_dying_mid_stream_ends_the_stream_with_an_error_event(oai, cluster):
    """The stream's status line is sent already, so the failure arrives as a last SSE event
    (an OpenAI-shaped error, 503), promptly: the client neither hangs nor gets [DONE]; the
    next requests are served by the remaining (or restarted) replica."""
    import json

    url = cluster["url"]
    _serving_again(oai)  # the previous test may have left one replica restarting
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", url + "/v1/completions", json={
                "model": "smol", "prompt": "Count: 1, 2, 3,", "max_tokens": 2000,
                "stream": True, "ignore_eos": True}) as r:
            assert r.status_code == 200
            victim = r.headers["x-ggmlpy-replica"]
            events = (line[len("data: "):] for line in r.iter_lines() if line.startswith("data: "))
            for _ in range(3):
                assert "choices" in json.loads(next(events))
            ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP}#{ENGINE}#{victim}", namespace="serve"),
                     no_restart=True)
            t0 = time.monotonic()
            rest = list(events)  # ends: the relay's error event, then the connection closes
            waited = time.monotonic() - t0
    assert waited < 20, f"the stream took {waited:.1f} s to end after its replica died"
    assert "[DONE]" not in rest and len(rest) < 2000
    last = json.loads(rest[-1])
    assert last["error"]["code"] == 503 and "no engine replica" in last["error"]["message"]
    served = _serving_again(oai)
    assert victim not in served


def _serving_again(oai: openai.OpenAI, within_s: float = 60) -> list[str]:
    """Wait (bounded) until 4 requests in a row succeed, Serve routing around a dead
    replica; the ids of every replica that answered meanwhile."""
    deadline, ok, served = time.monotonic() + within_s, 0, []
    while ok < 4 and time.monotonic() < deadline:
        try:
            r = oai.completions.with_raw_response.create(model="smol", prompt="Hi", max_tokens=2)
            served.append(r.headers["x-ggmlpy-replica"])
            ok += 1
        except (openai.APIStatusError, openai.APIConnectionError):
            ok = 0
            time.sleep(0.2)
    assert ok == 4, f"requests kept failing (served: {served})"
    return served


def test_merged_metrics_sum_counters_and_recompute_rates():
    from llama.server.ray_serve.metrics import merge_metrics

    def text(tokens: float, seconds: float, usage: float) -> str:
        return ("# TYPE llamacpp:tokens_predicted counter\n"
                f"llamacpp:tokens_predicted_total {tokens}\n"
                "# TYPE llamacpp:tokens_predicted_seconds counter\n"
                f"llamacpp:tokens_predicted_seconds_total {seconds}\n"
                "# TYPE llamacpp:predicted_tokens_seconds gauge\n"
                f"llamacpp:predicted_tokens_seconds {tokens / seconds}\n"
                "# TYPE llamacpp:kv_cache_usage_ratio gauge\n"
                f"llamacpp:kv_cache_usage_ratio {usage}\n")

    merged = dict(line.split() for line in merge_metrics([text(100, 1, 0.5), text(300, 5, 0.1)])
                  .splitlines() if not line.startswith("#"))
    assert float(merged["llamacpp:tokens_predicted_total"]) == 400
    assert float(merged["llamacpp:predicted_tokens_seconds"]) == 400 / 6  # not (100 + 60) / 2
    assert float(merged["llamacpp:kv_cache_usage_ratio"]) == 0.3
    assert merged["ggmlpy:replicas"] == "2"


def test_serve_run_arguments_are_read_as_their_fields_types():
    """`serve run llama.server.ray_serve.app:app_builder key=value ...`: every value
    arrives as a string; each becomes its ServerConfig field's type."""
    from llama.server.ray_serve.app import config_from_strings

    cfg = config_from_strings({"model": "m.gguf", "parallel": "2", "temp": "0.5", "metrics": "true",
                               "devices": "cpu:1", "n_gpu_layers": "99", "tensor_split": "3,1",
                               "override_tensor": r"token_embd=cpu,blk\.0\.=cpu"})
    assert (cfg.model, cfg.parallel, cfg.temp, cfg.metrics) == ("m.gguf", 2, 0.5, True)
    assert (cfg.devices, cfg.n_gpu_layers, cfg.tensor_split) == (["cpu:1"], 99, [3.0, 1.0])
    assert cfg.override_tensor == ["token_embd=cpu", r"blk\.0\.=cpu"]
    with pytest.raises(ValueError, match="unknown arguments \\['gpu'\\]"):
        config_from_strings({"model": "m.gguf", "gpu": "1"})
