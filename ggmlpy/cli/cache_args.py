"""The KV cache options shared by `ggmlpy run`, `chat` and `serve`: llama.cpp's
-ctk/--cache-type-k, -ctv/--cache-type-v (the types llama.cpp allows, by its names) and
-fa/--flash-attn (on, off, auto). A quantised V cache needs flash attention: "auto" turns it
on, "off" is refused with llama.cpp's message when the context is made (llama/kv_types.py)."""
from __future__ import annotations

import argparse
from typing import Any

from llama.kv_types import KV_TYPES

FLASH_ATTN = {"on": True, "off": False, "auto": None}


def flash_attn_value(value: str) -> str:
    """llama.cpp's -fa values: on/off/auto (and the booleans it also takes)."""
    v = value.lower()
    v = {"1": "on", "true": "on", "enabled": "on", "0": "off", "false": "off", "disabled": "off"}.get(v, v)
    if v not in FLASH_ATTN:
        raise argparse.ArgumentTypeError(f"expected on, off or auto, got {value!r}")
    return v


def add_cache_type_args(g: Any) -> None:
    """-ctk and -ctv on the parser or group g."""
    allowed = ", ".join(KV_TYPES)
    g.add_argument("-ctk", "--cache-type-k", default="f16", choices=list(KV_TYPES), metavar="TYPE",
                   help=f"KV cache data type for K; allowed values: {allowed} (default f16)")
    g.add_argument("-ctv", "--cache-type-v", default="f16", choices=list(KV_TYPES), metavar="TYPE",
                   help=f"KV cache data type for V; allowed values: {allowed} (default f16; a quantised "
                        "V needs flash attention)")


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """-ctk, -ctv and -fa, as a group of their own (run, chat)."""
    g = p.add_argument_group("KV cache (llama.cpp's options)")
    add_cache_type_args(g)
    g.add_argument("-fa", "--flash-attn", type=flash_attn_value, default="auto",
                   help="on, off or auto (default auto): a quantised V cache needs it")


def cache_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Context/Llama keywords of the options: type_k, type_v, flash_attn."""
    return {"type_k": args.cache_type_k, "type_v": args.cache_type_v, "flash_attn": FLASH_ATTN[args.flash_attn]}
