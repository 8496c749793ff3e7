"""`Tensor`: one node of the IR, with ggml's meaning of ne (elements) and nb (byte strides)."""
from __future__ import annotations

import enum
import functools
import itertools
from dataclasses import dataclass, field
from typing import Any

from ggmlpy.ir.symbolic import Dim, dim_str, simplify
from ggmlpy.ir.types import GGMLType, block_size, type_size

MAX_DIMS = 4


class Flag(enum.Flag):
    NONE = 0
    INPUT = enum.auto()   # set per ubatch by the runtime (token ids, positions, masks ...)
    OUTPUT = enum.auto()  # read back after compute (logits); its memory is never reused
    WEIGHT = enum.auto()  # model parameter, bound by name to the model's data
    CACHE = enum.auto()   # persistent state owned by the context (KV cache), bound by name
    # a weight read in its file's layout: no backend keeps a copy of its own layout (llama.cpp's
    # --no-repack), so the weights are resident once, as the file has them
    FILE_LAYOUT = enum.auto()


# leaves whose data is bound by name (TensorStore), and the plain int: a test without enum code
BOUND = Flag.INPUT | Flag.WEIGHT | Flag.CACHE
BOUND_BITS = BOUND._value_

_ids = itertools.count()


def new_id() -> int:
    """A tensor id no tensor of this process has had (ids key every pass's maps)."""
    return next(_ids)


def contiguous_strides(ttype: GGMLType, ne: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """ggml_new_tensor's strides: nb[0] = type size, nb[1] = row bytes, then products."""
    return _contiguous_strides(ttype, tuple(ne))


@functools.lru_cache(maxsize=4096)
def _contiguous_strides(ttype: GGMLType, ne: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Memoised: a graph asks for the same few shapes thousands of times (every new tensor
    and every contiguity check), and symbolic products are slow to make."""
    nb0 = type_size(ttype)
    nb1 = nb0 * (ne[0] // block_size(ttype)) if isinstance(ne[0], int) else nb0 * ne[0]
    nb = [nb0, nb1]
    for i in range(2, MAX_DIMS):
        nb.append(simplify(nb[i - 1] * ne[i - 1]))
    return tuple(nb)


@dataclass(eq=False)
class Tensor:
    """A graph value. Leaves have op "none"; views share their `view_src`'s memory."""

    type: GGMLType
    ne: tuple[Dim, Dim, Dim, Dim]
    nb: tuple[Dim, Dim, Dim, Dim]
    op: str = "none"
    src: tuple["Tensor", ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    flags: Flag = Flag.NONE
    view_src: "Tensor | None" = None
    view_offs: Dim = 0
    id: int = field(default_factory=new_id)

    @property
    def is_leaf(self) -> bool:
        return self.op == "none"

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def n_dims(self) -> int:
        """ggml_n_dims: the number of dimensions up to the last one that is not 1."""
        n = MAX_DIMS
        while n > 1 and self.ne[n - 1] == 1:
            n -= 1
        return n

    @property
    def is_contiguous(self) -> bool:
        return self.nb == contiguous_strides(self.type, self.ne)

    def nelements(self) -> Dim:
        n: Dim = 1
        for d in self.ne:
            n = simplify(n * d)
        return n

    def shape_str(self) -> str:
        return "[" + ", ".join(dim_str(d) for d in self.ne[: self.n_dims]) + "]"

    def __repr__(self) -> str:
        return f"Tensor({self.name or '#' + str(self.id)}: {self.op} {self.type.name} {self.shape_str()})"

    def __hash__(self) -> int:
        return self.id


def memory_root(t: Tensor) -> Tensor:
    """The tensor owning t's memory: t itself unless t is a view (or a write's result).

    A view's `view_src` already points at the owner, never at another view (as in ggml), so
    one step is enough. Every pass, scheduler and backend that asks "whose buffer is this"
    uses this one function, so they cannot disagree about ownership."""
    return t.view_src if t.view_src is not None else t


def offset_in_owner(t: Tensor) -> Dim:
    """t's byte offset inside `memory_root(t)` (0 for a tensor that owns its memory)."""
    return t.view_offs if t.view_src is not None else 0


def pad_ne(ne: tuple[Dim, ...]) -> tuple[Dim, Dim, Dim, Dim]:
    if not 1 <= len(ne) <= MAX_DIMS:
        raise ValueError(f"a tensor has 1..{MAX_DIMS} dimensions, got {len(ne)}")
    return tuple(ne) + (1,) * (MAX_DIMS - len(ne))  # type: ignore[return-value]
