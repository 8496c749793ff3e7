"""/metrics of the replicas merged into one text, under llama-server's names, so that a
dashboard built for one `ggmlpy serve` (or llama-server) reads the whole deployment:
counters and additive gauges (requests processing, KV cells in use, ...) are summed,
the two throughput gauges are recomputed from the summed counters (an average of
averages would weigh an idle replica like a busy one), the per-slot averages are
averaged (every replica has the same slots), and `ggmlpy:replicas` counts the replicas
that answered the scrape."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

AVERAGED = {"llamacpp:n_busy_slots_per_decode", "llamacpp:kv_cache_usage_ratio"}
RATES = {"llamacpp:prompt_tokens_seconds": ("llamacpp:prompt_tokens_total",
                                            "llamacpp:prompt_seconds_total"),
         "llamacpp:predicted_tokens_seconds": ("llamacpp:tokens_predicted_total",
                                               "llamacpp:tokens_predicted_seconds_total")}


def merge_metrics(texts: list[str]) -> str:
    """Prometheus texts of the replicas -> one, llama-server's names kept."""
    values: dict[str, list[float]] = {}
    meta: dict[str, tuple[str, str, str]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                values.setdefault(s.name, []).append(s.value)
                meta.setdefault(s.name, (fam.name, fam.type, fam.documentation))
    total = {name: sum(v) for name, v in values.items()}
    lines, seen = [], set()
    for name, v in values.items():
        fam, kind, doc = meta[name]
        if name in RATES:
            num, den = (total.get(k, 0.0) for k in RATES[name])
            value = num / den if den else 0.0
        elif name in AVERAGED:
            value = sum(v) / len(v)
        else:
            value = total[name]
        if fam not in seen:
            seen.add(fam)
            lines += [f"# HELP {fam} {doc}", f"# TYPE {fam} {kind}"]
        lines.append(f"{name} {value!r}")
    lines += ["# HELP ggmlpy:replicas Engine replicas that answered this scrape.",
              "# TYPE ggmlpy:replicas gauge", f"ggmlpy:replicas {len(texts)}"]
    return "\n".join(lines) + "\n"
