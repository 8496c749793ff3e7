"""Graph inputs, as llama.cpp's llm_graph_input_*: each owns some input leaves, fills them for
a ubatch (`set_input`) and says whether a graph built earlier can serve new params
(`can_reuse`). Together they decide graph reuse (docs/architecture.md, step 13)."""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llama.kv_cells import SWAType

if TYPE_CHECKING:
    from llama.batch import UBatch
    from llama.kv_cells import KVCells, SlotInfo
    from llama.recurrent import RSSlot


@dataclass(frozen=True)
class GraphParams:
    """Everything about a ubatch that shapes the graph's topology (not its sizes)."""

    tokens_class: str  # "single" (decode: one token, its output wanted) or "multi"; see README
    use_embd: bool     # embeddings instead of token ids
    kv_size: int
    # the output is t_embd (the normed hidden states, llama.cpp's embeddings context), not
    # the logits: a different topology, so a different signature and compiled graph
    embeddings: bool = False
    # the model's LoRA adapters (by id) some token of the ubatch uses (llama/lora_scales.py)
    loras: tuple[int, ...] = ()
    # models with recurrent layers: how the ubatch's tokens form sequences there, "seq" (one
    # sequence of n_tokens) or "tokens" (n_tokens sequences of one token); "" otherwise
    rs_layout: str = ""
    # t_embd (the final normed hidden states) is a second output beside the logits: what a
    # multi-token-prediction drafter continues from (llama.cpp's embeddings_nextn)
    nextn: bool = False

    @staticmethod
    def for_ubatch(ub: "UBatch", kv_size: int, embeddings: bool = False,
                   loras: tuple[int, ...] = (), recurrent: bool = False, nextn: bool = False) -> "GraphParams":
        return GraphParams("single" if is_single(ub) else "multi", ub.embd is not None, kv_size,
                           embeddings=embeddings, loras=loras, rs_layout=rs_layout(ub) if recurrent else "",
                           nextn=nextn)


def rs_layout(ub: "UBatch") -> str:
    """"tokens" when every token is a sequence of its own (a generation step), else "seq"
    (the ubatch is then one sequence: recurrent.split_blocks makes it so)."""
    return "tokens" if ub.n_tokens == 1 or not ub.equal_seqs or ub.n_seq_tokens == 1 else "seq"


def is_single(ub: "UBatch") -> bool:
    """One token whose output is wanted: every step of generation. Its graph selects no
    output rows (build_inp_out_ids), so a one-token ubatch without output takes the general
    graph."""
    return ub.n_tokens == 1 and bool(ub.output[0])


@dataclass
class InputState:
    """What set_input needs besides the ubatch: the cache cells and this ubatch's slot.

    `swa` is the same for the separate sliding-window cache of an iSWA memory."""

    cells: "KVCells"
    slot: "SlotInfo"
    n_kv: int
    swa: "InputState | None" = None
    rs: "RSSlot | None" = None   # the recurrent states' rows (hybrid memory)

    def symbols(self) -> dict[str, int]:
        """The values of the cache-size symbols for this ubatch (n_kv, n_kv_swa)."""
        out = {"n_kv": self.n_kv}
        if self.swa is not None:
            out["n_kv_swa"] = self.swa.n_kv
        return out


