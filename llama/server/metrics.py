"""`/metrics`: llama-server's Prometheus metrics (same names), read from the scheduler at
scrape time by a collector in the app's own registry (no process-global state), plus
ggmlpy's KV cells shared between slots. As llama-server's, the two throughput gauges cover
the time since the previous scrape."""
from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llama.server.scheduler import Scheduler

N_TOKENS_MAX = "n_tokens_max"
RATES = ("prompt_tokens_seconds", "predicted_tokens_seconds")
Sample = tuple[str, str, str, float]
"""(kind: "counter" or "gauge", name without the llamacpp: prefix, help text, value)."""


def samples(sched: Scheduler) -> list[Sample]:
    """The scheduler's metrics now (the throughput buckets taken, so they start anew)."""
    st = sched.stats
    kv = sched.pool.stats()
    prompt_rate, predicted_rate = st.take_rates()
    out: list[Sample] = [
        ("counter", "prompt_tokens", "Number of prompt tokens processed.", st.n_prompt_tokens),
        ("counter", "prompt_tokens_cached", "Number of prompt tokens served from the cache.", st.n_prompt_cached),
        ("counter", "prompt_seconds", "Prompt process time.", st.t_prompt),
        ("counter", "tokens_predicted", "Number of generation tokens processed.", st.n_predicted),
        ("counter", "tokens_predicted_seconds", "Predict process time.", st.t_predicted),
        ("counter", "n_decode", "Number of llama_decode() calls.", st.n_decode),
        ("counter", N_TOKENS_MAX, "Largest observed n_tokens.", st.n_tokens_max),
        ("counter", "sampling_seconds", "Time the slots spent sampling after each decode, while no decode runs "
         "(ggmlpy).", st.t_sampling),
        ("counter", "requests_failed", "Requests that failed (ggmlpy).", st.n_failed),
        ("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call.",
         st.n_busy_slots_total / st.n_decode if st.n_decode else 0.0),
        ("gauge", RATES[0], "Average prompt throughput in tokens/s.", prompt_rate),
        ("gauge", RATES[1], "Average generation throughput in tokens/s.", predicted_rate),
        ("gauge", "kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.",
         kv["cells_used"] / kv["cells_total"]),
        ("gauge", "kv_cache_tokens", "KV-cache cells in use.", kv["cells_used"]),
        ("gauge", "kv_cache_shared_cells", "KV-cache cells held by more than one slot (ggmlpy).", kv["cells_shared"]),
        ("gauge", "requests_processing", "Number of requests processing.", sum(1 for s in sched.pool.slots if s.busy)),
        ("gauge", "requests_deferred", "Number of requests deferred.", sched.n_pending),
    ]
    out += [("counter", "spec_decode_num_draft_tokens", "Speculative: Total draft tokens decoded.",
             st.n_draft_tokens),
            ("counter", "spec_decode_num_accepted_tokens", "Speculative: Total draft tokens accepted.",
             st.n_draft_accepted),
            ("counter", "spec_decode_num_drafts", "Speculative: Total speculative decoding verification steps.",
             st.n_drafts)]
    return out


def without_rates(taken: list[Sample]) -> list[Sample]:
    """`taken` as the next scrape reports it when nothing has run since: no throughput."""
    return [(kind, name, doc, 0.0 if name in RATES else value) for kind, name, doc, value in taken]


class SampleCollector:
    def __init__(self, source: Callable[[], list[Sample] | None]):
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for kind, name, doc, value in self.source() or []:
            if kind == "counter":
                metric = CounterMetricFamily(f"llamacpp:{name}", doc)
                metric.add_metric([], value)
                yield metric
            else:
                yield GaugeMetricFamily(f"llamacpp:{name}", doc, value=value)


def make_registry(source: Callable[[], list[Sample] | None]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SampleCollector(source))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The exposition text. llama-server names one counter without the `_total` suffix
    prometheus_client gives every counter; it is renamed back so scrapers configured for
    llama-server find it."""
    suffixed = f"llamacpp:{N_TOKENS_MAX}_total".encode()
    return generate_latest(registry).replace(suffixed, suffixed[:-len(b"_total")])
