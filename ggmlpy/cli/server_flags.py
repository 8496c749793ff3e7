"""llama-server's flags that `ggmlpy serve` reads before argparse does: spellings and flags
for features ggmlpy lacks.

llama.cpp's argument parser reads `_` as `-` in a flag's name (`--backend_sampling`); so does
this. A llama-server flag whose feature ggmlpy does not have is refused by name with the
reason, exit status 2, rather than with argparse's usage dump; a few are accepted where
ggmlpy already behaves as the flag asks (`--no-cache-idle-slots`, `--cache-ram 0`: ggmlpy
keeps no idle slots in RAM).
"""
from __future__ import annotations

import sys

# flag -> why ggmlpy refuses it (each takes a value unless listed in NO_VALUE)
UNSUPPORTED = {
    "--mmproj": "ggmlpy runs no vision or audio projector",
    "--mmproj-url": "ggmlpy runs no vision or audio projector",
    "--media-path": "ggmlpy runs no vision or audio projector",
    "--spec-synth-len": "ggmlpy has no synthetic draft acceptance (a benchmarking aid)",
    "--spec-synth-rates": "ggmlpy has no synthetic draft acceptance (a benchmarking aid)",
    "--models-dir": "ggmlpy serves one model (no router mode)",
    "--models-max": "ggmlpy serves one model (no router mode)",
    "--models-preset": "ggmlpy serves one model (no router mode)",
    "--no-models-autoload": "ggmlpy serves one model (no router mode)",
    "--grp-attn-n": "ggmlpy has no group attention (self-extend)",
    "--grp-attn-w": "ggmlpy has no group attention (self-extend)",
    "--backend-sampling": "ggmlpy samples on the host only",
    "--hf-repo": "ggmlpy serve loads a local file or a known model name (-m)",
    "--hf-file": "ggmlpy serve loads a local file or a known model name (-m)",
    "--model-url": "ggmlpy serve loads a local file or a known model name (-m)",
}
NO_VALUE = {"--no-models-autoload", "--backend-sampling"}
# flag -> the values accepted because ggmlpy already does what they ask (None: any, no value)
ALREADY = {"--no-cache-idle-slots": None, "--cache-ram": {"0"}}


class FlagError(ValueError):
    """A llama-server flag `ggmlpy serve` refuses, with the reason."""


def normalize(argv: list[str]) -> list[str]:
    """argv with `_` read as `-` in long flag names (not in values)."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            arg = name.replace("_", "-") + sep + value
        out.append(arg)
    return out


def check(argv: list[str]) -> list[str]:
    """argv without the flags ggmlpy already follows; FlagError for one it lacks."""
    out, i = [], 0
    while i < len(argv):
        name, _, inline = argv[i].partition("=")
        takes_value = name not in NO_VALUE and ALREADY.get(name, "") is not None
        value = inline or (argv[i + 1] if takes_value and not inline and i + 1 < len(argv) else "")
        step = 1 if inline or not takes_value else 2
        if name in ALREADY:
            allowed = ALREADY[name]
            if allowed is not None and value not in allowed:
                raise FlagError(f"{name} {value}: ggmlpy supports only {name} {' or '.join(sorted(allowed))}")
            i += step
            continue
        if name in UNSUPPORTED:
            raise FlagError(f"{name} is not supported: {UNSUPPORTED[name]}")
        out.append(argv[i])
        i += 1
    return out


def preprocess(argv: list[str]) -> list[str]:
    """The serve subcommand's argv as argparse should see it; exits with status 2 and the
    reason on a flag ggmlpy lacks."""
    try:
        return check(normalize(argv))
    except FlagError as e:
        print(f"ggmlpy serve: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
