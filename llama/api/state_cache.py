"""llama-cpp-python's prompt cache, `Llama.set_cache(LlamaRAMCache())`: saved states keyed by
the tokens they hold, so a completion whose prompt continues an earlier conversation (not
just the last one, which the KV cache itself still holds) starts from that conversation's
cache instead of decoding it again.

Before a completion the state whose tokens share the longest prefix with the prompt is
loaded when that prefix is longer than what the KV cache already shares; after it, the
state of prompt + completion is stored. The least recently used states go first when the
stored states exceed `capacity_bytes` (the KV arrays' bytes, which is what they hold)."""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

from llama.api.compat import longest_token_prefix

if TYPE_CHECKING:
    from llama.api.llama import Llama, LlamaState


class LlamaRAMCache:
    """States in memory, least recently used evicted past `capacity_bytes`."""

    def __init__(self, capacity_bytes: int = 2 << 30):
        self.capacity_bytes = capacity_bytes
        self.states: OrderedDict[tuple[int, ...], "LlamaState"] = OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(state.llama_state_size for state in self.states.values())

    def _longest_prefix_key(self, key: tuple[int, ...]) -> tuple[int, ...] | None:
        best, best_len = None, 0
        for k in self.states:
            n = longest_token_prefix(k, key)
            if n > best_len:
                best, best_len = k, n
        return best

    def __getitem__(self, key: Sequence[int]) -> "LlamaState":
        found = self._longest_prefix_key(tuple(key))
        if found is None:
            raise KeyError("no cached state shares a prefix with these tokens")
        self.states.move_to_end(found)
        return self.states[found]

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._longest_prefix_key(tuple(key)) is not None

    def __setitem__(self, key: Sequence[int], value: "LlamaState") -> None:
        key = tuple(key)
        self.states.pop(key, None)
        self.states[key] = value
        while self.cache_size > self.capacity_bytes and len(self.states) > 1:
            self.states.popitem(last=False)


LlamaCache = LlamaRAMCache   # llama-cpp-python's older name


def load_best(llm: "Llama", prompt: list[int]) -> None:
    """Before a completion: load the cached state that shares more of `prompt` than the
    KV cache does (nothing when no state does)."""
    cache = llm.cache
    if cache is None:
        return
    try:
        state = cache[prompt]
    except KeyError:
        return
    if longest_token_prefix(state.tokens, prompt) > longest_token_prefix(llm.engine.cached[0], prompt):
        llm.load_state(state)


def store(llm: "Llama") -> None:
    """After a completion: keep the state of what the KV cache now holds."""
    if llm.cache is not None and llm.engine.cached[0]:
        llm.cache[llm.engine.cached[0]] = llm.save_state()
