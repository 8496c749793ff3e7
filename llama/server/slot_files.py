"""`POST /slots/{id}?action=save|restore|erase`: a slot's KV cells to a file and back
(llama-server's slot persistence), so a long prompt is read once across restarts. The
file holds the slot's tokens, the cache's types (a file of other -ctk/-ctv types is refused)
and, per layer, the K and V rows of its cells by position (a quantised cache's as its blocks'
bytes); for a hybrid model also its recurrent states (every recurrent layer's row, `rs:` names)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ggmlpy.ir.types import GGMLType
from llama.api.engine import Engine
from llama.batch import UBatch
from llama.kv_cache import KVCache
from llama.kv_cells import SlotInfo
from llama.kv_types import KV_TYPE_NAMES
from llama.memory_hybrid import HybridMemory
from llama.recurrent import RSSeqState
from llama.server.errors import APIError

RS_PREFIX = "rs:"


def _cache(engine: Engine) -> KVCache:
    mem = engine.ctx.memory
    if isinstance(mem, HybridMemory):
        return mem.attn
    if not isinstance(mem, KVCache):
        raise APIError(501, "slot files are not supported for sliding-window caches",
                       type="not_supported_error")
    return mem


def save(engine: Engine, seq_id: int, path: Path) -> dict:
    mem = _cache(engine)
    cells = mem.cells
    idx = np.flatnonzero(cells.seq[:, seq_id])
    idx = idx[np.argsort(cells.pos[idx], kind="stable")]
    tokens = np.array(engine.cached[seq_id], dtype=np.int32)
    if len(idx) != len(tokens):
        raise APIError(500, "the slot's cells and tokens disagree")
    arrays = {"tokens": tokens, "pos": cells.pos[idx], "cache_types": np.array([mem.type_k, mem.type_v], np.int32)}
    for il in mem.layers:
        arrays[f"k{il}"] = mem.k[il][idx]
        arrays[f"v{il}"] = mem.v[il][idx]
    hybrid = engine.ctx.memory
    if isinstance(hybrid, HybridMemory):
        state = hybrid.seq_state(seq_id)
        arrays["rs_pos"] = np.array(state.pos, np.int64)
        arrays.update({RS_PREFIX + name: row for name, row in state.rows.items()})
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return {"n_saved": len(tokens), "n_written": path.stat().st_size}


def restore(engine: Engine, seq_id: int, path: Path) -> dict:
    mem = _cache(engine)
    if not path.is_file():
        raise APIError(404, f"no slot file {path.name!r}")
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    tokens, pos = arrays["tokens"], arrays["pos"]
    saved = tuple(int(t) for t in arrays.get("cache_types", (mem.type_k, mem.type_v)))  # older files: unchecked
    if saved != (mem.type_k, mem.type_v):
        names = [KV_TYPE_NAMES.get(GGMLType(t), str(t)) for t in (*saved, mem.type_k, mem.type_v)]
        raise APIError(400, f"the slot file was saved with KV cache types K {names[0]}, V {names[1]}; "
                            f"this server's are K {names[2]}, V {names[3]}")
    for il in mem.layers:
        if arrays.get(f"k{il}") is None or arrays[f"k{il}"].shape[1:] != mem.k[il].shape[1:]:
            raise APIError(400, "the slot file was saved from another model")
    hybrid = engine.ctx.memory
    rs_state = None
    if isinstance(hybrid, HybridMemory):
        rows = {name: arrays.get(RS_PREFIX + name) for name in hybrid.rs.bindings()}
        if "rs_pos" not in arrays or any(r is None or r.shape != a.shape[1:]
                                         for r, a in zip(rows.values(), hybrid.rs.bindings().values())):
            raise APIError(400, "the slot file holds no recurrent states of this model")
        rs_state = RSSeqState(int(arrays["rs_pos"]), rows)
    engine.forget(seq_id, 0)
    cells = mem.cells
    free = np.flatnonzero(cells.pos < 0)[:len(tokens)]
    if len(free) < len(tokens):
        raise APIError(400, "not enough free KV cells to restore the slot")
    n = len(tokens)
    ub = UBatch(tokens=None, embd=None, pos=pos.astype(np.int32), seq_ids=[(seq_id,)] * n,
                output=np.zeros(n, bool), idxs=np.arange(n), n_seq_tokens=1, n_seqs=n,
                equal_seqs=False)
    cells.apply_ubatch(SlotInfo(free.astype(np.int64)), ub)
    for il in mem.layers:
        mem.k[il][free] = arrays[f"k{il}"]
        mem.v[il][free] = arrays[f"v{il}"]
    if rs_state is not None:
        hybrid.rs.set_seq_state(seq_id, rs_state)
    engine.cached[seq_id] = tokens.tolist()
    return {"n_restored": n, "n_read": path.stat().st_size}
