"""The order of the filters in a chain: llama-server's `samplers` field and llama.cpp's
`--samplers` / `--sampling-seq` (common/sampling.cpp's `common_sampler_types_from_names`
and `_from_chars`).

Names are llama.cpp's canonical ones (`top_k`), or their aliases: kebab case (`top-k`), no
separator (`topk`), `nucleus`, `temp`, `typ`; any case. A string is one character per
sampler (`"edskypmxt"`: llama.cpp's default order). A sampler left out is not used; one
named twice runs twice.

Departure: llama.cpp skips a name it does not know with a warning in its log, which a
client never sees; here it is an error naming it. `infill` and `adaptive_p` are llama.cpp
samplers this project does not implement, and are refused the same way.
"""
from __future__ import annotations

from typing import Sequence

# common_params_sampling.samplers: llama.cpp's default order
DEFAULT_ORDER = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                 "temperature")
SUPPORTED = frozenset(DEFAULT_ORDER)
NOT_IMPLEMENTED = frozenset({"infill", "adaptive_p"})

_CHARS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p",
          "p": "top_p", "m": "min_p", "x": "xtc", "t": "temperature", "i": "infill",
          "a": "adaptive_p"}


def _aliases() -> dict[str, str]:
    names = {}
    for canonical in SUPPORTED | NOT_IMPLEMENTED:
        names[canonical] = canonical
        if "_" in canonical:
            names[canonical.replace("_", "-")] = canonical
            names[canonical.replace("_", "")] = canonical
    names.update(nucleus="top_p", temp="temperature", typ="typ_p")
    return names


_NAMES = _aliases()


def parse_order(samplers: str | Sequence[str] | None) -> tuple[str, ...]:
    """Canonical sampler names in order: from a list of names, a string of characters, or
    None (llama.cpp's default order)."""
    if samplers is None:
        return DEFAULT_ORDER
    if isinstance(samplers, str):
        unknown = [c for c in samplers if c not in _CHARS]
        if unknown:
            raise ValueError(f"samplers: unknown sampler character {unknown[0]!r} (known: "
                             f"{''.join(sorted(_CHARS))})")
        names = [_CHARS[c] for c in samplers]
    else:
        names = []
        for i, name in enumerate(samplers):
            if not isinstance(name, str) or name.lower() not in _NAMES:
                raise ValueError(f"samplers[{i}]: unknown sampler {name!r} (known: "
                                 f"{', '.join(sorted(SUPPORTED))})")
            names.append(_NAMES[name.lower()])
    missing = [n for n in names if n in NOT_IMPLEMENTED]
    if missing:
        raise ValueError(f"samplers: {missing[0]!r} is not implemented")
    return tuple(names)
