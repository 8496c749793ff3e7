"""Prefix-affinity routing for the engine replicas (a Ray Serve `RequestRouter`).

Why a custom router and not Serve's power-of-two-choices: each replica keeps its slots'
KV caches between requests, and a chat's next turn re-reads nothing only on the replica
that served the previous turn (llama-server's `cache_prompt`, llama/server/slots.py).
Power of two choices picks two random replicas per request, so with N replicas a
conversation comes back to its replica with probability about 1/N: every other turn
re-decodes the whole history. A session key (hashing a header) would keep conversations
in place, but OpenAI clients send none, and it would miss what the cache really shares:
a prefix of the prompt. So the router remembers, per replica, the texts it recently sent
there (the ingress passes the request's messages or prompt as `affinity`) and sends a
request to the replica holding the longest one that the request continues (a next turn:
the slot holds the previous prompt and its answer), or failing that one sharing at least
`min_prefix_chars` with it (a long common document). A shared system prompt alone does
not pull conversations together: each replica stores it once anyway (seq_cp sharing
across slots), and spreading new conversations keeps the replicas balanced. Affinity
yields to load: a replica whose `slots` are all taken gets no request for its prefix
(it would wait for a whole generation to save a prefill); two choices pick instead. The ingress also pins calls to one replica (`replica=ID`) to gather /metrics and /slots.

The router lives in the caller's process (the ingress replica), where it registers
itself in `ingress.ROUTERS`. Serve ships this class by value (cloudpickle), module
globals included, so the registry cannot be a global of this module.
"""
from __future__ import annotations

import random
from collections import deque
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica


def common_prefix_len(a: str, b: str) -> int:
    """Length of the common prefix, by bisection on slices (C-speed compares)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixAffinityRouter(RequestRouter):
    """Longest-prefix affinity while the replica has a free slot, else two choices
    (counted by this router as well as by Serve's cache, which can lag)."""

    def initialize_state(self, min_prefix_chars: int = 2048, slots: int = 1,
                         history: int = 64, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"unknown PrefixAffinityRouter options: {sorted(kwargs)}")
        self.min_prefix_chars = min_prefix_chars
        self.slots = slots
        self._routed: dict[str, int] = {}  # requests routed and not completed, per replica
        self._history: dict[str, deque[str]] = {}
        self._history_len = history
        from llama.server.ray_serve.ingress import ROUTERS
        ROUTERS[(self._deployment_id.app_name, self._deployment_id.name)] = self

    def replica_ids(self) -> list[str]:
        return sorted(r.unique_id for r in self.curr_replicas)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        kwargs = pending_request.kwargs if pending_request is not None else {}
        pinned = kwargs.get("replica")
        if pinned is not None:  # a call for one replica: that one or none (the caller times out)
            return [[r for r in candidate_replicas if r.replica_id.unique_id == pinned]]
        text = kwargs.get("affinity")
        best = self._best_prefix(text, candidate_replicas) if text else None
        if best is None:
            return self._two_choices(candidate_replicas)
        return [[best], *self._two_choices([r for r in candidate_replicas if r is not best])]

    def _queue_len(self, replica: RunningReplica) -> int:
        """Serve's cached count can lag (it is refreshed by probes and on send); the
        router's own count of what it routed there catches requests routed just now."""
        cached = self.replica_queue_len_cache.get(replica.replica_id) or 0
        return max(cached, self._routed.get(replica.replica_id.unique_id, 0))

    def _best_prefix(self, text: str, candidates: list[RunningReplica]) -> RunningReplica | None:
        best, n_best = None, 0
        for r in candidates:
            for past in self._history.get(r.replica_id.unique_id, ()):
                n = common_prefix_len(past, text)
                if n > n_best and (n == len(past) or n >= self.min_prefix_chars):
                    best, n_best = r, n
        return best if best is not None and self._queue_len(best) < self.slots else None

    def _two_choices(self, candidates: list[RunningReplica]) -> list[list[RunningReplica]]:
        """Two at random, the less busy first (by `_queue_len`), one rank each."""
        pair = sorted(random.sample(candidates, min(2, len(candidates))), key=self._queue_len)
        return [[r] for r in pair]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        self._routed[replica_id.unique_id] = self._routed.get(replica_id.unique_id, 0) + 1
        text = pending_request.kwargs.get("affinity")
        if not text:
            return
        past = self._history.setdefault(replica_id.unique_id, deque(maxlen=self._history_len))
        for old in list(past):  # a turn that extends an older one replaces it
            if text.startswith(old):
                past.remove(old)
        past.appendleft(text)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        n = self._routed.get(replica_id.unique_id, 0)
        if n > 0:
            self._routed[replica_id.unique_id] = n - 1

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        alive = {r.replica_id.unique_id for r in replicas}
        for table in (self._history, self._routed):
            for rid in [rid for rid in table if rid not in alive]:
                del table[rid]

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._history.pop(replica_id.unique_id, None)
        self._routed.pop(replica_id.unique_id, None)
