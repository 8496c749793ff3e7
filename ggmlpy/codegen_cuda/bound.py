"""The host arrays bound to a split's leaves, as the CUDA backend (backend.py) and a running
split (runtime.py) read them: looked up by leaf name, uploaded as raw bytes."""
from __future__ import annotations

from collections import ChainMap
from typing import Any, Mapping

import numpy as np

from ggmlpy.sched.store import BindingError


def host_bytes(host: np.ndarray, name: str) -> np.ndarray:
    """`host` as flat bytes (a view, no copy) for a device upload; BindingError if it is
    not a C-contiguous numpy array."""
    if not isinstance(host, np.ndarray) or not host.flags.c_contiguous:
        raise BindingError(f"data bound for {name!r} must be a C-contiguous numpy array")
    return host.reshape(-1).view(np.uint8)


def binding_maps(bindings: Mapping[str, np.ndarray]) -> list[Mapping[str, np.ndarray]]:
    """The mappings a lookup searches in order: a ChainMap's maps, or the mapping itself."""
    return bindings.maps if isinstance(bindings, ChainMap) else [bindings]


def bound_array(bindings: Mapping[str, np.ndarray], name: str) -> Any:
    """bindings[name], without ChainMap's exception per missed map; BindingError if absent."""
    if isinstance(bindings, ChainMap):
        for m in bindings.maps:
            v = m.get(name)
            if v is not None:
                return v
        raise BindingError(f"no data bound for {name!r}")
    try:
        return bindings[name]
    except KeyError:
        raise BindingError(f"no data bound for {name!r}") from None
