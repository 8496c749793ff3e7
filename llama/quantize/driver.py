"""`quantize_file`: llama-quantize's llama_model_quantize, writing the file (or, with
--keep-split, the files) it writes.

The layout is gguf.cpp's: GGUF version 3, the metadata of plan.py, one tensor info per tensor
in the loader's order (dimensions trimmed as ggml_n_dims counts them, offsets padded to 32
bytes), the data section aligned to 32 and every tensor's data padded to 32. Tensors keep
their bytes where the type does not change; the others are decoded to float32 (F16/BF16
widened, quantised types dequantised) and encoded by ggmlpy's reference quantisers, which
are ggml's byte for byte. Each file is written under a temporary name beside its final one
and all are renamed once every one is complete, so a failure never leaves a half-written OUT.
"""
from __future__ import annotations

import multiprocessing
import os
import struct
import sys
import tempfile
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Sequence, Union

import numpy as np

from ggmlpy.gguf import GGUFFile
from ggmlpy.gguf.constants import DEFAULT_ALIGNMENT, GGUF_MAGIC
from ggmlpy.gguf.file import split_path
from ggmlpy.gguf.writer import encode_value
from ggmlpy.ir.types import GGMLType, row_size
from ggmlpy.quants import dequantize, quantize
from ggmlpy.quants.quant_iq import iq4_nl_file
from ggmlpy.quants.validate import can_validate, validate_tensor
from llama.quantize.imatrix import Imatrix, load_imatrix
from llama.quantize.mixes import Mix, parse_ggml_type, parse_mix
from llama.quantize.names import n_dims
from llama.quantize.plan import KV, Plan, TensorPlan, make_plan, parse_override_kv
from llama.quantize.rules import Params

ALIGN = DEFAULT_ALIGNMENT   # llama-quantize lays its output out at GGUF_DEFAULT_ALIGNMENT
WORK_ELEMENTS = 1 << 20     # float32 elements per unit of work (whole rows): bounds memory
PARALLEL_ELEMENTS = 1 << 23  # below this much to convert, starting worker processes costs more than it saves


@dataclass
class QuantizeResult:
    """What was (or, with dry_run, would be) written."""

    paths: list[Path]                   # the files written, in order (none with dry_run)
    mix: Mix
    types: dict[str, GGMLType]          # every tensor's type in the output
    size_in: int                        # bytes of tensor data in and out (pruned tensors left out)
    size_out: int
    n_elements: int                     # of every input tensor, as llama-quantize counts them for BPW
    warnings: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path | None:
        """The (first) file written; None with dry_run."""
        return self.paths[0] if self.paths else None


def _padded(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _string(raw: str) -> bytes:
    b = raw.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(b)) + b


def header_bytes(kvs: list[KV], tensors: list[TensorPlan]) -> bytes:
    """gguf_get_meta_data of an output file: magic, version 3, counts, metadata, tensor infos,
    zero padding to the alignment."""
    out = [GGUF_MAGIC, struct.pack("<IQQ", 3, len(tensors), len(kvs))]
    for key, vtype, value, etype in kvs:
        out += [_string(key), struct.pack("<I", vtype), encode_value(vtype, value, etype)]
    offset = 0
    for tp in tensors:
        nd = n_dims(tp.ne)
        out += [_string(tp.name), struct.pack(f"<I{nd}q", nd, *tp.ne[:nd]), struct.pack("<IQ", tp.dst_type, offset)]
        offset += _padded(tp.dst_bytes)
    head = b"".join(out)
    return head + b"\0" * (_padded(len(head)) - len(head))


def _as_f32(raw: np.ndarray, t: GGMLType, ne0: int, rows: int) -> np.ndarray:
    """Rows of a tensor as float32, as llama_tensor_dequantize_impl decodes them."""
    return np.asarray(dequantize(raw, t, (ne0, rows)), dtype=np.float32).reshape(rows, ne0)


