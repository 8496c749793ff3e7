"""The offload options shared by `ggmlpy run`, `chat`, `bench`, `graph`, `viz` and `serve`:
llama.cpp's -ngl, --device, --tensor-split, --override-tensor, --cpu-moe, --n-cpu-moe and
--repack / --no-repack.

As with llama-cli and llama-bench, `-ngl N` alone offloads to the GPU when there is one: the
devices default to every CUDA device found. Without one, -ngl is ignored with a warning (as
llama.cpp does when built without GPU support), unless devices were named, which is then an
error naming the device. A second CPU backend (`--devices cpu:1`) makes offloading testable
on a machine without a GPU.
"""
from __future__ import annotations

import argparse
import logging
from typing import Any

from llama.placement import with_cpu_moe

log = logging.getLogger("ggmlpy.cli")


def add_placement_args(p: argparse.ArgumentParser, title: str = "offloading") -> argparse._ArgumentGroup:
    g = p.add_argument_group(title)
    g.add_argument("--devices", "-dev", "--device", dest="devices", type=device_names, default=None,
                   metavar="LIST", help="offload devices, comma-separated (cuda:0, or cpu:1 for a second "
                                        "CPU backend); default with -ngl: every CUDA device")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="n_gpu_layers", type=int, default=None,
                   metavar="N", help="layers on the devices, the output layer counting as one; negative: "
                                     "all (default 0)")
    g.add_argument("-ts", "--tensor-split", dest="tensor_split", type=shares, default=None, metavar="LIST",
                   help="shares of the devices, comma-separated (default: by free memory)")
    g.add_argument("-ot", "--override-tensor", dest="override_tensor", action="append", type=overrides,
                   default=None, metavar="PATTERN=DEVICE,...",
                   help="weights whose name matches the regex PATTERN go to DEVICE (cpu, or one of "
                        "--devices; CUDA0 is read as cuda:0), whatever their layer; repeatable")
    g.add_argument("-cmoe", "--cpu-moe", dest="cpu_moe", action="store_true",
                   help="keep every mixture-of-experts layer's expert weights on the CPU")
    g.add_argument("-ncmoe", "--n-cpu-moe", dest="n_cpu_moe", type=non_negative, default=0, metavar="N",
                   help="keep the expert weights of the first N layers on the CPU")
    g.add_argument("--repack", dest="repack", action="store_true", default=True,
                   help="keep weights in the CPU backend's own layouts (default)")
    g.add_argument("-nr", "--no-repack", dest="repack", action="store_false",
                   help="read every weight as the file stores it: resident once, slower products")
    return g


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def device_names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def overrides(text: str) -> list[str]:
    """One -ot value: comma-separated PATTERN=DEVICE items (llama.cpp splits at commas too)."""
    items = [part for part in text.split(",") if part]
    bad = [item for item in items if "=" not in item.strip("=")]
    if not items or bad:
        raise argparse.ArgumentTypeError(f"expected PATTERN=DEVICE items, comma-separated, got {text!r}")
    return items


def shares(text: str) -> list[float]:
    try:
        return [float(part) for part in text.replace("/", ",").split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def placement_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`devices`, `n_gpu_layers`, `tensor_split` and `override_tensor` for llama.Model.load
    from parsed options (a negative -ngl, as llama-cpp-python's -1, means every layer: the
    placement decides)."""
    ngl = args.n_gpu_layers or 0
    devices = args.devices
    if devices is None and ngl:
        devices = default_devices()
        if not devices:
            log.warning("-ngl %d ignored: no GPU device (name one with --devices, e.g. cpu:1)", ngl)
            ngl = 0
    if args.tensor_split is not None and devices and len(args.tensor_split) != len(devices):
        raise ValueError(f"--tensor-split has {len(args.tensor_split)} shares for {len(devices)} devices")
    # -ot's items first, then --cpu-moe's / --n-cpu-moe's (the first matching item wins)
    items = with_cpu_moe([item for group in args.override_tensor or [] for item in group],
                         args.cpu_moe, args.n_cpu_moe)
    return {"devices": devices or None, "n_gpu_layers": ngl, "tensor_split": args.tensor_split,
            "override_tensor": items or None}


def load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """placement_kwargs and `repack` (--repack / -nr): what llama.Model.load takes from these options."""
    return {**placement_kwargs(args), "repack": args.repack}


def default_devices() -> list[str]:
    """Every GPU device this process can use (the device registry discovers them)."""
    from ggmlpy.sched.registry import default_devices as discovered

    return discovered()
