"""Run registry test cases on any backend, the way ggml's test-backend-ops does.

Every `OpCase` of the op registry becomes a one-op graph built through `GraphBuilder`, with
its sources bound by name in a `TensorStore` and run through `backend.compile(...).run(...)`.
Nothing here knows which backend it drives, so the same cases compare the reference backend
with an independent oracle today and the CPU/CUDA backends with the reference backend later:
make the inputs once with `make_inputs`, pass them to `run_case` for each backend, and compare
the results with `normalized_error` (ggml's NMSE).
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops.registry import OPS, Kind, OpCase, SrcSpec
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.ir.types import GGMLType, block_size, is_quantized, type_size

INDEX_TYPES = (GGMLType.I32, GGMLType.I64)
STORAGE_DTYPES = {
    GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.BF16: np.uint16,
    GGMLType.I32: np.int32, GGMLType.I64: np.int64,
}
MAX_POSITION = 512   # "pos" fill: random positions below this, in any order (as ggml's test)
MASK_DENSITY = 0.3   # "mask" fill: share of -inf cells


def source_name(i: int) -> str:
    """The binding name of a case's i-th source."""
    return f"src{i}"


def iter_cases(op_names: list[str] | None = None) -> Iterator[tuple[str, int, OpCase]]:
    """(op name, case index, case) for every registry case of the given (default: all) ops."""
    for name in sorted(op_names if op_names is not None else OPS):
        op = OPS[name]
        if op.cases is None:
            continue
        for i, case in enumerate(op.cases()):
            yield name, i, case


def case_id(op_name: str, index: int, case: OpCase) -> str:
    """A readable pytest id: op, index and the case's label."""
    label = case.label.replace(" ", "_") if case.label else ""
    return f"{op_name}-{index}" + (f"-{label}" if label else "")


# inputs --------------------------------------------------------------------------------------
def _shape(spec: SrcSpec) -> tuple[int, ...]:
    """numpy shape of a source's storage: ne reversed, padded to 4 dims."""
    ne = tuple(spec.ne) + (1,) * (4 - len(spec.ne))
    return tuple(reversed(ne))


def _fill_rule(fill: str) -> tuple[str, int | None]:
    name, _, arg = fill.partition(":")
    if name in ("rows", "unique_rows"):
        if not arg.isdigit() or int(arg) < 1:
            raise ValueError(f"fill {fill!r} needs a positive row count, as in {name}:10")
        return name, int(arg)
    if arg or name not in ("normal", "positive", "negative", "unit", "l2norm", "pos", "mask", "zeros", "blocks"):
        raise ValueError(f"unknown fill rule {fill!r} (normal, positive, negative, unit, l2norm, rows:N, "
                         "unique_rows:N, pos, mask, zeros, blocks)")
    return name, None


def fill_values(spec: SrcSpec, rng: np.random.Generator) -> np.ndarray:
    """The values a source holds before encoding in its type, numpy order (ne reversed).

    Float rules draw float32 whatever the type, so one seed gives the same underlying values
    for an F32 and a quantised source (tests compare the two)."""
    rule, n = _fill_rule(spec.fill)
    shape = _shape(spec)
    if rule == "normal":
        if spec.type in INDEX_TYPES:
            return rng.integers(-100, 100, size=shape)
        return rng.standard_normal(shape).astype(np.float32)
    if rule == "positive":
        return rng.uniform(0.5, 2.0, size=shape).astype(np.float32)
    if rule == "negative":   # log-decays: exp of them is in (0, 1), as a gated delta-net's gates
        return rng.uniform(-1.0, -0.01, size=shape).astype(np.float32)
    if rule == "unit":       # in (0, 1), as the sigmoid outputs of a delta-net's beta
        return rng.uniform(0.01, 0.99, size=shape).astype(np.float32)
    if rule == "l2norm":     # rows (along ne[0]) of unit length, as ggml_l2_norm's output
        x = rng.standard_normal(shape)
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)
    if rule in ("zeros", "blocks"):   # blocks: make_inputs draws random blocks instead
        return np.zeros(shape, dtype=np.float32)
    if rule == "rows":
        return rng.integers(0, n, size=shape)
    if rule == "unique_rows":
        return _unique_rows(shape, n, rng)
    if rule == "pos":
        return rng.integers(0, MAX_POSITION, size=shape)
    return _mask(shape, rng)


def _unique_rows(shape: tuple[int, ...], n: int, rng: np.random.Generator) -> np.ndarray:
    """Row indices below n, distinct within each index row (set_rows must not write a row twice)."""
    if shape[-1] > n:
        raise ValueError(f"cannot draw {shape[-1]} distinct row indices below {n}")
    rows = [rng.choice(n, size=shape[-1], replace=False) for _ in range(int(np.prod(shape[:-1])))]
    return np.array(rows).reshape(shape)


