"""`ggmlpy inspect [FILE|NAME] [--json]`: what llama.cpp's loader prints about a model file.

The data comes from `ggmlpy.gguf.summary`; this module only lays it out, as aligned text or
as one JSON object with the same content.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ggmlpy.gguf import GGUFFile
from ggmlpy.gguf.summary import ModelSummary, summarize
from ggmlpy.hub import DEFAULT_MODEL, KNOWN_MODELS, resolve_model

MAX_VALUE_CHARS = 60  # longer metadata strings are cut in the text output (not in --json)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "inspect", help="show a GGUF file's header, metadata and tensors",
        description="Show what llama.cpp's loader reports about a GGUF model: version, "
                    "architecture, file type, size and bits per weight, metadata, tensors.")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help=f"a GGUF file, or a known model name ({', '.join(sorted(KNOWN_MODELS))}; "
                        f"default {DEFAULT_MODEL})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = resolve_model(args.model)
    with GGUFFile(path) as f:
        summary = summarize(f)
    if args.json:
        json.dump(summary.to_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_text(summary))
    return 0


def _display(value: Any, cut: bool = False) -> str:
    """One printable line: control characters escaped, undecodable bytes as \\x escapes,
    long text cut when `cut` (string values; array summaries are short already)."""
    if isinstance(value, list):
        text = "[" + ", ".join(repr(v) if isinstance(v, str) else _display(v) for v in value) + "]"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    else:
        text = str(value)
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if cut and len(text) > MAX_VALUE_CHARS:
        text = text[:MAX_VALUE_CHARS - 3] + "..."
    return text


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


def format_text(s: ModelSummary) -> str:
    types = ", ".join(f"{name} {n}" for name, n in s.type_counts.items())
    lines = [
        f"file:          {s.path}" + (f" (+{s.n_parts - 1} more parts)" if s.n_parts > 1 else ""),
        f"GGUF version:  {s.version}",
        f"architecture:  {s.architecture or '(none)'}",
        f"file type:     {s.file_type_name}",
        f"tensors:       {s.n_tensors} ({types})" if types else f"tensors:       {s.n_tensors}",
        f"parameters:    {s.n_params / 1e6:.2f} M ({s.n_params})",
        f"size:          {s.size_mib:.2f} MiB ({s.bpw:.2f} BPW)",
        f"file size:     {s.file_size} bytes, tensor data at {s.data_offset}, "
        f"alignment {s.alignment}",
        "",
        f"metadata: {len(s.metadata)} keys",
    ]
    if s.metadata:
        rows = [[m.key, m.type, "= " + _display(m.value, cut=m.type == "string")] for m in s.metadata]
        lines += _table(rows, set())
    lines += ["", f"tensors: {s.n_tensors}"]
    if s.tensors:
        rows = [["name", "type", "shape", "bytes"]]
        rows += [[t.name, t.type, "[" + ", ".join(map(str, t.shape)) + "]", str(t.nbytes)]
                 for t in s.tensors]
        lines += _table(rows, {3})
    return "\n".join(lines) + "\n"
