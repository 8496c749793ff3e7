"""Real uvicorn servers on loopback ephemeral ports, one per configuration (module or
session scoped: each loads SmolLM2 and its compiled graphs once)."""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import httpx
import pytest

from llama.server import Server, ServerConfig, create_app

API_KEY = "test-key-123"


class RunningServer:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.app = create_app(config)
        self.server = Server(self.app, host="127.0.0.1", port=config.port, log_level="warning", lifespan="on",
                             timeout_graceful_shutdown=5)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    @property
    def state(self):
        return self.app.state.server

    def start(self, timeout: float = 180.0) -> "RunningServer":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                r = httpx.get(self.url + "/health", timeout=2)
                if r.status_code == 200:
                    return self
                if r.status_code == 500:
                    raise RuntimeError(r.text)
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError("the server did not become healthy")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def client(self, **kw) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.config.api_keys[0]}"} if self.config.api_keys else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kw.pop("timeout", 60), **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(smollm2_path, **options):
    config = ServerConfig(model=str(smollm2_path), port=free_port(), threads=2, **options)
    server = RunningServer(config).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def server(smollm2_path):
    """4 slots of 512 cells, an API key, metrics on: most tests share it."""
    with running(smollm2_path, parallel=4, ctx_size=2048, api_keys=[API_KEY], metrics=True,
                 alias="smol", max_queue=16) as s:
        yield s