def _mask(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """-inf or 0 at random, with at least one 0 per row so no softmax row is all masked."""
    out = np.where(rng.random(shape) < MASK_DENSITY, -np.inf, 0.0).astype(np.float32)
    rows = out.reshape(-1, shape[-1])
    rows[np.arange(len(rows)), rng.integers(0, shape[-1], size=len(rows))] = 0.0
    return out


def encode(values: np.ndarray, ttype: GGMLType, rng: np.random.Generator) -> np.ndarray:
    """`values` stored as ggml type `ttype`: a C-contiguous array the TensorStore can bind.

    Quantised types use ggmlpy.quants.quantize where it has an encoder; otherwise (a type
    without one yet) the data is random valid blocks and `values` is ignored."""
    ttype = GGMLType(ttype)
    if ttype in INDEX_TYPES:
        return np.ascontiguousarray(values, dtype=STORAGE_DTYPES[ttype])
    if ttype == GGMLType.F32:
        return np.ascontiguousarray(values, dtype=np.float32)
    if ttype == GGMLType.F16:
        return np.ascontiguousarray(values.astype(np.float16))
    if ttype == GGMLType.BF16:
        return _to_bf16(values.astype(np.float32))
    if not is_quantized(ttype):
        raise NotImplementedError(f"test inputs of type {ttype.name} are not supported")
    encoder = _quantizer(ttype)
    if encoder is not None:
        return np.ascontiguousarray(encoder(values.astype(np.float32), ttype))
    return random_blocks(ttype, values.shape, rng)


def _to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounding to nearest even (as ggml_fp32_to_bf16)."""
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.ascontiguousarray(rounded.astype(np.uint16))


def _quantizer(ttype: GGMLType):
    try:
        from ggmlpy.quants import QUANTIZABLE, quantize
    except ImportError:  # the quantisers are optional for these tests
        return None
    return quantize if ttype in QUANTIZABLE else None


def random_blocks(ttype: GGMLType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random blocks of `ttype` whose float fields (scales, mins) are small finite numbers, so
    every decoded value is finite. `shape` is the numpy shape of the values."""
    from ggmlpy.quants import block_dtype

    dtype = block_dtype(ttype)
    n_blocks = int(np.prod(shape)) // block_size(ttype)
    raw = rng.integers(0, 256, size=n_blocks * dtype.itemsize, dtype=np.uint8)
    blocks = raw.view(dtype)
    for field, (fdtype, _) in dtype.fields.items():
        if fdtype.base.kind == "f":
            blocks[field] = rng.uniform(-0.05, 0.05, size=blocks[field].shape).astype(fdtype.base)
    if ttype == GGMLType.IQ1_M:
        # no d field: the f16 scale is the top nibbles of the four little-endian scale words,
        # the last byte's holding its sign and exponent bits 4-2; exponent 8-11 keeps it
        # finite and small (2^-7 <= |d| < 2^-3) like the other types' d
        blocks["scales"][:, 7] = (blocks["scales"][:, 7] & 0x8F) | 0x20
    row_bytes = shape[-1] // block_size(ttype) * type_size(ttype)
    return raw.reshape(tuple(shape[:-1]) + (row_bytes,))


def make_inputs(case: OpCase, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Storage arrays for every source of `case`, by binding name (`src0`, `src1`, ...).

    Each array holds the source in its ggml type (float16, bfloat16 bits, int32/int64 or
    quantised block bytes), numpy shape = ne reversed (quantised: rows of bytes). The fill
    "blocks" stores random blocks (random_blocks) even where the type has a quantiser: every
    bit pattern of every field, e.g. every grid index of an I-quant given enough blocks."""
    out = {}
    for i, spec in enumerate(case.srcs):
        values = fill_values(spec, rng)
        if spec.fill == "blocks":
            if not is_quantized(spec.type):
                raise ValueError(f"fill 'blocks' needs a quantised type, not {GGMLType(spec.type).name}")
            out[source_name(i)] = random_blocks(spec.type, values.shape, rng)
        else:
            out[source_name(i)] = encode(values, spec.type, rng)
    return out


def decode(data: np.ndarray, ttype: GGMLType, ne: tuple[int, ...]) -> np.ndarray:
    """Storage of type `ttype` back to float32 (integers stay integers), numpy order."""
    ttype = GGMLType(ttype)
    if ttype in INDEX_TYPES:
        return np.asarray(data)
    if ttype == GGMLType.F32:
        return np.asarray(data, dtype=np.float32)
    if ttype == GGMLType.F16:
        return np.asarray(data).astype(np.float32)
    if ttype == GGMLType.BF16:
        return (np.asarray(data).astype(np.uint32) << 16).view(np.float32)
    from ggmlpy.quants import dequantize

    return dequantize(np.ascontiguousarray(data), ttype, ne)


def permute_like_ggml(values: np.ndarray, axes: tuple[int, int, int, int]) -> np.ndarray:
    """ggml_permute on a numpy-ordered array: source dim i becomes result dim axes[i].

    numpy axis k holds ggml dim 3 - k, so result numpy axis 3 - axes[i] is source axis 3 - i."""
    order = [0] * 4
    for i, ax in enumerate(axes):
        order[3 - ax] = 3 - i
    return np.transpose(values, order)


def source_values(case: OpCase, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The sources as the op sees them: decoded to float32 (or ints) and permuted, numpy order.

    Built with numpy transposes, independently of TensorStore's strided views, so oracles
    written on these values also check how the backend reads its inputs."""
    out = []
    for i, spec in enumerate(case.srcs):
        ne = tuple(spec.ne) + (1,) * (4 - len(spec.ne))
        values = decode(inputs[source_name(i)], spec.type, ne).reshape(_shape(spec))
        out.append(permute_like_ggml(values, spec.permute) if spec.permute else values)
    return out


# one-op graphs -------------------------------------------------------------------------------
def build_case_graph(op_name: str, case: OpCase) -> tuple[Graph, Tensor]:
    """A graph of `op_name` over the case's sources (leaves named src0.., permuted as asked).

    Sources are graph inputs; the destination of a write op (set_rows, cpy) is a cache leaf,
    as the KV cache is in a model graph."""
    b = GraphBuilder()
    srcs = []
    for i, spec in enumerate(case.srcs):
        leaf = b.input(source_name(i), spec.type, spec.ne)
        if spec.weight:
            leaf.flags = Flag.WEIGHT
        srcs.append(b.permute(leaf, *spec.permute) if spec.permute else leaf)
    node = b.make(op_name, srcs, case.param_dict())
    if OPS[op_name].kind == Kind.WRITE and node.view_src is not None and node.view_src.is_leaf:
        node.view_src.flags = Flag.CACHE
    return b.build([node]), node


def run_case(op_name: str, case: OpCase, backend: Any, inputs: Mapping[str, np.ndarray] | None = None,
             rng: np.random.Generator | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Run one case on `backend`; returns (result as float32 or ints in numpy order, inputs).

    `inputs` (from make_inputs) lets several backends see the same data; they are copied
    before binding, so write ops leave the caller's arrays untouched."""
    from ggmlpy.sched.store import TensorStore

    if inputs is None:
        inputs = make_inputs(case, rng if rng is not None else np.random.default_rng(0))
    graph, node = build_case_graph(op_name, case)
    store = TensorStore({name: np.array(data, copy=True) for name, data in inputs.items()})
    env: dict[str, int] = {}
    backend.compile(graph, graph.nodes).run(store, env)
    raw = store.array(node, env)
    return decode(np.array(raw, copy=True), node.type, tuple(int(d) for d in node.ne)), dict(inputs)


# comparison ----------------------------------------------------------------------------------
def compare_backends(op_name: str, case: OpCase, backend: Any, reference: Any,
                     rng: np.random.Generator) -> float:
    """NMSE of `backend` against `reference` on one case, both fed the same inputs."""
    inputs = make_inputs(case, rng)
    expected, _ = run_case(op_name, case, reference, inputs=inputs)
    result, _ = run_case(op_name, case, backend, inputs=inputs)
    if result.shape != expected.shape:
        raise ValueError(f"{op_name}: {getattr(backend, 'name', backend)} gave shape {result.shape}, "
                         f"{getattr(reference, 'name', reference)} {expected.shape}")
    return normalized_error(result, expected)


def normalized_error(a: np.ndarray, b: np.ndarray) -> float:
    """ggml's NMSE, sum((a - b)^2) / sum(b^2), with b the reference.

    As test-backend-ops: any NaN is an infinite error, infinities must match in place and
    sign (then they are left out), and two all-zero arrays agree exactly."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"cannot compare shapes {a.shape} and {b.shape}")
    if np.isnan(a).any() or np.isnan(b).any():
        return float("inf")
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    if (inf_a != inf_b).any() or (np.sign(a[inf_a]) != np.sign(b[inf_b])).any():
        return float("inf")
    a, b = np.where(inf_a, 0.0, a), np.where(inf_b, 0.0, b)
    err = float(np.sum((a - b) ** 2))
    ref = float(np.sum(b * b))
    if ref == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / ref