def encode_rows(x: np.ndarray, t: GGMLType, imatrix: np.ndarray | None = None) -> np.ndarray:
    """float32 rows as ggml_quantize_chunk writes them: with an importance matrix (one value
    per column) weighted by it; without, the reference quantiser, but for IQ4_NL, whose
    quantize_iq4_nl searches more scales (ntry 7) than its _ref (ggmlpy.quants.quantize, the
    KV cache's encoder)."""
    with np.errstate(all="ignore"):   # ggml's C arithmetic does not trap either
        if imatrix is not None:
            return quantize(x, t, imatrix).reshape(-1)
        if t == GGMLType.IQ4_NL:
            return iq4_nl_file(x.reshape(-1, 32)).view(np.uint8).reshape(-1)
        return quantize(x, t).reshape(-1)


def encode_job(raw: np.ndarray, src: GGMLType, ne0: int, rows: int, dst: GGMLType,
               imatrix: np.ndarray | None = None) -> np.ndarray:
    """One unit of work (whole rows): decode, encode. Top level so worker processes can run it."""
    return encode_rows(_as_f32(raw, src, ne0, rows), dst, imatrix)


Piece = Union[np.ndarray, Future, None]   # bytes to write, bytes being encoded, end of a tensor


def _pieces(f: GGUFFile, tensors: list[TensorPlan],
            submit: Callable[..., Piece]) -> Iterator[tuple[TensorPlan, Piece]]:
    """Every tensor's data in file order: its bytes as they are, or its rows in units of
    about WORK_ELEMENTS handed to `submit`; then None. The input is validated as llama.cpp's
    loader validates what it reads (check_tensors)."""
    for tp in tensors:
        data = f.tensors[tp.source].data
        if can_validate(tp.src_type):   # all but MXFP4
            validate_tensor(tp.source, tp.src_type, data)
        if not tp.convert:
            yield tp, data
        else:
            src_row = row_size(tp.src_type, tp.ne[0])
            step = max(1, WORK_ELEMENTS // max(1, tp.ne[0]))
            # with an importance matrix per expert, a unit of work stays within one expert
            per_matrix = tp.ne[1] if tp.imatrix is not None and len(tp.imatrix) > tp.ne[0] else tp.n_rows
            r = 0
            while r < tp.n_rows:
                rows = min(step, tp.n_rows - r, per_matrix - r % per_matrix)
                imatrix = None
                if tp.imatrix is not None:
                    at = r // per_matrix * tp.ne[0]
                    imatrix = tp.imatrix[at:at + tp.ne[0]]
                yield tp, submit(encode_job, data[r * src_row:(r + rows) * src_row], tp.src_type, tp.ne[0], rows,
                                 tp.dst_type, imatrix)
                r += rows
        yield tp, None


def _emit(out: BinaryIO, tp: TensorPlan, piece: Piece, bar: Any) -> None:
    """Write one piece; after a tensor's last, its padding. Quantised output is validated
    as llama_tensor_quantize_impl validates it."""
    if piece is None:
        out.write(b"\0" * (_padded(tp.dst_bytes) - tp.dst_bytes))
        if bar is not None:
            bar.update(1)
        return
    chunk = piece.result() if isinstance(piece, Future) else piece
    if tp.convert and can_validate(tp.dst_type):
        validate_tensor(tp.name, tp.dst_type, chunk)
    out.write(memoryview(np.ascontiguousarray(chunk)))


def _progress_bar(total: int, enabled: bool | None) -> Any:
    """A tqdm bar over the tensors: None when off, tqdm's own choice (a terminal) when None."""
    if enabled is False:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc="quantizing", unit="tensor", file=sys.stderr, leave=False,
                disable=None if enabled is None else not enabled)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def quantize_file(inp: str | os.PathLike, out: str | os.PathLike | None, mix: str | int | Mix, *,
                  nthread: int = 0, leave_output_tensor: bool = False,
                  output_tensor_type: str | GGMLType | None = None,
                  token_embedding_type: str | GGMLType | None = None,
                  tensor_types: Sequence[str] = (), allow_requantize: bool = False, pure: bool = False,
                  imatrix: str | os.PathLike | None = None, include_weights: Sequence[str] = (),
                  exclude_weights: Sequence[str] = (), override_kv: Sequence[str] = (),
                  prune_layers: Sequence[int] = (), keep_split: bool = False,
                  dry_run: bool = False, progress: bool | None = None) -> QuantizeResult:
    """Quantize the GGUF model `inp` to `out` as `llama-quantize inp out MIX` does.

    `tensor_types` are llama-quantize's --tensor-type PATTERN=TYPE (a regular expression
    searched in each tensor name; the first that matches wins); `out` None names the output
    ggml-model-MIX.gguf beside the input. `prune_layers` drops those layers and renumbers the
    rest (--prune-layers); `keep_split` writes a split input as the same files, named
    OUT-0000i-of-0000N.gguf with OUT's .gguf left out (--keep-split). `progress` None shows a
    bar on a terminal only. Raises ValueError (or OSError) naming the file, tensor or option
    at fault.
    """
    chosen = mix if isinstance(mix, Mix) else parse_mix(str(mix))
    if chosen is None:
        raise ValueError(f"invalid ftype {mix!r}: see the list of mixes in --help")
    inp = Path(inp)
    if out is None and not dry_run:
        out = inp.parent / f"ggml-model-{chosen.name}.gguf"
    out = None if out is None else Path(out)
    if out is not None and not dry_run and not keep_split and _same_file(inp, out):
        raise ValueError(f"input and output files are the same: '{inp}'")
    params = Params(ftype=chosen.ftype, quantize_output_tensor=not leave_output_tensor,
                    only_copy=chosen.name == "COPY", pure=pure, tensor_types=[_tensor_type(s) for s in tensor_types],
                    output_tensor_type=_ggml_type(output_tensor_type, "--output-tensor-type"),
                    token_embedding_type=_ggml_type(token_embedding_type, "--token-embedding-type"))
    if include_weights and exclude_weights:
        raise ValueError("--include-weights and --exclude-weights cannot be used together")
    overrides = [parse_override_kv(s) for s in override_kv]
    im = load_imatrix(imatrix, list(include_weights), list(exclude_weights)) if imatrix is not None else None
    if im is not None and im.data:
        overrides += _imatrix_keys(im, imatrix)
    with GGUFFile(inp) as f:
        plan = make_plan(f, params, im if im is not None and im.data else None, allow_requantize, overrides,
                         sorted(set(prune_layers)), keep_split)
        paths = [] if out is None or dry_run else output_paths(out, plan.n_split, keep_split)
        for path in paths:
            if any(_same_file(part, path) for part in f.paths):
                raise ValueError(f"input and output files are the same: '{path}'")
        result = QuantizeResult(paths, chosen, {tp.name: tp.dst_type for tp in plan.tensors},
                                sum(f.tensors[tp.source].nbytes for tp in plan.tensors),
                                sum(tp.dst_bytes for tp in plan.tensors),
                                sum(t.n_elements for t in f.tensors.values()), plan.warnings)
        if paths:
            _write(f, plan, paths, nthread, progress)
    return result


