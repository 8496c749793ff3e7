"""The shared block allocator (passes/arena.py) and the CUDA planner built on it: best fit,
merging, growth at the top, alignment and peak on hand-computed cases; random interval lists
(hypothesis) never give two live blocks the same bytes, for the allocator and for plan_arena
on synthetic steps; on SmolLM2's real decode steps the plan is checked for overlap and against
the CUDA planner's former first-fit algorithm (copied here as the oracle)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ggmlpy.codegen_cuda.fusion import LowerOptions, lower_split
from ggmlpy.codegen_cuda.planner import ALIGN, nbytes, plan_arena
from ggmlpy.codegen_cuda.steps import Step
from ggmlpy.ir import N_TOKENS, GGMLType, GraphBuilder
from ggmlpy.ir.tensor import Flag, memory_root
from ggmlpy.passes.arena import Arena
from ggmlpy.passes.pipeline import run_pipeline

F32 = GGMLType.F32


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


# the allocator --------------------------------------------------------------------------------
def test_best_fit_takes_the_smallest_block_that_fits():
    arena = Arena(64)
    offs = [arena.alloc(i, s) for i, s in enumerate([256, 64, 128, 64, 192, 64])]
    assert offs == [0, 256, 320, 448, 512, 704]
    for i in (0, 2, 4):  # holes of 256 at 0, 128 at 320, 192 at 512
        arena.free(i)
    assert arena.alloc(10, 130) == 512      # 192 is the smallest hole >= 192 (130 aligned)
    assert arena.alloc(11, 100) == 320      # 128, not the first hole (256 at 0)
    assert arena.alloc(12, 64) == 0         # only the 256 hole is left: its front
    assert arena.free_blocks == [(64, 192)]
    assert arena.top == 768


def test_best_fit_prefers_the_lowest_offset_on_ties():
    arena = Arena(64)
    for i in range(5):
        arena.alloc(i, 64)
    arena.free(3)
    arena.free(1)
    assert arena.alloc(9, 64) == 64


def test_freed_neighbours_merge_into_one_block():
    arena = Arena(64)
    for i in range(5):
        arena.alloc(i, 64)                  # 0, 64, 128, 192, 256; top 320
    arena.free(1)
    arena.free(3)
    assert arena.free_blocks == [(64, 64), (192, 64)]
    arena.free(2)                           # joins both neighbours
    assert arena.free_blocks == [(64, 192)]
    assert arena.alloc(7, 192) == 64        # fits only because they merged
    assert arena.top == 320 and arena.free_blocks == []


def test_a_free_block_at_the_top_grows():
    arena = Arena(64)
    arena.alloc(0, 64)
    arena.alloc(1, 128)                     # 64..192
    arena.free(1)
    assert arena.alloc(2, 320) == 64        # grows the top hole instead of starting at 192
    assert arena.top == 384
    arena.free(0)                           # a 64 hole at 0 that is not at the top
    assert arena.alloc(3, 128) == 384 and arena.top == 512


def test_alignment_rounds_every_block():
    arena = Arena(256)
    assert [arena.alloc(i, s) for i, s in enumerate([1, 0, 257, 256])] == [0, 256, 512, 1024]
    assert arena.blocks[2] == (512, 512) and arena.top == 1280
    with pytest.raises(ValueError, match="power of two"):
        Arena(48)
    with pytest.raises(ValueError, match="already has a block"):
        arena.alloc(0, 8)
    with pytest.raises(ValueError, match="negative size"):
        arena.alloc(9, -1)


def test_peak_counts_the_bytes_live_at_each_mark():
    arena = Arena(64)
    arena.alloc(0, 100)                     # 128
    arena.alloc(1, 64)
    arena.note_peak()                       # 192
    arena.free(0)
    arena.alloc(2, 64)                      # into the 128 hole
    arena.note_peak()                       # 128
    assert arena.peak == 192 and arena.live == 128
    arena.alloc(3, 1000)                    # 1024
    assert arena.peak == 192                # not marked yet
    arena.note_peak()
    assert arena.peak == 1152


def test_transfer_hands_a_block_on():
    arena = Arena(64)
    arena.alloc(0, 64)
    arena.alloc(1, 64)
    arena.transfer(0, 5)
    arena.free(0)                           # no block any more: ignored
    assert arena.free_blocks == [] and arena.blocks[5] == (0, 64)
    arena.free(5)
    assert arena.free_blocks == [(0, 64)]
    with pytest.raises(ValueError, match="no block"):
        arena.transfer(0, 6)


# random intervals -----------------------------------------------------------------------------
intervals = st.lists(st.tuples(st.integers(0, 20), st.integers(0, 6), st.integers(0, 2000)),
                     min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(intervals, st.sampled_from([16, 64, 256]))
def test_arena_never_gives_live_blocks_the_same_bytes(spans, alignment):
    """Each (start, length, size) is allocated before step start and freed after step
    start + length; blocks live at the same step must not overlap."""
    arena = Arena(alignment)
    offsets = {}
    for t in range(27):
        for i, (start, _, size) in enumerate(spans):
            if start == t:
                offsets[i] = arena.alloc(i, size)
        arena.note_peak()
        for i, (start, length, _) in enumerate(spans):
            if start + length == t:
                arena.free(i)
    sizes = [-(-max(s, 1) // alignment) * alignment for _, _, s in spans]
    for i, (si, li, _) in enumerate(spans):
        assert offsets[i] % alignment == 0 and offsets[i] + sizes[i] <= arena.top
        for j, (sj, lj, _) in enumerate(spans[:i]):
            if si <= sj + lj and sj <= si + li:
                assert not _overlap((offsets[i], offsets[i] + sizes[i]), (offsets[j], offsets[j] + sizes[j]))
    live_at = [sum(sz for (s, n, _), sz in zip(spans, sizes) if s <= t <= s + n) for t in range(27)]
    assert arena.peak == max(live_at)
    # everything is freed: one free block covers the whole arena
    assert arena.live == 0 and arena.free_blocks == [(0, arena.top)]


# plan_arena on synthetic steps ----------------------------------------------------------------
def _live_spans(steps, owned, keep):
    """Root id -> (first step, last step) touching it, kept roots to the end (independent of
    the planner: roots found through view_src directly)."""
    spans: dict[int, list[int]] = {}
    for i, step in enumerate(steps):
        for t in (*step.reads, *step.writes):
            r = t if t.view_src is None else t.view_src
            if r.id in owned:
                spans.setdefault(r.id, [i, i])[1] = i
    for rid in keep:
        if rid in spans:
            spans[rid][1] = len(steps)
    return spans


def _assert_no_live_overlap(plan, spans):
    ids = sorted(spans)
    assert set(plan.offsets) == set(ids)
    mem = {r: (plan.offsets[r], plan.offsets[r] + plan.sizes[r]) for r in ids}
    for r in ids:
        assert plan.offsets[r] % ALIGN == 0 and mem[r][1] <= plan.size
    for n, a in enumerate(ids):
        for b in ids[n + 1:]:
            if spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]:
                assert not _overlap(mem[a], mem[b]), (a, b, spans[a], spans[b])


step_lists = st.lists(st.tuples(st.lists(st.integers(0, 11), max_size=3), st.lists(st.integers(0, 11), max_size=2)),
                      min_size=1, max_size=14)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 700), min_size=12, max_size=12), step_lists,
       st.sets(st.integers(0, 11), max_size=3), st.integers(1, 9))
def test_plan_arena_never_gives_live_roots_the_same_bytes(widths, touches, kept, n_tokens):
    """Twelve roots of random widths (the odd ones touched through a view, root 11 not
    owned: outside the arena); random steps read and write them."""
    b = GraphBuilder()
    roots = [b.input(f"r{i}", F32, (w, N_TOKENS)) for i, w in enumerate(widths)]
    handles = [b.reshape(r, widths[i] * N_TOKENS) if i % 2 else r for i, r in enumerate(roots)]
    steps = [Step([], reads=[handles[i] for i in r], writes=[handles[i] for i in w]) for r, w in touches]
    owned = {r.id for r in roots[:11]}
    keep = [roots[i].id for i in kept]
    env = {"n_tokens": n_tokens}
    plan = plan_arena(steps, env, owned, keep)
    spans = _live_spans(steps, owned, keep)
    _assert_no_live_overlap(plan, spans)
    for rid in spans:
        r = next(t for t in roots if t.id == rid)
        assert plan.sizes[rid] == -(-(widths[roots.index(r)] * n_tokens * 4) // ALIGN) * ALIGN


def test_a_step_never_writes_over_what_it_reads_last():
    """a dies at the step that reads it and writes b: b still needs its own block; c, written
    after a's last step, takes a's place."""
    b = GraphBuilder()
    x = b.input("x", F32, (64, 4))          # 1024 bytes: 4 alignment units
    a = b.scale(x, 2.0)
    bb = b.scale(a, 2.0)
    c = b.scale(bb, 2.0)
    steps = [Step([a], reads=[x], writes=[a]), Step([bb], reads=[a], writes=[bb]), Step([c], reads=[bb], writes=[c])]
    plan = plan_arena(steps, {}, {a.id, bb.id, c.id}, keep=[c.id])
    assert plan.offsets == {a.id: 0, bb.id: 1024, c.id: 0}
    assert plan.size == 2048


# a real decode graph --------------------------------------------------------------------------
def first_fit_plan(steps, env, owned, keep):
    """The CUDA planner's former algorithm, kept as an independent oracle: roots in order of
    first touch, each at the lowest offset clear of every block still live at that step.
    Returns (offsets, size)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    roots = {}
    for i, step in enumerate(steps):
        for t in (*step.writes, *step.reads):
            r = memory_root(t)
            if r.id in owned:
                first.setdefault(r.id, i)
                last[r.id] = i
                roots[r.id] = r
    for rid in keep:
        if rid in last:
            last[rid] = len(steps)
    sizes = {rid: -(-max(1, nbytes(r, env)) // ALIGN) * ALIGN for rid, r in roots.items()}
    offsets: dict[int, int] = {}
    placed: list[tuple[int, int, int]] = []
    for rid in sorted(first, key=lambda r: (first[r], r)):
        start, size = first[rid], sizes[rid]
        off = 0
        for p_off, p_size, _ in sorted((p for p in placed if p[2] >= start), key=lambda p: p[0]):
            if off + size <= p_off:
                break
            off = max(off, p_off + p_size)
        offsets[rid] = off
        placed.append((off, size, last[rid]))
    return offsets, max((o + s for o, s, _ in placed), default=0)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_smollm2_decode_plan_is_sound_and_no_larger_than_first_fit(smollm2, fuse):
    graph = run_pipeline(smollm2.graph(1), "ref").graph
    steps = lower_split(graph, graph.nodes, LowerOptions(fuse=fuse))
    written = {memory_root(t).id: memory_root(t) for s in steps for t in s.writes}
    owned = {rid for rid, r in written.items() if not r.flags & (Flag.INPUT | Flag.WEIGHT | Flag.CACHE)}
    keep = [memory_root(o).id for o in graph.outputs if memory_root(o).id in written]
    env = {"n_tokens": 1, "n_kv": 256, "n_outputs": 1}
    plan = plan_arena(steps, env, owned, keep)
    spans = _live_spans(steps, owned, keep)
    assert len(spans) > 100  # the whole model: 30 layers of steps
    _assert_no_live_overlap(plan, spans)
    old_offsets, old_size = first_fit_plan(steps, env, owned, keep)
    assert set(old_offsets) == set(plan.offsets)
    assert plan.size <= old_size * 1.05, (plan.size, old_size)
    # the arena is at least what is live at the busiest step
    busiest = max(sum(plan.sizes[r] for r, (f, l) in spans.items() if f <= i <= l) for i in range(len(steps)))
    assert busiest <= plan.size
