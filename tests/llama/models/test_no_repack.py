"""Model.load(repack=False), llama.cpp's --no-repack: every weight is read as the file stores
it. The CPU backend then keeps no repacked copy (the weights are resident once), the graph's
weights say so (Flag.FILE_LAYOUT, which changes the graph's signature), and the products on
the file's blocks give llama.cpp's logits as the repacked ones do: the tiny files of
tests/tools/arch_vectors.py whose types the CPU backend repacks (IQ2_XS and IQ2_S as codes in a
larger layout, Q4_0 in the file's size)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import llama
from ggmlpy.ir.tensor import Flag
from ggmlpy.testing.models_archs import write_tiny_model
from tests.tools.arch_vectors import N_GREEDY, VARIANTS

DATA = json.loads((Path(__file__).parent / "data" / "llama_cpp_archs.json").read_text())
MAX_MEAN_LOGSOFTMAX_DIFF = 0.01   # test_archs_llama_cpp.py's bar


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _decode(model: llama.Model, prompt: list[int]) -> tuple[np.ndarray, list[int], llama.Context]:
    ctx = llama.Context(model, n_ctx=64, n_threads=2, backend="cpu")
    assert ctx.decode(llama.Batch.from_tokens(prompt, logits_all=True)) == 0
    logits = np.array([ctx.get_logits_ith(i) for i in range(len(prompt))], dtype=np.float64)
    greedy, last = [], logits[-1]
    for _ in range(N_GREEDY):
        greedy.append(int(np.argmax(last)))
        assert ctx.decode(llama.Batch.from_tokens([greedy[-1]])) == 0
        last = np.array(ctx.get_logits_ith(-1))
    return logits, greedy, ctx


@pytest.mark.parametrize("name", ["llama-iq2_xs", "llama-iq2_s", "mixtral-iq4_nl"])
def test_file_layout_gives_llama_cpps_logits_with_no_repacked_copy(name, tmp_path):
    arch, settings = VARIANTS[name]
    path = write_tiny_model(arch, tmp_path / f"{name}.gguf", **settings)
    ref = DATA[name]
    copies, signatures = {}, {}
    for repack in (True, False):
        model = llama.Model.load(str(path), repack=repack)
        logits, greedy, ctx = _decode(model, ref["prompt"])
        diff = np.abs(_log_softmax(logits) - _log_softmax(np.array(ref["logits"], dtype=np.float64)))
        assert diff.mean() <= MAX_MEAN_LOGSOFTMAX_DIFF, (repack, diff.mean())
        assert greedy == ref["greedy"], repack
        copies[repack] = len(ctx.backends[0].weight_layouts.arrays)
        graphs = [built.graph for built, _ in ctx._built.values()]
        weights = [t for g in graphs for t in g.leafs if t.flags & Flag.WEIGHT]
        assert weights and all(bool(t.flags & Flag.FILE_LAYOUT) is not repack for t in weights)
        signatures[repack] = {g.signature() for g in graphs}
    assert copies[True] > 0 and copies[False] == 0
    assert not signatures[True] & signatures[False]   # no compiled graph is shared between the two


def test_llama_passes_repack_down(tmp_path):
    """Llama(repack=False), as llama-cpp-python's keyword arguments reach Model.load."""
    from llama.api.llama import Llama

    arch, settings = VARIANTS["llama-iq2_xs"]
    path = write_tiny_model(arch, tmp_path / "m.gguf", **settings)
    ref = DATA["llama-iq2_xs"]
    llm = Llama(str(path), repack=False, n_ctx=64, logits_all=True, verbose=False)
    assert llm._model.repack is False
    llm.eval(ref["prompt"])
    assert int(np.argmax(llm.scores)) == ref["greedy"][0]   # scores: the last token's logits
    layouts = llm._model.backend_cache.get("cpu.repacked")
    assert layouts is None or not layouts.arrays
