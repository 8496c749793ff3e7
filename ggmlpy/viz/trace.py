"""Export a profiled step as Chrome / Perfetto trace-event JSON (chrome://tracing, ui.perfetto.dev).

The profile holds, per node and thread, the microseconds in the kernel and at the barrier
after it, averaged over the profiled steps: no timestamps. The threads of a split run the
nodes in order with a barrier after each, so one step is laid out as it runs: a node starts
when the previous one's barrier released every thread, and lasts its threads' mean kernel +
barrier time (NodeTime.total_us). Tracks: one process per backend, one thread track per worker thread (and one for
the copies into that backend); copies are slices with flow events from the node that
produced the tensor; a counter track gives the arena bytes live at each step (the buffer
plan's lifetimes). Copies are not timed by the profiler: they are drawn with a nominal
length and `timed: false`. Splits on backends without a profile appear as one untimed slice.
"""
from __future__ import annotations

from typing import Any

from ggmlpy.ir import dump
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.viz.snapshot import Snapshot

COPY_TID = 1000
COPY_US = 0.5      # the nominal length of an (untimed) copy slice
MEMORY_PID = 999


def trace_events(snap: Snapshot) -> dict[str, Any]:
    if snap.profile is None:
        raise ValueError("a trace needs a profile (ggmlpy viz --profile)")
    graph, sched, prof = snap.graph, snap.schedule, snap.profile
    keys = dump.tensor_keys(graph)
    times = {graph.tensors[pos].id: nt for pos, nt in prof.times.items()}
    pids = {b.name: i + 1 for i, b in enumerate(sched.backends)}
    events: list[dict[str, Any]] = []

    def meta(name: str, pid: int, tid: int, value: str) -> None:
        events.append({"ph": "M", "name": name, "pid": pid, "tid": tid, "ts": 0, "args": {"name": value}})

    used = {s.backend.name for s in sched.splits}
    for name, pid in pids.items():
        if name in used:
            meta("process_name", pid, 0, f"backend {name}")
            for th in range(prof.threads):
                meta("thread_name", pid, th, f"thread {th}")
            meta("thread_name", pid, COPY_TID, "copies in")
    meta("process_name", MEMORY_PID, 0, "memory")

    ts = 0.0
    produced: dict[int, tuple[int, float]] = {}   # tensor id -> (pid, end ts) of its slice
    step_start: dict[int, float] = {}
    for split in sched.splits:
        pid = pids[split.backend.name]
        for c in split.copies:
            ci = sched.copies.index(c)
            args = {"tensor": c.tensor.name or keys[c.tensor.id], "bytes": c.nbytes(snap.env),
                    "from": c.src_backend, "timed": False}
            events.append({"ph": "X", "name": f"copy {c.name}", "cat": "copy", "pid": pid, "tid": COPY_TID,
                           "ts": ts, "dur": COPY_US, "args": args})
            src_pid, src_ts = produced.get(c.tensor.id, (pids.get(c.src_backend, pid), ts))
            events.append({"ph": "s", "name": "copy", "cat": "copy", "id": ci, "pid": src_pid, "tid": 0,
                           "ts": max(0.0, src_ts - 1e-3)})
            events.append({"ph": "f", "bp": "e", "name": "copy", "cat": "copy", "id": ci, "pid": pid,
                           "tid": COPY_TID, "ts": ts + COPY_US / 2})
            ts += COPY_US
        timed = [n for n in split.nodes if n.id in times]
        if not timed:
            computing = [n for n in split.nodes if OPS[n.op].kind != Kind.VIEW]
            events.append({"ph": "X", "name": f"split #{split.index} ({len(computing)} nodes, not profiled)",
                           "cat": "split", "pid": pid, "tid": 0, "ts": ts, "dur": 0.0})
            for n in split.nodes:
                produced[n.id] = (pid, ts)
            continue
        for n in split.nodes:
            step = snap.lifetimes.step_of.get(n.id)
            if step is not None:
                step_start.setdefault(step, ts)
            nt = times.get(n.id)
            if nt is None:
                produced[n.id] = (pid, ts)
                continue
            args = {"tensor": n.name or keys[n.id], "key": keys[n.id], "op": n.op}
            for th, (k, b) in enumerate(zip(nt.kernel_us, nt.barrier_us)):
                events.append({"ph": "X", "name": n.op, "cat": "kernel", "pid": pid, "tid": th, "ts": ts,
                               "dur": k, "args": args})
                if b > 0:
                    events.append({"ph": "X", "name": "barrier", "cat": "barrier", "pid": pid, "tid": th,
                                   "ts": ts + k, "dur": b})
            ts += nt.total_us
            produced[n.id] = (pid, ts)
    lt = snap.lifetimes
    for step in range(lt.n_steps):
        if step in step_start:
            events.append({"ph": "C", "name": "arena bytes", "pid": MEMORY_PID, "tid": 0,
                           "ts": step_start[step], "args": {"live": lt.live[step]}})
    events.append({"ph": "C", "name": "arena bytes", "pid": MEMORY_PID, "tid": 0, "ts": ts, "args": {"live": 0}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"model": snap.model, "mode": prof.mode, "steps_averaged": prof.steps,
                          "threads": prof.threads, "tsc_ghz": prof.tsc_ghz, "step_us_wall": prof.step_us}}
