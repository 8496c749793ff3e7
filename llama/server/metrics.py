"""`/metrics`: llama-server's Prometheus metrics (same names), read from the scheduler at
scrape time by a collector in the app's own registry (no process-global state), plus
ggmlpy's KV cells shared between slots."""
from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llama.server.scheduler import Scheduler

N_TOKENS_MAX = "n_tokens_max"


class SchedulerCollector:
    def __init__(self, scheduler: Callable[[], Scheduler | None]):
        self.scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        sched = self.scheduler()
        if sched is None:
            return
        st = sched.stats
        kv = sched.pool.stats()

        def counter(name: str, doc: str, value: float) -> Metric:
            m = CounterMetricFamily(f"llamacpp:{name}", doc)
            m.add_metric([], value)
            return m

        def gauge(name: str, doc: str, value: float) -> Metric:
            return GaugeMetricFamily(f"llamacpp:{name}", doc, value=value)

        yield counter("prompt_tokens", "Number of prompt tokens processed.", st.n_prompt_tokens)
        yield counter("prompt_tokens_cached", "Number of prompt tokens served from the cache.",
                      st.n_prompt_cached)
        yield counter("prompt_seconds", "Prompt process time.", st.t_prompt)
        yield counter("tokens_predicted", "Number of generation tokens processed.", st.n_predicted)
        yield counter("tokens_predicted_seconds", "Predict process time.", st.t_predicted)
        yield counter("n_decode", "Number of llama_decode() calls.", st.n_decode)
        yield counter(N_TOKENS_MAX, "Largest observed n_tokens.", st.n_tokens_max)
        for name in ("num_draft_tokens", "num_accepted_tokens", "num_drafts"):   # no speculative decoding
            yield counter(f"spec_decode_{name}", f"Speculative decoding: {name.replace('_', ' ')}.", 0)
        yield counter("sampling_seconds", "Time the slots spent sampling after each decode, "
                      "while no decode runs (ggmlpy).", st.t_sampling)
        yield counter("requests_failed", "Requests that failed (ggmlpy).", st.n_failed)
        yield gauge("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call.",
                    st.n_busy_slots_total / st.n_decode if st.n_decode else 0.0)
        yield gauge("prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
                    st.n_prompt_tokens / st.t_prompt if st.t_prompt else 0.0)
        yield gauge("predicted_tokens_seconds", "Average generation throughput in tokens/s.",
                    st.n_predicted / st.t_predicted if st.t_predicted else 0.0)
        yield gauge("kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.",
                    kv["cells_used"] / kv["cells_total"])
        yield gauge("kv_cache_tokens", "KV-cache cells in use.", kv["cells_used"])
        yield gauge("kv_cache_shared_cells", "KV-cache cells held by more than one slot (ggmlpy).",
                    kv["cells_shared"])
        yield gauge("requests_processing", "Number of requests processing.",
                    sum(1 for s in sched.pool.slots if s.busy))
        yield gauge("requests_deferred", "Number of requests deferred.", sched.n_pending)


def make_registry(scheduler: Callable[[], Scheduler | None]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SchedulerCollector(scheduler))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The exposition text. llama-server names one counter without the `_total` suffix
    prometheus_client gives every counter; it is renamed back so scrapers configured for
    llama-server find it."""
    suffixed = f"llamacpp:{N_TOKENS_MAX}_total".encode()
    return generate_latest(registry).replace(suffixed, suffixed[:-len(b"_total")])
