"""Debian's chromium driven by playwright, for the tests of pages (no `playwright install`:
the system binary is used). `needs_browser` skips where either is missing; `chromium()`
launches one for a module's tests."""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from typing import Iterator

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - CI installs it (the test extra)
    sync_playwright = None

needs_browser = pytest.mark.skipif(
    sync_playwright is None or CHROMIUM is None,
    reason="needs playwright (pip) and Debian's chromium (apt-get install -y chromium); CI has both")


@contextmanager
def chromium() -> Iterator:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()
