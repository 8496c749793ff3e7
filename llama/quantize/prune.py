"""--prune-layers: llama-quantize's layer pruning (parse_layer_prune and remap_layer).

The listed blocks' tensors are left out and the blocks after them renumbered, so the output
is a model with fewer layers; `{arch}.block_count` is rewritten and nothing else (per-layer
metadata arrays keep their length, as llama.cpp keeps them). Kept apart from plan.py because
the renumbering is a small state machine of its own whose quirks (it walks the tensors in the
loader's order and maps the blocks below the first pruned one to themselves) decide the names.
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

_BLK = re.compile(r"blk\.([0-9]+)\.")   # remap_layer's R"(blk\.(\d+)\.)", searched anywhere in the name
_LAYER_ID = re.compile(r"[0-9]+")


def parse_prune_layers(text: str) -> list[int]:
    """L0,L1,... as llama-quantize reads it: comma-separated layer numbers, sorted, duplicates
    dropped. Stricter than its std::stoi: '1x' is refused rather than read as 1."""
    ids = []
    for part in text.split(","):
        if not _LAYER_ID.fullmatch(part.strip()):
            raise ValueError(f"--prune-layers {text!r}: invalid layer id {part!r} (expected layer numbers "
                             f"separated by commas, e.g. 0,2)")
        ids.append(int(part))
    return sorted(set(ids))


def check_prune_layers(prune: Sequence[int], n_layer: int) -> None:
    """Refuse a list that names a layer the model does not have or that leaves no layer.

    llama-quantize ignores missing layers silently and would write a model of zero layers;
    both are mistakes in the command line, so ggmlpy names them instead."""
    missing = [i for i in prune if not 0 <= i < n_layer]
    if missing:
        raise ValueError(f"--prune-layers: layer {missing[0]} does not exist: the model has {n_layer} layers "
                         f"(0 to {n_layer - 1})")
    if len(set(prune)) >= n_layer:
        raise ValueError(f"--prune-layers: pruning all {n_layer} layers leaves no model")


def rename_layers(names: Iterable[str], prune: Sequence[int]) -> tuple[dict[str, str | None], int | None]:
    """Each input name's output name (None: pruned) and the new block count (None: nothing
    pruned, block_count stays), as remap_layer assigns them walking `names` in the loader's
    order: blocks below the first pruned one keep their number, the others after it take the
    next free number."""
    if not prune:
        return {name: name for name in names}, None
    prune = sorted(set(prune))
    mapped: dict[int, int | None] = {}
    next_id = 0
    out: dict[str, str | None] = {}
    for name in names:
        m = _BLK.search(name)
        if m is None:
            out[name] = name
            continue
        blk = int(m.group(1))
        if blk not in mapped:
            if blk in prune:
                mapped[blk] = None
            elif blk < prune[0]:
                mapped[blk] = blk
                next_id = blk + 1
            else:
                mapped[blk] = next_id
                next_id += 1
        new = mapped[blk]
        out[name] = None if new is None else f"{name[:m.start(1)]}{new}{name[m.end(1):]}"
    return out, next_id
