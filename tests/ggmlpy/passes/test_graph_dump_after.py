"""`ggmlpy graph --dump-after PASS`: the graph as a given pass of the pipeline leaves it."""
from __future__ import annotations

import re

import pytest

from ggmlpy.cli import main
from ggmlpy.testing.models import write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(write_tiny_llama(tmp_path_factory.mktemp("dump") / "tiny.gguf", n_layer=2))


def dump(capsys, *args) -> str:
    assert main(["graph", "-m", *args]) == 0
    return capsys.readouterr().out


def node_count(text: str) -> int:
    return int(re.search(r"after pass \w+ \((\d+) nodes\)", text).group(1))


def test_each_pass_shows_its_own_graph(tiny, capsys):
    built = dump(capsys, tiny, "--ubatch", "4", "-c", "256")
    n_built = int(re.search(r"graph: (\d+) nodes", built).group(1))
    after_dce = node_count(dump(capsys, tiny, "--ubatch", "4", "-c", "256", "--dump-after", "dce"))
    after_views = node_count(dump(capsys, tiny, "--ubatch", "4", "-c", "256", "--dump-after", "views"))
    assert after_dce == n_built  # nothing is dead in a freshly built llama graph
    assert after_views < after_dce  # view chains fold (2 layers: V's reshape round trip, K/V views)
    fused = dump(capsys, tiny, "--ubatch", "4", "-c", "256", "--dump-after", "fusion")
    assert "norm_mul" in fused and "glu_product" in fused
    planned = dump(capsys, tiny, "--ubatch", "4", "-c", "256", "--dump-after", "buffers")
    arena, no_reuse = re.search(r"arena ([\d.]+) MiB.*without reuse ([\d.]+) MiB", planned).groups()
    assert 0 < float(arena) < float(no_reuse)


def test_unknown_pass_is_rejected(tiny, capsys):
    with pytest.raises(SystemExit):
        main(["graph", "-m", tiny, "--dump-after", "nonsense"])
    assert main(["graph", "-m", tiny, "--dump-after", "views", "--pipeline", "ref"]) == 1
    assert "the ref pipeline runs" in capsys.readouterr().err
