"""Fixtures for the viz tests: snapshots of SmolLM2's prompt graph, made once per module.

The main one places 4 layers (and the output) on a second CPU backend (`cpu:1`), so the
graph has two CPU splits with copies between them, and both generate LLVM IR.
"""
from __future__ import annotations

import pytest

from ggmlpy.cli.viz_model import build_graph, place
from ggmlpy.viz.data import page_data
from ggmlpy.viz.snapshot import Snapshot, take_snapshot
from llama.model import Model

N_TOKENS = 512
N_CTX = 1024


def snapshot_of(model: Model, devices: list[str] | None, n_gpu_layers: int, code: bool = True,
                n_tokens: int = N_TOKENS) -> Snapshot:
    graph, n_ctx = build_graph(model, n_tokens, N_CTX)
    placement, backends = place(model, devices, n_gpu_layers)
    return take_snapshot(model.path.name, graph, n_tokens, n_ctx, backends, placement, code=code)


@pytest.fixture(scope="session")
def smollm2(smollm2_path) -> Model:
    return Model.load(str(smollm2_path))


@pytest.fixture(scope="session")
def split_snapshot(smollm2) -> Snapshot:
    return snapshot_of(smollm2, ["cpu:1"], 4)


@pytest.fixture(scope="session")
def split_data(split_snapshot) -> dict:
    return page_data(split_snapshot)


def expected_boxes(data: dict, open_layers=frozenset(), open_groups=frozenset()) -> set[str]:
    """The boxes the page must draw for an expansion state, from the data alone: a tensor is
    its layer's box while that layer is closed, else its fusion group's while that is closed,
    else itself; a copy is drawn in its reader's layer."""
    tensors = data["tensors"]
    group_of = {u: i for i, g in enumerate(data["groups"]) for u in g["nodes"]}

    def rep(u: int) -> str:
        layer = tensors[u].get("layer")
        if layer is not None and layer not in open_layers:
            return f"L{layer}"
        if u in group_of and group_of[u] not in open_groups:
            return f"G{group_of[u]}"
        return f"t{u}"

    boxes = {rep(u) for u in data["graph"]["order"]}
    for i, c in enumerate(data["copies"]):
        layer = tensors[c["consumer"]].get("layer")
        boxes.add(f"L{layer}" if layer is not None and layer not in open_layers else f"c{i}")
    return boxes
