"""The one error type of the grammar package."""
from __future__ import annotations


class GrammarError(ValueError):
    """A grammar or schema that cannot be used, or a token the grammar forbids.

    Bad grammars are reported when a `Grammar` (or a `GrammarSampler`) is built, with
    llguidance's own message, so a request fails before any token is generated.
    """
