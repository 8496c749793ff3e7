"""`Model.load`: GGUF -> architecture -> hparams -> vocab -> checked weights (docs/architecture.md, steps 2-6).

Weights stay in the file's memory map (zero copy), or with use_mmap=False in the file's bytes
read into memory; use_mlock locks them in RAM, kv_overrides retype metadata before anything
reads it, check_tensors validates the weights' values. A half-built model is never handed
out: any failure, or a progress callback returning False, closes the file and raises.
"""
from __future__ import annotations

import copy
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from ggmlpy.gguf import GGUFFile
from ggmlpy.hub import resolve_model
from llama.placement import Placement, make_device_backend, parse_devices
from llama.adapter import LoraAdapter, load_lora
from llama.arch import Architecture, get_arch
from ggmlpy.quants.validate import can_validate, validate_tensor
from llama.hparams import HParams, MetadataReader, load_common
from llama.kv_overrides import KVOverrideValue, apply_kv_overrides
from llama.vocab import Vocab
from llama.weights import TensorTable, WeightRef, check_tensor_types

ProgressCallback = Callable[[float], "bool | None"]
log = logging.getLogger("llama.model")


class LoadCancelled(RuntimeError):
    """The progress callback returned False (llama.cpp's status -2)."""


@dataclass(eq=False, repr=False)
class Model:
    """A loaded model: hparams, vocab and weights (views into the GGUF memory map)."""

    path: Path
    gguf: GGUFFile
    arch: Architecture
    hparams: HParams
    vocab: Vocab
    w: SimpleNamespace | None
    layers: list[SimpleNamespace]
    n_gpu_layers: int
    load_ms: float
    # where weights and KV cache layers live (docs/architecture.md, step 6); inactive without devices
    placement: Placement | None = None
    # whether backends may keep weights in layouts of their own (llama.cpp's use_extra_bufts;
    # False: every weight read as the file stores it, --no-repack)
    repack: bool = True
    # what backends derive from the weights once per model (the CPU backend's repacked
    # weights), shared by every context
    backend_cache: dict = field(default_factory=dict, init=False)
    loras: list[LoraAdapter] = field(default_factory=list, init=False)  # loaded adapters, by id

    def __post_init__(self) -> None:
        self.placement = self.placement or Placement.plan(self.hparams.n_layer)

    @classmethod
    def load(cls, path: str | os.PathLike, n_gpu_layers: int = 0, vocab_only: bool = False,
             progress: ProgressCallback | None = None, *, devices: list[str] | None = None,
             tensor_split: list[float] | None = None, download: bool = True, use_mmap: bool = True,
             use_mlock: bool = False, kv_overrides: dict[str, KVOverrideValue] | None = None,
             check_tensors: bool = False, override_tensor: list[str] | None = None,
             repack: bool = True) -> "Model":
        """Load a GGUF file (or a known model name such as `smollm2-135m`).

        devices: offload devices by name ("cuda:0", or "cpu:1", a second CPU backend); the
        host CPU is always there and keeps the input layer. n_gpu_layers: how many of the
        last layers (the output layer counts as one) go to the devices; tensor_split: their
        shares (default: by free memory, equal for CPU devices); override_tensor: llama.cpp's
        `-ot` items, "PATTERN=DEVICE" (a regex searched in weight names; DEVICE "cpu" or one
        of `devices`): matching weights go there whatever their layer, the first item winning.

        use_mmap=False reads the file into memory instead of mapping it (a failed map does
        too); use_mlock locks the weights in RAM (a refusal is a warning, not an error);
        kv_overrides replaces or adds metadata values (bool/int/float/str, matching the
        key's type) before hparams and vocab are read; check_tensors raises
        TensorDataError for a NaN/Inf weight or quantisation scale, naming the tensor.
        repack=False (llama.cpp's --no-repack) keeps every weight in the file's layout: the CPU
        backend then holds no repacked copy (its products on the file's blocks are slower;
        IQ3_S, IQ3_XXS, IQ2_XS and IQ2_S repacked take 27-57% more memory than in the file).

        A file the engine cannot run is refused here, naming what it lacks (UnsupportedModel:
        an unknown architecture, or UnsupportedTensorType for a tensor type it cannot
        compute), never at the first decode."""
        t0 = time.perf_counter()
        resolved = resolve_model(path, download=download)
        gguf = GGUFFile(resolved, use_mmap=use_mmap)
        try:
            apply_kv_overrides(gguf, kv_overrides)
            arch_name = gguf.metadata.get("general.architecture")
            if not isinstance(arch_name, str):
                raise ValueError(f"{resolved}: general.architecture is missing")
            arch = get_arch(arch_name)
            hp = load_common(gguf.metadata, arch_name)
            arch.load_hparams(MetadataReader(gguf.metadata, arch_name), hp)
            vocab = Vocab.from_metadata(gguf.metadata)
            if not hp.n_vocab:
                hp.n_vocab = vocab.n_vocab
            w, layers = None, []
            if not vocab_only:
                table = TensorTable()
                arch.tensors(hp, table)
                w, layers = table.resolve(gguf.tensors)
                check_tensor_types(gguf.tensors)
                _load_tensor_data(gguf, progress, check_tensors)
                if use_mlock:
                    gguf.mlock()
            model = cls(Path(resolved), gguf, arch, hp, vocab, w, layers, n_gpu_layers,
                        (time.perf_counter() - t0) * 1000, repack=repack)
            if not vocab_only:
                model.placement = model.place(devices, n_gpu_layers, tensor_split,
                                              override_tensor=override_tensor)
        except BaseException:
            gguf.close()
            raise
        return model

    def place(self, devices: list[str] | None = None, n_gpu_layers: int = 0,
              tensor_split: list[float] | None = None, *,
              make_backend: Callable[[str], Any] | None = None,
              override_tensor: list[str] | None = None) -> Placement:
        """Where this model's layers, weights and KV cache would live (docs/architecture.md, step 6): layers to
        devices, then llama.cpp's check that each device can run its weights' ops. Without an
        output matrix the output reads the token embeddings, which then also live on the
        output device (TENSOR_DUPLICATED). `make_backend(device)` makes the backend that
        probes a device (`ggmlpy viz` passes one that works without a GPU); override_tensor:
        as Model.load's."""
        return self.place_with_probes(devices, n_gpu_layers, tensor_split, make_backend=make_backend,
                                      override_tensor=override_tensor)[0]

    def place_with_probes(self, devices: list[str] | None = None, n_gpu_layers: int = 0,
                          tensor_split: list[float] | None = None, *,
                          make_backend: Callable[[str], Any] | None = None,
                          override_tensor: list[str] | None = None
                          ) -> tuple[Placement, dict[str, Any]]:
        """`place`, and the backends it probed the devices with, by device name
        (`make_backend` None: `make_device_backend`, looked up at the call)."""
        make_backend = make_backend or make_device_backend
        n_layer = self.hparams.n_layer
        w = self.w
        tied = [w.tok_embd.name] if w is not None and getattr(w, "output", None) is None \
            and getattr(w, "tok_embd", None) is not None else []
        devs = parse_devices(devices)
        if not devs:
            return Placement.plan(n_layer, None, n_gpu_layers, tied=tied, override_tensor=override_tensor), {}
        probes = {d: make_backend(d) for d in devs}
        free = [be.free_memory() for be in probes.values()]
        placement = Placement.plan(n_layer, devs, n_gpu_layers, tensor_split, free, tied, override_tensor)
        placement.check_weights(((r.name, r.type, r.ne) for r in self.weight_refs()), probes.__getitem__)
        return placement, probes

    # weights ----------------------------------------------------------------------------------
    def weight_arrays(self) -> dict[str, np.ndarray]:
        """Every weight's bytes by name, zero-copy from the memory map; the adapters' too."""
        out = {name: info.data for name, info in self.gguf.tensors.items()}
        for adapter in self.loras:
            out.update(adapter.arrays())
        return out

    def load_lora(self, path: str | os.PathLike) -> LoraAdapter:
        """Load a LoRA adapter for this model (llama_adapter_lora_init); contexts apply it
        with Context.set_adapter_lora. Raises LoraError naming the file and tensor."""
        if self.w is None:
            raise ValueError("the model was loaded with vocab_only=True: it has no weights to adapt")
        adapter = load_lora(self, path, len(self.loras))
        self.loras.append(adapter)
        return adapter

    def weight_refs(self) -> list[WeightRef]:
        refs = [r for r in vars(self.w).values() if r is not None] if self.w else []
        for layer in self.layers:
            refs += [r for r in vars(layer).values() if r is not None]
        return refs

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(info.ne)) for info in self.gguf.tensors.values())

    @property
    def size_bytes(self) -> int:
        return sum(info.nbytes for info in self.gguf.tensors.values())

    # vocab shortcuts (the public API of docs/architecture.md, steps 9 and 16) ----------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        return self.vocab.token_to_piece(token, special=special)

    def detokenize(self, ids, remove_special: bool = False, unparse_special: bool = False) -> str:
        return self.vocab.detokenize(ids, remove_special=remove_special, unparse_special=unparse_special)

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    def with_hparams(self, hparams: HParams) -> "Model":
        """This model seen with other hyperparameters (a context's RoPE overrides): file,
        weights, vocab, placement and backend caches are shared, nothing is copied, and
        this model is left as it is. Closing either closes the shared file."""
        view = copy.copy(self)
        view.hparams = hparams
        return view

    def close(self) -> None:
        for adapter in self.loras:
            adapter.close()
        self.gguf.close()

    def __repr__(self) -> str:
        hp = self.hparams
        return (f"Model({self.path.name}: {hp.arch}, {hp.n_layer} layers, n_embd {hp.n_embd}, "
                f"n_vocab {self.n_vocab})")


def _load_tensor_data(gguf: GGUFFile, progress: ProgressCallback | None, check: bool) -> None:
    """Progress per tensor (0.0, then after each one up to 1.0): the bytes are already mapped
    or read, so what moves is the check of each tensor's values (check_tensors, as
    llama.cpp's load_all_data validates each tensor it loads), or nothing but the count."""
    n = len(gguf.tensors)
    if progress is not None and progress(0.0) is False:
        raise LoadCancelled("model loading cancelled by the progress callback")
    for i, info in enumerate(gguf.tensors.values()):
        if check:
            if can_validate(info.type):
                validate_tensor(info.name, info.type, info.data)
            else:
                log.warning("check_tensors: %s tensors cannot be validated; %s not checked",
                            info.type.name, info.name)
        if progress is not None and progress((i + 1) / max(n, 1)) is False:
            raise LoadCancelled("model loading cancelled by the progress callback")
