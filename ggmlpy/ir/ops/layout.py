"""Layout ops: views over the same memory (view, reshape, permute, transpose), copies (cont,
cpy) and concat. Views carry no computation: backends realise them from ne, nb and offset."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import require
from ggmlpy.ir.ops.registry import DST_TYPE, Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.ops.rows import QUANT_DST
from ggmlpy.ir.symbolic import Dim, simplify
from ggmlpy.ir.tensor import contiguous_strides, memory_root, offset_in_owner, pad_ne
from ggmlpy.ir.types import GGMLType, block_size, row_size, type_size
from ggmlpy.quants.from_float import quantize_rows_cpu

F32 = GGMLType.F32


def _nelements(ne: Sequence[Dim]) -> Dim:
    n: Dim = 1
    for d in ne:
        n = simplify(n * d)
    return n


# view ---------------------------------------------------------------------------------------
def _extent(t: GGMLType, ne: Sequence[Dim], nb: Sequence[Dim]) -> int | None:
    """The bytes from a tensor's first byte to just past its last, when every dim and
    stride is known (None: some are symbols, checked when the graph runs); 0 if empty."""
    if not all(isinstance(d, int) for d in (*ne, *nb)):
        return None
    if any(d == 0 for d in ne):
        return 0
    return row_size(t, ne[0]) + sum((ne[i] - 1) * abs(nb[i]) for i in range(1, len(ne)))


def _view_infer(srcs: Sequence[Any], params: dict) -> Inferred:
    (a,) = srcs
    root, offs = memory_root(a), offset_in_owner(a)
    ne, nb, offset = pad_ne(params["ne"]), tuple(params["nb"]), simplify(offs + params["offset"])
    # ggml_view_impl's assert: a view must lie inside its source's memory
    end, size = _extent(a.type, ne, nb), _extent(root.type, root.ne, root.nb)
    if end is not None and size is not None and isinstance(offset, int):
        require(offset >= 0 and offset + end <= size, "view",
                lambda: f"{list(ne)} at byte {offset} with strides {list(nb)} ends at byte {offset + end}, "
                        f"past the {size} bytes of {root.name or 'its source'} {root.shape_str()}")
    return Inferred(a.type, ne, nb, root, offset)


def _view_api(b, a, ne: Sequence[Dim], nb: Sequence[Dim] = (), offset: Dim = 0):
    """ggml_view_Nd(a, ne..., nb1.., offset): nb[0] is the element size, higher strides given."""
    ne = pad_ne(tuple(ne))
    full = contiguous_strides(a.type, ne)
    strides = [a.nb[0], *nb]
    for i in range(len(strides), 4):
        strides.append(simplify(strides[i - 1] * ne[i - 1]) if i > 1 else full[1])
    return b.make("view", (a,), {"ne": tuple(ne), "nb": tuple(strides), "offset": offset})


register(OpDef("view", Kind.VIEW, _view_infer, api={"view": _view_api},
               doc="a strided window of the source's memory (ggml_view_1d..4d)"))


# reshape ------------------------------------------------------------------------------------
def _reshape_infer(srcs: Sequence[Any], params: dict) -> Inferred:
    (a,) = srcs
    ne = pad_ne(params["ne"])
    require(a.is_contiguous, "reshape", lambda: f"source {a.shape_str()} is not contiguous")
    require(_nelements(ne) == a.nelements(), "reshape", lambda: f"{a.shape_str()} has {a.nelements()} "
            f"elements, {list(params['ne'])} needs {_nelements(ne)}")
    root, offs = memory_root(a), offset_in_owner(a)
    return Inferred(a.type, ne, contiguous_strides(a.type, ne), root, offs)


def _reshape_api(b, a, *ne: Dim):
    return b.make("reshape", (a,), {"ne": tuple(ne)})


register(OpDef("reshape", Kind.VIEW, _reshape_infer, api={"reshape": _reshape_api},
               doc="same contiguous memory, new shape (ggml_reshape_Nd)"))


# permute / transpose ------------------------------------------------------------------------
def _permute_infer(srcs: Sequence[Any], params: dict) -> Inferred:
    (a,) = srcs
    axes = params["axes"]
    require(sorted(axes) == [0, 1, 2, 3], "permute", lambda: f"axes {axes} are not a permutation of 0..3")
    ne: list[Dim] = [0] * 4
    nb: list[Dim] = [0] * 4
    for i, ax in enumerate(axes):  # ggml: source dim i becomes result dim axes[i]
        ne[ax] = a.ne[i]
        nb[ax] = a.nb[i]
    root, offs = memory_root(a), offset_in_owner(a)
    return Inferred(a.type, tuple(ne), tuple(nb), root, offs)


def _permute_api(b, a, ax0: int, ax1: int, ax2: int, ax3: int):
    return b.make("permute", (a,), {"axes": (ax0, ax1, ax2, ax3)})


def _transpose_api(b, a):
    return b.make("permute", (a,), {"axes": (1, 0, 2, 3)})


register(OpDef("permute", Kind.VIEW, _permute_infer,
               api={"permute": _permute_api, "transpose": _transpose_api},
               doc="swap dimensions by swapping strides (ggml_permute, ggml_transpose)"))


# cont ---------------------------------------------------------------------------------------
def _cont_infer(srcs: Sequence[Any], params: dict) -> Inferred:
    (a,) = srcs
    ne = pad_ne(params["ne"]) if params.get("ne") else a.ne
    require(_nelements(ne) == a.nelements(), "cont", lambda: f"{a.shape_str()} cannot become {list(ne)}")
    return Inferred(a.type if a.type in (F32, GGMLType.F16) else F32, ne)


def _cont_ref(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    ne = params.get("ne")
    out = np.array(x[0], copy=True, order="C")  # a copy even when x is contiguous: no aliasing
    return out.reshape(tuple(reversed(pad_ne(ne)))) if ne else out


def _cont_api(b, a, *ne: Dim):
    return b.make("cont", (a,), {"ne": tuple(ne) if ne else None})


register(OpDef("cont", Kind.ELEMENTWISE, _cont_infer, _cont_ref, api={"cont": _cont_api},
               cases=lambda: [OpCase((SrcSpec(F32, (5, 4, 3, 1), permute=(0, 2, 1, 3)),)),
                              OpCase((SrcSpec(F32, (6, 4, 1, 1), permute=(1, 0, 2, 3)),), (("ne", (24,)),))],
               doc="a contiguous copy, optionally with a new shape (ggml_cont, ggml_cont_Nd)"))


# cpy ----------------------------------------------------------------------------------------
def _cpy_infer(srcs: Sequence[Any], params: dict) -> Inferred:
    dst, a = srcs  # WRITE ops take their destination first
    require(_nelements(a.ne) == dst.nelements(), "cpy", lambda: f"{a.shape_str()} into {dst.shape_str()}: "
            "element counts differ")
    require(dst.type in (F32, GGMLType.F16, GGMLType.BF16) + QUANT_DST, "cpy",
            lambda: f"destination type {dst.type.name} is not supported")
    require(dst.type not in QUANT_DST or (dst.nb[0] == type_size(dst.type) and isinstance(dst.ne[0], int)
                                          and dst.ne[0] % block_size(dst.type) == 0),
            "cpy", lambda: f"a {dst.type.name} destination needs rows of whole blocks")
    root, offs = memory_root(dst), offset_in_owner(dst)
    return Inferred(dst.type, dst.ne, dst.nb, root, offs)


def _cpy_write(dst: np.ndarray, x: Sequence[np.ndarray], params: dict) -> None:
    """A quantised destination (a K-shift's rows back into a quantised cache) gets the rows
    as ggml's CPU cpy writes them, quantised by the type's from_float."""
    qtype = params.get(DST_TYPE)
    if qtype is None:
        dst[...] = np.ascontiguousarray(x[1]).reshape(dst.shape)
        return
    rows = np.ascontiguousarray(x[1]).reshape(dst.shape[:3] + (-1,))
    dst[...] = quantize_rows_cpu(rows, qtype)


def _cpy_api(b, a, dst):
    """ggml_cpy(a, dst): copy a into dst (the op's sources are stored as (dst, a))."""
    return b.make("cpy", (dst, a))


register(OpDef("cpy", Kind.WRITE, _cpy_infer, write=_cpy_write, api={"cpy": _cpy_api},
               cases=lambda: [OpCase((SrcSpec(GGMLType.F16, (8, 3, 1, 1), fill="zeros"), SrcSpec(F32, (8, 3, 1, 1)))),
                              OpCase((SrcSpec(F32, (24, 1, 1, 1), fill="zeros"), SrcSpec(F32, (8, 3, 1, 1)))),
                              OpCase((SrcSpec(GGMLType.F16, (40, 3, 1, 1), fill="zeros"), SrcSpec(F32, (40, 3, 1, 1)))),
                              *[OpCase((SrcSpec(t, (64, 3, 1, 1), fill="zeros"), SrcSpec(F32, (64, 3, 1, 1))),
                                       label=t.name) for t in QUANT_DST]],
               doc="copy a into dst's memory, converting the type; the result is dst"))


# concat -------------------------------------------------------------------------------------
def _concat_infer(srcs: Sequence[Any], params: dict) -> Inferred:
    a, c = srcs
    dim = params["dim"]
    for i in range(4):
        if i != dim:
            require(a.ne[i] == c.ne[i], "concat", lambda: f"{a.shape_str()} and {c.shape_str()} differ in dim {i}")
    ne = list(a.ne)
    ne[dim] = simplify(a.ne[dim] + c.ne[dim])
    return Inferred(F32, tuple(ne))


def _concat_ref(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    return np.concatenate([x[0], x[1]], axis=3 - params["dim"]).astype(np.float32)


def _concat_api(b, a, c, dim: int):
    return b.make("concat", (a, c), {"dim": int(dim)})


register(OpDef("concat", Kind.OPAQUE, _concat_infer, _concat_ref, api={"concat": _concat_api},
               cases=lambda: [OpCase((SrcSpec(F32, (4, 3, 2, 1)), SrcSpec(F32, (4, 5, 2, 1))), (("dim", 1),)),
                              OpCase((SrcSpec(F32, (4, 3, 2, 1)), SrcSpec(F32, (7, 3, 2, 1))), (("dim", 0),)),
                              OpCase((SrcSpec(F32, (5, 3, 2, 1)), SrcSpec(GGMLType.F16, (5, 3, 4, 1))), (("dim", 2),)),
                              OpCase((SrcSpec(F32, (6, 2, 3, 1), permute=(0, 2, 1, 3)), SrcSpec(F32, (6, 3, 2, 2))),
                                     (("dim", 3),), label="permuted a, dim 3")],
               doc="join along one dimension (ggml_concat)"))

