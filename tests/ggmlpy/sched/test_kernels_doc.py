"""docs/kernels.md stays true: the files it names exist, and its worked example is in the code."""
from __future__ import annotations

import re
from pathlib import Path

from ggmlpy.codegen_cpu import kernels as _kernels  # noqa: F401  (fills the lowering table)
from ggmlpy.codegen_cpu.lowering import LOWERINGS
from ggmlpy.ir.ops import OPS, Kind

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "kernels.md").read_text()


def test_every_path_the_guide_names_exists():
    paths = set(re.findall(r"`((?:ggmlpy|tests|templates|docs)/[\w/.]+)`", DOC))
    assert len(paths) >= 10
    missing = [p for p in sorted(paths) if "<" not in p and not (ROOT / p).exists()]
    assert missing == []


def test_the_worked_example_is_in_the_code():
    snippets = re.findall(r"```python\n(.*?)```", DOC, re.S)
    example = snippets[-5:]  # the op, its formula, the oracle, the CPU and CUDA primitives
    files = ["ggmlpy/ir/ops/elementwise.py", "ggmlpy/ir/ops/formulas.py", "tests/ggmlpy/ir/oracles.py",
             "ggmlpy/codegen_cpu/kernels/elementwise.py", "ggmlpy/codegen_cuda/lower_elementwise.py"]
    for snippet, path in zip(example, files):
        first = snippet.strip().splitlines()[0].strip()
        assert first in (ROOT / path).read_text(), (path, first)
    assert OPS["abs"].kind == Kind.ELEMENTWISE and len(list(OPS["abs"].cases())) == 5
    assert "abs" in LOWERINGS
