"""`Llama.from_pretrained`'s download: a file of a Hugging Face repository, through
huggingface_hub (the optional extra `ggmlpy[hub]`), into its usual cache.

huggingface_hub is the library made for this (cache layout, revisions, resumable downloads,
its own tqdm bar, HF_HUB_OFFLINE); ggmlpy adds only the glob match on the file name that
llama-cpp-python's from_pretrained offers."""
from __future__ import annotations

import fnmatch
from pathlib import Path


def download(repo_id: str, filename: str, *, local_dir: str | None = None,
             cache_dir: str | None = None, revision: str | None = None, verbose: bool = True) -> str:
    try:
        import huggingface_hub
        from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    except ImportError:
        raise ImportError("Llama.from_pretrained needs huggingface_hub: pip install 'ggmlpy[hub]'") from None
    if not verbose:
        disable_progress_bars()
    try:
        if any(ch in filename for ch in "*?["):
            folder = huggingface_hub.snapshot_download(repo_id, allow_patterns=[filename],
                                                       local_dir=local_dir, cache_dir=cache_dir,
                                                       revision=revision)
            matches = sorted(p for p in Path(folder).rglob("*")
                             if p.is_file() and fnmatch.fnmatch(p.name, filename))
            if not matches:
                raise FileNotFoundError(f"no file in {repo_id} matches {filename!r}")
            if len(matches) > 1:
                names = ", ".join(p.name for p in matches)
                raise ValueError(f"{filename!r} matches several files in {repo_id}: {names}")
            return str(matches[0])
        return huggingface_hub.hf_hub_download(repo_id, filename, local_dir=local_dir,
                                               cache_dir=cache_dir, revision=revision)
    except huggingface_hub.errors.LocalEntryNotFoundError as e:
        raise FileNotFoundError(f"{repo_id}/{filename} is not in the local hub cache and the hub "
                                f"cannot be reached (HF_HUB_OFFLINE?): {e}") from None
    finally:
        if not verbose:
            enable_progress_bars()
