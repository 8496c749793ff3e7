"""`ggmlpy quantize [OPTIONS] IN [OUT] TYPE [NTHREADS]`: llama.cpp's llama-quantize.

The arguments are llama-quantize's: TYPE is a mix name or its file type number (the list is
in --help), OUT may be left out (then ggml-model-TYPE.gguf beside IN), NTHREADS is optional.
The output is llama-quantize's byte for byte, with an importance matrix or without; the work
is in llama.quantize (docs/quantize.md).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

MAX_BUFFER_NOTE = "accepted for llama-quantize's command lines; ggmlpy works in slices of about 4 MiB anyway"


def register(subparsers: Any) -> None:
    from llama.quantize.mixes import mix_help
    p = subparsers.add_parser(
        "quantize", help="quantize a GGUF model (llama-quantize)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Quantize a GGUF model to one of llama-quantize's mixes, writing the file llama-quantize "
                    "writes.\n\nusage as llama-quantize: ggmlpy quantize [options] IN [OUT] TYPE [NTHREADS]",
        epilog="allowed quantization types (name or number):\n\n" + mix_help() +
               "\n\nIQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ1_S, IQ1_M, IQ3_XXS, IQ3_XS and Q2_K_S need an importance "
               "matrix\n(--imatrix) for the tensors whose rows are multiples of 256.")
    p.add_argument("args", nargs="+", metavar="IN [OUT] TYPE [NTHREADS]",
                   help="input model, output path (default: ggml-model-TYPE.gguf beside IN), mix, threads")
    p.add_argument("--allow-requantize", action="store_true",
                   help="allow requantizing tensors that are already quantized (can severely reduce quality)")
    p.add_argument("--leave-output-tensor", action="store_true", help="leave output.weight un(re)quantized")
    p.add_argument("--pure", action="store_true",
                   help="disable k-quant mixtures and quantize all tensors to the same type")
    p.add_argument("--imatrix", metavar="FILE", help="importance matrix (llama-imatrix's GGUF or legacy file)")
    p.add_argument("--include-weights", action="append", default=[], metavar="NAME",
                   help="use the importance matrix only for tensors whose name contains NAME")
    p.add_argument("--exclude-weights", action="append", default=[], metavar="NAME",
                   help="do not use the importance matrix for tensors whose name contains NAME")
    p.add_argument("--output-tensor-type", metavar="TYPE", help="ggml type for output.weight")
    p.add_argument("--token-embedding-type", metavar="TYPE", help="ggml type for token_embd.weight")
    p.add_argument("--tensor-type", action="append", default=[], metavar="PATTERN=TYPE",
                   help="quantize tensors whose name matches the regular expression PATTERN to TYPE "
                        "(may be repeated; the first match wins), e.g. attn_q=q8_0")
    p.add_argument("--tensor-type-file", metavar="FILE",
                   help="PATTERN=TYPE entries separated by spaces or newlines")
    p.add_argument("--override-kv", action="append", default=[], metavar="KEY=TYPE:VALUE",
                   help="set a metadata key in the output (TYPE int, float, bool or str); may be repeated")
    p.add_argument("--dry-run", action="store_true", help="show each tensor's type and the sizes, write nothing")
    p.add_argument("--max-buffer-size", type=int, metavar="MiB", help=MAX_BUFFER_NOTE)
    p.add_argument("--keep-split", action="store_true",
                   help="write a split input as the same files (OUT-00001-of-0000N.gguf, ...), not one")
    p.add_argument("--prune-layers", metavar="L0,L1,...",
                   help="comma-separated layer numbers to drop from the model (the others are renumbered)")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                   help="no progress bar (it shows only on a terminal anyway)")
    p.set_defaults(func=run)


def positionals(args: list[str]) -> tuple[str, str | None, str, int]:
    """llama-quantize's IN [OUT] TYPE [NTHREADS]: the second argument is the type when it
    names a mix, else the output path."""
    from llama.quantize.mixes import parse_mix
    if len(args) < 2:
        raise ValueError("bad arguments: expected IN [OUT] TYPE [NTHREADS]")
    inp, rest = args[0], args[1:]
    if parse_mix(rest[0]) is not None:
        out, mix, rest = None, rest[0], rest[1:]
    else:
        if len(rest) < 2:
            raise ValueError(f"missing ftype after the output path {rest[0]!r}")
        out, mix, rest = rest[0], rest[1], rest[2:]
        if parse_mix(mix) is None:
            raise ValueError(f"invalid ftype {mix!r}: see the list in `ggmlpy quantize --help`")
    if len(rest) > 1:
        raise ValueError(f"unexpected arguments: {shlex.join(rest[1:])}")
    nthread = 0
    if rest:
        try:
            nthread = int(rest[0])
        except ValueError:
            raise ValueError(f"invalid nthread {rest[0]!r}") from None
    return inp, out, mix, nthread


def run(args: argparse.Namespace) -> int:
    from llama.quantize import parse_prune_layers, quantize_file
    prune_layers = parse_prune_layers(args.prune_layers) if args.prune_layers is not None else []
    if args.max_buffer_size is not None and args.max_buffer_size <= 0:
        raise ValueError(f"invalid --max-buffer-size '{args.max_buffer_size}'")
    inp, out, mix, nthread = positionals(args.args)
    tensor_types = list(args.tensor_type)
    if args.tensor_type_file:
        tensor_types += Path(args.tensor_type_file).read_text().split()
    result = quantize_file(
        inp, out, mix, nthread=nthread, leave_output_tensor=args.leave_output_tensor,
        output_tensor_type=args.output_tensor_type, token_embedding_type=args.token_embedding_type,
        tensor_types=tensor_types, allow_requantize=args.allow_requantize, pure=args.pure, imatrix=args.imatrix,
        include_weights=args.include_weights, exclude_weights=args.exclude_weights, override_kv=args.override_kv,
        prune_layers=prune_layers, keep_split=args.keep_split, dry_run=args.dry_run, progress=args.progress)
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.dry_run:
        from llama.quantize.mixes import ggml_name
        for name, t in result.types.items():
            print(f"  {name:<40} {ggml_name(t)}")
    mib = 1024 * 1024
    n = max(result.n_elements, 1)
    print(f"model size  = {result.size_in / mib:8.2f} MiB ({result.size_in * 8 / n:.2f} BPW)")
    print(f"quant size  = {result.size_out / mib:8.2f} MiB ({result.size_out * 8 / n:.2f} BPW)")
    for path in result.paths:
        print(f"wrote {path} ({result.mix.name})")
    return 0
