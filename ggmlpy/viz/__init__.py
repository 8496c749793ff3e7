"""Graph visualisation: one ubatch's graph, schedule, buffer plan, generated code and profile
as one offline HTML page, Model Explorer JSON or a Chrome/Perfetto trace (`ggmlpy viz`).

It knows the compiler, not the runtime: a `Snapshot` (snapshot.py) is what the compiler
decided for one ubatch (the graph after every pass, the scheduler's splits, copies and causes,
the buffer plan, each kernel's source), gathered by replaying the same steps a Context takes,
without running anything. The graph, placement and backends, and with `--profile` the
per-node times (profile.py), are handed in by the command (ggmlpy/cli/viz_model.py builds
them from a model). Every exporter reads the snapshot, so the page, the Model Explorer graph
and the trace describe the same graph.
"""
from __future__ import annotations

from ggmlpy.viz.snapshot import Snapshot, take_snapshot

__all__ = ["Snapshot", "take_snapshot"]
