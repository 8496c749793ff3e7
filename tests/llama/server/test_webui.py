"""The chat page's routes without a browser or a model (tests/llama/server/test_chat_page.py drives
it in chromium): on by default as llama-server's UI, public under `--api-key` while the API
stays guarded, a 404 in the usual error shape with `--no-ui`, only this server's files
referenced, and shipped as package data."""
from __future__ import annotations

import re
from fnmatch import fnmatch
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from ggmlpy.cli import build_parser
from ggmlpy.cli.serve_cmd import config_from_args
from llama.server import ServerConfig, create_app
from llama.server.webui import FILES, PATHS, STATIC

REPO = Path(__file__).resolve().parents[3]


def client(**options) -> TestClient:
    """The app without its lifespan: no model is loaded, the routes answer."""
    return TestClient(create_app(ServerConfig(model="none.gguf", **options)))


def test_the_page_is_on_by_default_and_no_ui_turns_it_off():
    parse = build_parser().parse_args
    assert config_from_args(parse(["serve", "-m", "m"])).webui is True
    assert ServerConfig(model="m").webui is True
    for flag in ("--no-ui", "--no-webui"):
        assert config_from_args(parse(["serve", "-m", "m", flag])).webui is False


def test_the_page_and_its_files_are_public_and_the_api_is_not():
    c = client(api_keys=["k"])
    for path, (name, media_type) in FILES.items():
        r = c.get(path)
        assert r.status_code == 200 and r.headers["content-type"] == media_type
        assert r.content == (STATIC / name).read_bytes()
        assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert 'id="send"' in c.get("/").text
    assert c.post("/v1/chat/completions", json={"messages": []}).status_code == 401


@pytest.mark.parametrize("keys", [[], ["k"]])
def test_no_ui_answers_404_in_the_error_shape(keys):
    c = client(api_keys=keys, webui=False)
    r = c.get("/")
    assert r.status_code == 404
    assert r.json() == {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}
    assert c.get("/index.html").status_code == (401 if keys else 404)   # only `/` stays public


def test_the_page_references_only_its_own_files():
    """No CDN: every src/href of the page is one of the server's paths (or the empty icon)."""
    html = (STATIC / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert refs and all(ref in PATHS or ref == "data:," for ref in refs)
    assert sorted(FILES[p][0] for p in PATHS) == sorted(["index.html", "index.html", "chat.css", "chat.js"])


def test_the_files_are_package_data():
    tomllib = pytest.importorskip("tomllib")
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = package_data["llama.server"]
    base = REPO / "llama" / "server"
    for path in STATIC.iterdir():
        assert any(fnmatch(path.relative_to(base).as_posix(), g) for g in globs), path
