"""Cancellation and faults: dropped streams free their slots, a full queue answers 503,
hostile requests leave the server healthy and the KV cache consistent."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.llama.server.conftest import running


def _busy_slots(c: httpx.Client) -> int:
    return sum(s["is_processing"] for s in c.get("/slots").json())


def _wait_idle(c: httpx.Client, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while _busy_slots(c) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _busy_slots(c) == 0


def test_dropped_stream_frees_its_slot(server):
    with server.client() as c:
        _wait_idle(c)
        with c.stream("POST", "/v1/completions", json={"prompt": "Count: 1, 2, 3,",
                                                       "max_tokens": 400, "stream": True,
                                                       "ignore_eos": True}) as r:
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)
            assert _busy_slots(c) == 1
        _wait_idle(c, 5)
        assert c.post("/completion", json={"prompt": "Hi", "n_predict": 2}).status_code == 200


@pytest.mark.parametrize("stream", [True, False])
def test_dropped_request_of_n_choices_frees_every_slot(server, stream):
    body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 400, "ignore_eos": True, "n": 3,
            "stream": stream}
    with server.client() as c:
        _wait_idle(c)
        if stream:
            with c.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                for _ in range(6):
                    next(lines)
                assert _busy_slots(c) == 3
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(server.url + "/v1/completions", json=body, headers=c.headers, timeout=1.0)
        _wait_idle(c, 5)
        assert c.post("/completion", json={"prompt": "Hi", "n_predict": 2}).status_code == 200


def _wait_no_request_running(server, timeout: float = 5) -> None:
    """uvicorn keeps a task per request being answered: none may be left waiting once the
    clients are gone (a handler that waited forever also held up every shutdown)."""
    deadline = time.monotonic() + timeout
    while server.server.server_state.tasks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.server.server_state.tasks


@pytest.mark.parametrize("body", [{"prompt": "Count:", "n_predict": 400},
                                  {"prompt": "Count:", "max_tokens": 400, "n": 2}],
                         ids=["completion", "n_choices"])
def test_dropped_non_streaming_request_frees_its_slot_and_its_handler(server, body):
    route = "/completion" if "n_predict" in body else "/v1/completions"
    with server.client() as c:
        _wait_idle(c)
        for _ in range(2):
            with pytest.raises(httpx.ReadTimeout):
                # ignore_eos: a sampled end of text must not finish it within the timeout
                httpx.post(server.url + route, json=dict(body, ignore_eos=True),
                           headers=c.headers, timeout=1.0)
        _wait_idle(c, 5)
    _wait_no_request_running(server)


def test_hostile_mix_leaves_the_server_healthy(server):
    def hostile(i: int) -> int:
        with server.client(timeout=30) as c:
            kind = i % 4
            if kind == 0:
                return c.post("/v1/completions", json={"prompt": "x " * 5000, "max_tokens": 2}).status_code
            if kind == 1:
                return c.post("/v1/completions", content=b'{"prompt": "\xff\xfe\xc3", "max_tokens": 2}',
                              headers={"Content-Type": "application/json"}).status_code
            if kind == 2:
                try:
                    httpx.post(server.url + "/completion",
                               json={"prompt": "Go", "n_predict": 300, "ignore_eos": True},
                               headers=c.headers, timeout=0.5)
                except httpx.ReadTimeout:
                    return 0
                return 200
            return c.post("/completion", json={"prompt": "\udcff" if False else "ok \u00e9",
                                               "n_predict": 3}).status_code
    with ThreadPoolExecutor(8) as ex:
        codes = list(ex.map(hostile, range(16)))
    assert set(codes) <= {0, 200, 400}
    with server.client() as c:
        _wait_idle(c, 10)
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        engine = server.state.scheduler.engine
        mem = engine.ctx.memory
        for sid in range(4):  # the cache holds exactly the tokens each slot records
            n = engine.n_past(sid)
            assert (mem.seq_pos_max(sid) + 1 if n else 0) == n
        assert c.post("/completion", json={"prompt": "Hello", "n_predict": 2}).status_code == 200


def test_full_queue_answers_503(smollm2_path):
    with running(smollm2_path, parallel=1, ctx_size=512, max_queue=1) as server:
        def long_request() -> int:
            # ignore_eos: the slot stays busy for all 300 tokens (seconds), whatever is sampled
            return httpx.post(server.url + "/completion",
                              json={"prompt": "Count:", "n_predict": 300, "ignore_eos": True},
                              timeout=60).status_code
        with ThreadPoolExecutor(2) as ex:
            running_one = ex.submit(long_request)
            time.sleep(0.5)
            queued = ex.submit(long_request)
            time.sleep(0.3)
            r = httpx.post(server.url + "/completion", json={"prompt": "x", "n_predict": 1}, timeout=10)
            assert r.status_code == 503 and r.headers["Retry-After"]
            assert r.json()["error"]["type"] == "unavailable_error"
            assert running_one.result(60) == 200 and queued.result(60) == 200


def test_a_silent_stream_is_pinged(server):
    """sse_ping_interval: a stream waiting for a slot gets ":" comment lines (llama-server's
    keep-alive) every second, and then its chunks as usual."""
    busy = {"prompt": "Count: 1, 2, 3,", "n_predict": 400, "ignore_eos": True, "temperature": 0}
    with server.client() as c:
        _wait_idle(c)
        with ThreadPoolExecutor(4) as ex:
            holders = [ex.submit(c.post, "/completion", json=busy) for _ in range(4)]
            deadline = time.monotonic() + 20
            while _busy_slots(c) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            lines = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "stream": True,
                                                    "sse_ping_interval": 1}).text.splitlines()
            assert all(h.result().status_code == 200 for h in holders)
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert ":" in lines[:first_data] and lines[-2:] == ["data: [DONE]", ""]