class InputBuffers:
    """Host memory for graph inputs that outlives a ubatch: per leaf name, the same array
    object while the shape stays the same. A compiled graph that finds the same arrays bound
    as in its last run keeps its pointers (CpuSplit), so a decode step rebinds nothing.

    An array handed out is overwritten by the next ubatch; every backend has read its inputs
    by the time `run` returns, so nothing outlives that."""

    def __init__(self) -> None:
        self._flat: dict[str, np.ndarray] = {}
        self._views: dict[str, tuple[type, tuple[int, ...], np.ndarray]] = {}

    def take(self, name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        last = self._views.get(name)
        if last is not None and last[0] is dtype and last[1] == shape:
            return last[2]
        n = 1
        for d in shape:
            n *= d
        flat = self._flat.get(name)
        if flat is None or flat.dtype != dtype or flat.size < n:
            # grow with headroom: the mask grows with n_kv, 32 cells at a time
            size = max(n, 2 * flat.size if flat is not None and flat.dtype == dtype else 0)
            flat = self._flat[name] = np.empty(size, dtype=dtype)
        view = flat[:n].reshape(shape)
        self._views[name] = (dtype, shape, view)
        return view


class GraphInput(abc.ABC):
    names: tuple[str, ...] = ()

    @abc.abstractmethod
    def set_input(self, ub: "UBatch", state: InputState,
                  bufs: InputBuffers | None = None) -> dict[str, np.ndarray]:
        """The arrays of this input's leaves for the ubatch, by leaf name; written into
        `bufs` when given (the context's persistent buffers), into new arrays otherwise."""

    def can_reuse(self, params: GraphParams) -> bool:
        return True


def fill_input(bufs: InputBuffers | None, name: str, dtype: type, values) -> np.ndarray:
    """`values` as a contiguous array of dtype, in bufs' array for `name` when given."""
    if type(values) is not np.ndarray:
        values = np.asarray(values)
    if bufs is None:
        return np.ascontiguousarray(values, dtype=dtype)
    out = bufs.take(name, dtype, values.shape)
    out[...] = values
    return out


class InpTokens(GraphInput):
    names = ("inp_tokens",)

    def set_input(self, ub, state, bufs=None):
        return {"inp_tokens": fill_input(bufs, "inp_tokens", np.int32, ub.tokens)}

    def can_reuse(self, params):
        return not params.use_embd


class InpEmbd(GraphInput):
    names = ("inp_embd",)

    def set_input(self, ub, state, bufs=None):
        return {"inp_embd": fill_input(bufs, "inp_embd", np.float32, ub.embd)}

    def can_reuse(self, params):
        return params.use_embd


@dataclass
class InpPos(GraphInput):
    """Token positions; with multi-section RoPE (n_pos 4) four per token, as llama.cpp
    gives text tokens: the position thrice (t, h, w), then 0."""

    n_pos: int = 1
    names = ("inp_pos",)

    def set_input(self, ub, state, bufs=None):
        if self.n_pos == 1:
            return {"inp_pos": fill_input(bufs, "inp_pos", np.int32, ub.pos)}
        pos = np.zeros((self.n_pos, ub.n_tokens), np.int32)
        pos[:3] = ub.pos
        return {"inp_pos": fill_input(bufs, "inp_pos", np.int32, pos.reshape(-1))}


@dataclass
class InpAttnTemp(GraphInput):
    """The attention temperature of each token's queries (Llama 4, Mistral Large 3; llama.cpp's
    llm_graph_input_attn_temp): log(floor((pos + offset) / floor_scale) + 1) * scale + 1,
    which grows with the position so that long contexts keep their attention sharp."""

    floor_scale: int
    scale: float
    offset: float = 0.0
    names = ("inp_attn_scale",)

    def set_input(self, ub, state, bufs=None):
        steps = np.floor((ub.pos.astype(np.float32) + np.float32(self.offset)) / np.float32(self.floor_scale))
        values = np.log(steps.astype(np.float64) + 1.0) * np.float32(self.scale) + 1.0
        return {"inp_attn_scale": fill_input(bufs, "inp_attn_scale", np.float32, values.reshape(-1, 1, 1))}


class InpRS(GraphInput):
    """The rows of the recurrent states each of the ubatch's sequences reads and writes."""

    names = ("inp_rs_src", "inp_rs_dst")

    def set_input(self, ub, state, bufs=None):
        if state.rs is None:
            raise ValueError("the graph has recurrent layers, but the memory gave no state rows")
        return {"inp_rs_src": fill_input(bufs, "inp_rs_src", np.int32, state.rs.src),
                "inp_rs_dst": fill_input(bufs, "inp_rs_dst", np.int64, state.rs.dst)}


class InpOutIds(GraphInput):
    """Rows of the ubatch whose logits are wanted; the last layer keeps only those."""

    names = ("inp_out_ids",)

    def set_input(self, ub, state, bufs=None):
        return {"inp_out_ids": fill_input(bufs, "inp_out_ids", np.int32, ub.output.nonzero()[0])}


@dataclass
class InpAttnKV(GraphInput):
    """KV write indices and the attention mask, plus the sliding-window mask when used.

    iswa: the SWA layers have their own cache, so they get their own write indices and a
    mask over that cache's cells (from `state.swa`); otherwise the SWA mask covers the
    same cells as the main one."""

    n_swa: int = 0
    swa_type: int = 0
    causal: bool = True
    iswa: bool = False

    @property
    def names(self) -> tuple[str, ...]:  # type: ignore[override]
        if self.iswa:
            return ("inp_k_idxs", "inp_kq_mask", "inp_k_idxs_swa", "inp_kq_mask_swa")
        return ("inp_k_idxs", "inp_kq_mask") + (("inp_kq_mask_swa",) if self.n_swa else ())

    def set_input(self, ub, state, bufs=None):
        cells, n_tokens = state.cells, ub.n_tokens
        out = {
            "inp_k_idxs": fill_input(bufs, "inp_k_idxs", np.int64, state.slot.idxs),
            "inp_kq_mask": cells.kq_mask(
                ub, state.n_kv, causal=self.causal, swa_type=SWAType.NONE,
                out=None if bufs is None else bufs.take("inp_kq_mask", np.float32, (n_tokens, state.n_kv))),
        }
        if self.iswa:
            swa = state.swa
            if swa is None:
                raise ValueError("the graph was built for a separate SWA cache, but the memory has none")
            out["inp_k_idxs_swa"] = fill_input(bufs, "inp_k_idxs_swa", np.int64, swa.slot.idxs)
            # the SWA cache's cells know their own window (swa_type None)
            out["inp_kq_mask_swa"] = swa.cells.kq_mask(
                ub, swa.n_kv, causal=self.causal,
                out=None if bufs is None else bufs.take("inp_kq_mask_swa", np.float32, (n_tokens, swa.n_kv)))
        elif self.n_swa:
            out["inp_kq_mask_swa"] = cells.kq_mask(
                ub, state.n_kv, causal=self.causal, swa_type=SWAType(self.swa_type), n_swa=self.n_swa,
                out=None if bufs is None else bufs.take("inp_kq_mask_swa", np.float32, (n_tokens, state.n_kv)))
        return out

    def can_reuse(self, params):
        return True
