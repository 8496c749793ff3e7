"""llama.cpp's LoRA flags, shared by `ggmlpy run` and `ggmlpy serve`: --lora FNAME and
--lora-scaled FNAME:SCALE, each a comma-separated list, appending to one list so that the
adapters' ids follow the order of the flags, as in llama.cpp's common arguments."""
from __future__ import annotations

import argparse


class LoraAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        adapters = list(getattr(namespace, self.dest) or [])
        for item in (v for v in str(values).split(",") if v):
            if option_string == "--lora":
                adapters.append((item, 1.0))
                continue
            path, _, scale = item.rpartition(":")
            try:
                adapters.append((path, float(scale)))
            except ValueError:
                path = ""
            if not path:
                parser.error(f"--lora-scaled {item!r}: the format is FNAME:SCALE")
        setattr(namespace, self.dest, adapters)


def add_lora_args(group) -> None:
    """--lora and --lora-scaled into `lora`: [(path, scale), ...]."""
    group.add_argument("--lora", action=LoraAction, dest="lora", default=[], metavar="FNAME",
                       help="a LoRA adapter (comma-separated for several), scale 1")
    group.add_argument("--lora-scaled", action=LoraAction, dest="lora", default=[],
                       metavar="FNAME:SCALE,...",
                       help="a LoRA adapter with its scale (comma-separated for several)")
