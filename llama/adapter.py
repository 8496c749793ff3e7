"""LoRA adapters, as llama.cpp's llama_adapter_lora: low-rank pairs loaded beside a model.

An adapter file is a GGUF with `general.type` "adapter", `adapter.type` "lora", the model's
`general.architecture` and `adapter.lora.alpha`. For some of the model's matrices W
(ggml ne [n_in, n_out]) it holds `W.lora_a` [n_in, r] and `W.lora_b` [r, n_out]; the
adapted product is W·x + s·B·(A·x) with s = scale·alpha/r (the scale alone when alpha is
0), as llama.cpp's build_lora_mm. The token embedding's pair is stored the other way round
(A [r, n_vocab], looked up by token like the embedding; B [r, n_embd]), as llama.cpp's
build_inp_embd reads it. `*_norm.weight` tensors are skipped, as llama.cpp skips them.

An adapter belongs to its model (llama_adapter_lora_init(model, path)): its tensors join
the model's weights under names of their own (`blk.0.attn_q.weight.lora_a.0` for adapter
0), which keep the layer prefix, so each backend binds, repacks and places them with that
layer's weights. Contexts choose which adapters apply, with what scale (llama/lora_scales.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ggmlpy.gguf import GGUFError, GGUFFile
from ggmlpy.ir.types import GGMLType
from llama.weights import WeightRef

if TYPE_CHECKING:
    from llama.model import Model

TOKEN_EMBD = "token_embd.weight"
# what the converters write (convert_lora_to_gguf.py --outtype f32/f16/bf16/q8_0), and
# what every backend's products read
SUPPORTED_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0)


class LoraError(ValueError):
    """An adapter file that is not a LoRA for this model; the message names file and tensor."""


@dataclass(frozen=True)
class LoraWeight:
    """The pair adapting one model matrix, and the factor alpha/r its products take."""

    a: WeightRef
    b: WeightRef
    alpha_scale: float  # alpha / r, or 1.0 when the file's alpha is 0 (llama.cpp's get_scale)


class LoraAdapter:
    """One loaded adapter file; `id` is its index among the model's adapters."""

    def __init__(self, adapter_id: int, path: Path, gguf: GGUFFile, alpha: float,
                 weights: dict[str, LoraWeight], task_name: str, prompt_prefix: str):
        self.id = adapter_id
        self.path = path
        self.gguf = gguf
        self.alpha = alpha
        self.weights = weights          # by the adapted model tensor's name
        self.task_name = task_name
        self.prompt_prefix = prompt_prefix

    @property
    def token_embd(self) -> LoraWeight | None:
        return self.weights.get(TOKEN_EMBD)

    def matrix(self, name: str) -> LoraWeight | None:
        """The pair of a matrix product's weight (the token embedding's pair adapts the
        lookup only, so a tied output projection, which reads the same tensor, has none)."""
        return None if name == TOKEN_EMBD else self.weights.get(name)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every pair's bytes under its graph name, zero-copy from the file's memory map."""
        out: dict[str, np.ndarray] = {}
        for base, lw in self.weights.items():
            out[lw.a.name] = self.gguf.tensors[_file_name(base, "a")].data
            out[lw.b.name] = self.gguf.tensors[_file_name(base, "b")].data
        return out

    @property
    def nbytes(self) -> int:
        return sum(info.nbytes for info in self.gguf.tensors.values())

    def close(self) -> None:
        self.gguf.close()

    def __repr__(self) -> str:
        return f"LoraAdapter({self.id}: {self.path.name}, {len(self.weights)} matrices, alpha {self.alpha})"


def _file_name(base: str, half: str) -> str:
    return f"{base}.lora_{half}"


def load_lora(model: "Model", path: str | os.PathLike, adapter_id: int) -> LoraAdapter:
    """Read and check an adapter file against `model` (llama_adapter_lora_init's checks, in
    its words where it has them); nothing is kept open when a check fails."""
    path = Path(path)
    try:
        gguf = GGUFFile(path)
    except FileNotFoundError:
        raise LoraError(f"{path}: no such LoRA adapter file") from None
    except GGUFError as e:
        raise LoraError(f"{path}: not a readable GGUF adapter: {e}") from None
    try:
        return _check(model, path, gguf, adapter_id)
    except BaseException:
        gguf.close()
        raise


def _check(model: "Model", path: Path, gguf: GGUFFile, adapter_id: int) -> LoraAdapter:
    meta = gguf.metadata

    def text(key: str) -> str:
        value = meta.get(key, "")
        return value if isinstance(value, str) else ""

    if text("general.type") != "adapter":
        raise LoraError(f"{path}: expect general.type to be 'adapter', but got: {text('general.type')!r}")
    if text("general.architecture") != model.hparams.arch:
        raise LoraError(f"{path}: model arch and LoRA arch mismatch "
                        f"({model.hparams.arch!r} vs {text('general.architecture')!r})")
    if text("adapter.type") != "lora":
        raise LoraError(f"{path}: expect adapter.type to be 'lora', but got: {text('adapter.type')!r}")
    if "adapter.alora.invocation_tokens" in meta:
        raise LoraError(f"{path}: activated LoRA (adapter.alora.invocation_tokens) is not supported")
    alpha = meta.get("adapter.lora.alpha", 0.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not np.isfinite(alpha):
        raise LoraError(f"{path}: adapter.lora.alpha must be a finite number, got {alpha!r}")

    halves: dict[str, dict[str, object]] = {}
    for name, info in gguf.tensors.items():
        for half in ("a", "b"):
            if name.endswith(f".lora_{half}"):
                halves.setdefault(name[: -len(".lora_a")], {})[half] = info
                break
        else:
            if not name.endswith("_norm.weight"):
                raise LoraError(f"{path}: LoRA tensor {name!r} has unexpected suffix")

    model_tensors = {r.name: r for r in model.weight_refs()}
    weights: dict[str, LoraWeight] = {}
    for base in sorted(halves):
        pair = halves[base]
        if "a" not in pair or "b" not in pair:
            raise LoraError(f"{path}: LoRA tensor pair for {base!r} is missing one component")
        a, b = pair["a"], pair["b"]
        w = model_tensors.get(base)
        if w is None:
            raise LoraError(f"{path}: LoRA tensor {base!r} does not exist in base model "
                            "(hint: maybe wrong base model?)")
        for info in (a, b):
            if info.type not in SUPPORTED_TYPES:  # type: ignore[attr-defined]
                raise LoraError(f"{path}: {info.name}: type {info.type.name} is not supported "  # type: ignore[attr-defined]
                                f"(supported: {', '.join(t.name for t in SUPPORTED_TYPES)})")
        a_ne, b_ne = _matrix_ne(path, a), _matrix_ne(path, b)
        if base == TOKEN_EMBD:
            ok = w.ne[0] == b_ne[1] and w.ne[1] == a_ne[1] and a_ne[0] == b_ne[0]
        else:
            ok = w.ne[0] == a_ne[0] and w.ne[1] == b_ne[1]
            if ok and a_ne[1] != b_ne[0]:
                raise LoraError(f"{path}: {base}: lora_a tensor is not transposed (hint: adapter "
                                "from \"finetune\" example is no longer supported)")
        if not ok:
            raise LoraError(f"{path}: tensor {base!r} has incorrect shape (lora_a {list(a_ne)}, "
                            f"lora_b {list(b_ne)} for {list(w.ne)}; hint: maybe wrong base model?)")
        rank = b_ne[0]
        suffix = f".{adapter_id}"
        weights[base] = LoraWeight(
            WeightRef(_file_name(base, "a") + suffix, a.type, a_ne),  # type: ignore[attr-defined]
            WeightRef(_file_name(base, "b") + suffix, b.type, b_ne),  # type: ignore[attr-defined]
            float(np.float32(alpha) / np.float32(rank)) if alpha else 1.0)
    if not weights:
        raise LoraError(f"{path}: the adapter has no LoRA tensor pairs")
    return LoraAdapter(adapter_id, path, gguf, float(alpha), weights,
                       text("adapter.lora.task_name"), text("adapter.lora.prompt_prefix"))


def _matrix_ne(path: Path, info) -> tuple[int, int]:
    ne = tuple(info.ne) + (1,) * (2 - len(info.ne))
    if len(ne) > 2 and any(n != 1 for n in ne[2:]):
        raise LoraError(f"{path}: {info.name}: a LoRA tensor must be a matrix, has shape {list(info.ne)}")
    return int(ne[0]), int(ne[1])
