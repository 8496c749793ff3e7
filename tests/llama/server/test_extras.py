"""What the main server fixture does not cover: the embeddings endpoints (against the
Llama API), slot files (save, erase, restore), CORS on request only, and SIGTERM on a real
`ggmlpy serve` process."""
import base64
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from llama import Llama
from tests.llama.server.conftest import free_port, running

TEXTS = ["The capital of France is Paris.", "Cats sleep a lot"]


def test_embeddings_endpoints_match_the_api(smollm2_path):
    """Pooled embeddings as llama-server gives them: normalised by `embd_normalize` (2,
    Euclidean, by default), as floats or as OpenAI's base64 (which the official client asks
    for when numpy is installed, and decodes)."""
    ref = Llama(str(smollm2_path), n_ctx=256, embedding=True, pooling_type="mean", verbose=False)
    raw = [np.asarray(v, dtype=np.float64) for v in ref.embed(TEXTS)]
    unit = [v / np.linalg.norm(v) for v in raw]
    with running(smollm2_path, parallel=2, ctx_size=1024, embedding=True, pooling="mean") as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", timeout=60, max_retries=0)
        for encoding in ({}, {"encoding_format": "float"}, {"encoding_format": "base64"}):
            # none given: the client asks for base64 itself and decodes it
            out = client.embeddings.create(model=s.config.model_name, input=TEXTS, **encoding)
            assert [d.index for d in out.data] == [0, 1]
            for d, vec in zip(out.data, unit):
                got = d.embedding
                if isinstance(got, str):
                    got = np.frombuffer(base64.b64decode(got), dtype="<f4")
                np.testing.assert_allclose(got, vec, rtol=1e-4, atol=1e-5)
        n_tokens = sum(len(ref.tokenize(t.encode())) for t in TEXTS)
        assert out.usage.prompt_tokens == n_tokens
        native = httpx.post(s.url + "/embedding", json={"content": TEXTS[0]}, timeout=60).json()
        np.testing.assert_allclose(native[0]["embedding"][0], unit[0], rtol=1e-4, atol=1e-5)
        expected = {-1: raw[0], 0: raw[0] * 32760 / np.abs(raw[0]).max(),
                    1: raw[0] / np.abs(raw[0]).sum(), 3: raw[0] / (np.abs(raw[0]) ** 3).sum() ** (1 / 3)}
        for norm, vec in expected.items():
            got = httpx.post(s.url + "/embedding", json={"content": TEXTS[0], "embd_normalize": norm},
                             timeout=60).json()[0]["embedding"][0]
            np.testing.assert_allclose(got, vec, rtol=1e-4, atol=1e-4 * np.abs(vec).max())
        bad = httpx.post(s.url + "/v1/embeddings", json={"input": "x", "encoding_format": "hex"}, timeout=60)
        assert bad.status_code == 400 and "encoding_format" in bad.json()["error"]["message"]


def test_embeddings_without_pooling(smollm2_path):
    """Pooling none: /embedding gives every token's row, unnormalised; the OpenAI route
    refuses, as llama-server ("not OAI compatible")."""
    ref = Llama(str(smollm2_path), n_ctx=256, embedding=True, verbose=False)
    rows = ref.embed(TEXTS[1])
    with running(smollm2_path, parallel=1, ctx_size=512, embedding=True) as s:
        r = httpx.post(s.url + "/v1/embeddings", json={"input": TEXTS[1]}, timeout=60)
        assert r.status_code == 400 and "not OAI compatible" in r.json()["error"]["message"]
        native = httpx.post(s.url + "/embedding", json={"content": TEXTS[1]}, timeout=60).json()
        np.testing.assert_allclose(native[0]["embedding"], rows, rtol=1e-4, atol=1e-4)


def test_slot_files_save_erase_restore(smollm2_path, tmp_path):
    with running(smollm2_path, parallel=1, ctx_size=512, slot_save_path=str(tmp_path)) as s:
        with s.client() as c:
            body = {"prompt": "The capital of France is", "n_predict": 6, "temperature": 0, "id_slot": 0}
            first = c.post("/completion", json=body).json()
            n_past = c.get("/slots").json()[0]["n_past"]
            assert n_past > 0
            saved = c.post("/slots/0?action=save", json={"filename": "s.bin"}).json()
            assert saved["n_saved"] == n_past and (tmp_path / "s.bin").is_file()
            assert c.post("/slots/0?action=erase").json()["n_erased"] == n_past
            assert c.get("/slots").json()[0]["n_past"] == 0
            n_prompt = len(c.post("/tokenize", json={"content": body["prompt"]}).json()["tokens"])
            erased = c.post("/completion", json=body).json()
            assert erased["tokens_cached"] == 0 and erased["content"] == first["content"]
            restored = c.post("/slots/0?action=restore", json={"filename": "s.bin"}).json()
            assert restored["n_restored"] == n_past and c.get("/slots").json()[0]["n_past"] == n_past
            again = c.post("/completion", json=body).json()
            assert again["content"] == first["content"]
            assert again["tokens_cached"] == n_prompt - 1  # the restored cells were reused
            bad = c.post("/slots/0?action=restore", json={"filename": "../../etc/passwd"})
            assert bad.status_code == 400


PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}


def test_cors_as_llama_server(smollm2_path):
    """llama-server's CORS: any Origin reflected by default (a preflight answered 200 before
    the API key is asked for, with its methods, headers and credentials); `localhost` only
    local origins; a list only those on it."""
    with running(smollm2_path, parallel=1, ctx_size=256, api_keys=["k"]) as s:
        pre = httpx.options(s.url + "/completions", headers={"Origin": "web.mydomain.fr", **PREFLIGHT}, timeout=10)
        assert pre.status_code == 200 and pre.text == ""
        assert pre.headers["access-control-allow-origin"] == "web.mydomain.fr"
        assert pre.headers["access-control-allow-credentials"] == "true"
        assert pre.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
        assert pre.headers["access-control-allow-headers"] == "*"
        r = httpx.get(s.url + "/health", headers={"Origin": "http://app.example"}, timeout=10)
        assert r.headers["access-control-allow-origin"] == "http://app.example"
        refused = httpx.post(s.url + "/completion", json={"prompt": "a"}, headers={"Origin": "http://a.b"}, timeout=10)
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "http://a.b"
    with running(smollm2_path, parallel=1, ctx_size=256, cors_origins="localhost") as s:
        for origin, allowed in (("http://localhost:8080", True), ("http://[::1]:3000", True), ("http://127.0.0.1", True),
                                ("http://localhost.evil.com", False), ("http://evil.com", False)):
            pre = httpx.options(s.url + "/completions", headers={"Origin": origin, **PREFLIGHT}, timeout=10)
            assert pre.status_code == 200
            assert pre.headers.get("access-control-allow-origin") == (origin if allowed else None), origin
    with running(smollm2_path, parallel=1, ctx_size=256, cors_origins="http://app.example, http://b.example") as s:
        r = httpx.get(s.url + "/health", headers={"Origin": "http://b.example"}, timeout=10)
        assert r.headers["access-control-allow-origin"] == "http://b.example"
        other = httpx.get(s.url + "/health", headers={"Origin": "http://evil.example"}, timeout=10)
        assert "access-control-allow-origin" not in other.headers


def test_sigterm_stops_cleanly(smollm2_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ggmlpy", "serve", "-m", str(smollm2_path), "--port",
                             str(port), "-np", "1", "-c", "512", "-t", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        else:
            pytest.fail("the server did not start")
        result: dict = {}

        def stream() -> None:
            try:
                with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                                  json={"prompt": "Once upon a time", "max_tokens": 400,
                                        "stream": True}) as r:
                    result["lines"] = sum(1 for line in r.iter_lines() if line.startswith("data:"))
            except httpx.HTTPError as e:
                result["error"] = type(e).__name__

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(1.0)  # generating
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        t.join(timeout=60)
        assert not t.is_alive()  # the client was answered or cut off, not left hanging
        assert result.get("lines", 0) > 0 or "error" in result
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_several_listening_addresses(smollm2_path):
    """llama-server's --host with a comma-separated list: the server answers on each."""
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ggmlpy", "serve", "-m", str(smollm2_path), "--host", "127.0.0.1,::1",
                             "--port", str(port), "-np", "1", "-c", "256", "-t", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        answers = {}
        deadline = time.monotonic() + 180
        for host in ("127.0.0.1", "[::1]"):
            while time.monotonic() < deadline and answers.get(host) != 200:   # 503 while loading
                try:
                    answers[host] = httpx.get(f"http://{host}:{port}/health", timeout=2).status_code
                except httpx.TransportError:
                    pass
                time.sleep(0.3)
        assert answers == {"127.0.0.1": 200, "[::1]": 200}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_post_props_with_the_flag(smollm2_path):
    """llama-server's POST /props with --props: success, and no property changes."""
    with running(smollm2_path, ctx_size=512, props=True) as s, s.client() as c:
        before = c.get("/props").json()
        r = c.post("/props", json={"default_generation_settings": {"n_ctx": 7}})
        assert r.status_code == 200 and r.json() == {"success": True}
        assert c.get("/props").json() == before
