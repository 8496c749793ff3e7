"""Regenerate iq_grids.npz, the lookup tables of ggml's I-quants, from ggml's C sources.

The I-quants decode through fixed tables: grids of 4 or 8 small values per index
(iq2xxs_grid ... iq1s_grid), the sign patterns of 7 stored bits (ksigns_iq2xs) and the 4-bit
non-linear values (kvalues_iq4nl). They are data, not code: this script copies them out of
ggml-common.h verbatim, so the decoders read exactly the numbers ggml reads. When
ggml-quants.c sits beside it, it also checks that the quantisers' level grids (kgrid_* in
iq2xs_init_impl / iq3xs_init_impl), which ggmlpy derives from the decoding grids, are what
ggml builds its own searches from. Not a test and not run at import; the package loads the
file it writes.

    python -m ggmlpy.quants.make_iq_grids PATH/TO/llama.cpp/ggml/src
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().with_name("iq_grids.npz")

# table name in ggml-common.h -> numpy dtype of its entries
TABLES: dict[str, str] = {
    "kmask_iq2xs": "u1",
    "ksigns_iq2xs": "u1",
    "iq2xxs_grid": "<u8",
    "iq2xs_grid": "<u8",
    "iq2s_grid": "<u8",
    "iq3xxs_grid": "<u4",
    "iq3s_grid": "<u4",
    "iq1s_grid": "<u8",
    "kvalues_iq4nl": "i1",
}

# quantiser level grid in ggml-quants.c -> the decoding grid whose index order it shares
KGRIDS = {"kgrid_2bit_1024": "iq2s_grid", "kgrid_256": "iq3xxs_grid", "kgrid_512": "iq3s_grid"}

_TABLE = re.compile(r"GGML_TABLE_BEGIN\(\s*\w+\s*,\s*(\w+)\s*,\s*\w+\s*\)(.*?)GGML_TABLE_END\(\)", re.S)
_KGRID = re.compile(r"static const uint16_t (\w+)\[\w+\] = \{(.*?)\};", re.S)
_NUMBER = re.compile(r"-?0x[0-9a-fA-F]+|-?\d+")


def _numbers(body: str) -> list[int]:
    return [int(n, 0) for n in _NUMBER.findall(re.sub(r"//[^\n]*", "", body))]


def read_tables(common_h: Path) -> dict[str, np.ndarray]:
    """The tables of TABLES, as ggml-common.h's C (CPU) branch defines them."""
    found: dict[str, np.ndarray] = {}
    for name, body in _TABLE.findall(common_h.read_text()):
        if name in TABLES and name not in found:
            found[name] = np.array(_numbers(body), dtype=np.dtype(TABLES[name]).newbyteorder("="))
    missing = set(TABLES) - set(found)
    if missing:
        raise SystemExit(f"{common_h}: no table {', '.join(sorted(missing))}")
    return found


def level_grid(grid: np.ndarray) -> np.ndarray:
    """The quantiser's packed levels of a decoding grid: each byte replaced by its rank among
    the grid's distinct byte values, packed 2 bits (8-byte grids) or 3 bits (4-byte) apart."""
    width = grid.dtype.itemsize
    values = grid.astype(grid.dtype.newbyteorder("<")).view(np.uint8).reshape(-1, width)
    rank = np.searchsorted(np.unique(values), values)
    shift = np.arange(width) * (2 if width == 8 else 3)
    return (rank.astype(np.int64) << shift).sum(axis=1)


def check_kgrids(quants_c: Path, tables: dict[str, np.ndarray]) -> None:
    kgrids = {name: np.array(_numbers(body)) for name, body in _KGRID.findall(quants_c.read_text())}
    for kname, gname in KGRIDS.items():
        if not np.array_equal(kgrids[kname], level_grid(tables[gname])):
            raise SystemExit(f"{quants_c}: {kname} is not the level grid of {gname}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ggml_src", type=Path, help="ggml/src of a llama.cpp checkout")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    tables = read_tables(args.ggml_src / "ggml-common.h")
    if (args.ggml_src / "ggml-quants.c").exists():
        check_kgrids(args.ggml_src / "ggml-quants.c", tables)
    np.savez_compressed(args.out, **tables)
    print(f"{args.out}: {', '.join(f'{k}[{len(v)}]' for k, v in tables.items())}")


if __name__ == "__main__":
    main()