def output_paths(out: Path, n_split: int, keep_split: bool) -> list[Path]:
    """The files written: OUT, or with keep_split llama_split_path's PREFIX-0000i-of-0000N.gguf
    for each, PREFIX being OUT without its .gguf (one file too, when the input is not split)."""
    if not keep_split:
        return [out]
    prefix = out.with_name(out.name[:-len(".gguf")]) if out.name.endswith(".gguf") else out
    return [split_path(prefix, i, n_split) for i in range(n_split)]


def _write(f: GGUFFile, plan: Plan, paths: list[Path], nthread: int, progress: bool | None) -> None:
    """Each file under a temporary name in its folder, all renamed once every one is complete.
    With more than one thread and enough to convert, `nthread` worker processes encode
    (numpy's small per-block steps hold the GIL too often for threads to help), a few units
    ahead of the writer, which keeps the file order."""
    nthread = nthread if nthread > 0 else (os.cpu_count() or 1)
    work = sum(tp.n_rows * tp.ne[0] for tp in plan.tensors if tp.convert)
    pool = _pool(nthread) if nthread > 1 and work >= PARALLEL_ELEMENTS else None
    submit = pool.submit if pool is not None else _inline
    bar = _progress_bar(len(plan.tensors), progress)
    tmps: list[Path] = []
    try:
        for i, out in enumerate(paths):
            fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
            tmps.append(Path(tmp))
            kvs, tensors = plan.shard(i)
            with os.fdopen(fd, "wb") as fh:
                fh.write(header_bytes(kvs, tensors))
                pending: deque[tuple[TensorPlan, Piece]] = deque()
                for item in _pieces(f, tensors, submit):
                    pending.append(item)
                    while len(pending) > 2 * nthread:
                        _emit(fh, *pending.popleft(), bar)
                while pending:
                    _emit(fh, *pending.popleft(), bar)
            os.chmod(tmp, 0o666 & ~_umask())
        for tmp, out in zip(tmps, paths):
            os.replace(tmp, out)
    except BaseException:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if bar is not None:
            bar.close()


