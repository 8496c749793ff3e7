"""llama-server's speculative decoding options for `ggmlpy serve` (its names and defaults;
what they do: llama/server/speculation.py)."""
from __future__ import annotations

from typing import Any


def _at_least_zero(value: str) -> int:
    n = int(value)
    if n < 0:
        raise ValueError(value)
    return n


def add_speculative_args(g: Any) -> None:
    """--spec-type, -md and the draft's limits on the parser or group g."""
    g.add_argument("--spec-type", default=None, metavar="TYPES",
                   help="comma-separated kinds of speculative decoding: none, ngram-simple, draft-simple, "
                   "draft-mtp (default: none; with -md, draft-mtp for a gemma4-assistant, else draft-simple)")
    g.add_argument("-md", "--model-draft", "--spec-draft-model", dest="model_draft", default=None, metavar="FILE",
                   help="draft model for speculative decoding, of the same vocabulary")
    g.add_argument("--spec-draft-n-max", type=_at_least_zero, default=3, metavar="N",
                   help="tokens the draft model drafts per step (default 3)")
    g.add_argument("--spec-draft-n-min", type=_at_least_zero, default=0, metavar="N",
                   help="shortest draft used (default 0)")
    g.add_argument("--spec-draft-p-min", "--draft-p-min", type=float, default=0.0, metavar="P",
                   help="least probability of a drafted token among the draft's top 10 (default 0.0)")
    g.add_argument("--spec-ngram-simple-size-n", type=int, default=12, metavar="N",
                   help="ngram-simple: tokens looked up in the history (default 12)")
    g.add_argument("--spec-ngram-simple-size-m", type=int, default=48, metavar="M",
                   help="ngram-simple: most tokens drafted after a match (default 48)")


def spec_type_names(args: Any) -> list[str]:
    """--spec-type's comma-separated kinds, as a list."""
    return [t.strip() for t in (args.spec_type or "").split(",") if t.strip()]
