"""The README's quick start is what CI runs: its test command must be .ci/run's."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.startswith("    ")]


def test_quick_start_has_exactly_two_commands():
    cmds = quick_start_commands()
    assert len(cmds) == 2
    assert cmds[0].startswith("python3 -m venv .venv && .venv/bin/pip install . && ")
    assert "ggmlpy run" in cmds[0]


def test_ci_runs_the_readme_test_command():
    test_cmd = quick_start_commands()[1]
    install, run = re.match(r"python3 -m venv \.venv && \.venv/bin/pip install (\S+) && (.+)", test_cmd).groups()
    ci = (ROOT / ".ci" / "run").read_text()
    assert f".venv/bin/pip install -q {install}" in ci
    assert run in ci