def _pool(nthread: int) -> ProcessPoolExecutor:
    """Worker processes, forked where the OS can (a spawned worker re-imports the caller's
    __main__, which breaks scripts without a __main__ guard), and started now, while this
    process runs no other thread."""
    methods = multiprocessing.get_all_start_methods()
    pool = ProcessPoolExecutor(nthread, mp_context=multiprocessing.get_context("fork" if "fork" in methods else None))
    pool.submit(int).result()   # a fork context starts every worker on the first task
    return pool


def _inline(fn: Callable[..., np.ndarray], *args: Any) -> np.ndarray:
    return fn(*args)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _ggml_type(value: str | GGMLType | None, option: str) -> GGMLType | None:
    if value is None or isinstance(value, GGMLType):
        return value
    try:
        return parse_ggml_type(value)
    except ValueError as e:
        raise ValueError(f"{option}: {e}") from None


def _tensor_type(text: str) -> tuple[str, GGMLType]:
    """parse_tensor_type: NAME=TYPE, the name lowercased as llama-quantize does."""
    name, sep, qtype = text.partition("=")
    if not sep:
        raise ValueError(f"--tensor-type: malformed tensor type {text!r} (expected PATTERN=TYPE)")
    if not name:
        raise ValueError(f"--tensor-type {text!r}: missing tensor name")
    if not qtype:
        raise ValueError(f"--tensor-type {text!r}: missing quantization type")
    return name.lower(), _ggml_type(qtype, f"--tensor-type {text!r}")


def _imatrix_keys(im: Imatrix, path: str | os.PathLike) -> list:
    """The quantize.imatrix.* keys llama-quantize records (strings cut to 127 bytes)."""
    from ggmlpy.gguf import GGUFValueType as V
    keys = [("quantize.imatrix.file", V.STRING, _cut(os.fspath(path)))]
    if im.datasets:
        keys.append(("quantize.imatrix.dataset", V.STRING, _cut(im.datasets[0])))
    keys.append(("quantize.imatrix.entries_count", V.UINT32, len(im.data)))
    if im.chunk_count > 0:
        keys.append(("quantize.imatrix.chunks_count", V.UINT32, im.chunk_count))
    return keys


def _cut(s: str) -> str:
    return s.encode("utf-8", "surrogateescape")[:127].decode("utf-8", "surrogateescape")

