"""The shortcuts of the generation step (one token per sequence) give what the general paths
give: the ubatch of the allocator and splitter, the logits and KV state of a general-path decode, masks of the
scalar loop, the cell bookkeeping of a brute-force recount, and a failed step undone."""
from __future__ import annotations

import random

import numpy as np
import pytest

import llama
from ggmlpy.testing.models import write_tiny_llama
from llama.batch import Batch, BatchAllocator, UBatch
from llama.graph_inputs import InputBuffers
from llama.kv_cells import KVCells, KVCellsUndo, SWAType
from llama.single_token import generation_ubatch

NEG = -np.inf


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")
    return llama.Model.load(path)


def ub(pos, seqs) -> UBatch:
    n = len(pos)
    return UBatch(tokens=np.zeros(n, np.int32), embd=None, pos=np.asarray(pos, np.int32),
                  seq_ids=[(s,) for s in seqs], output=np.zeros(n, bool), idxs=np.arange(n),
                  n_seq_tokens=1, n_seqs=n, equal_seqs=False, seq_id_unq=sorted(set(seqs)))


def place(kv: KVCells, pos, seqs) -> None:
    u = ub(pos, seqs)
    kv.apply_ubatch(kv.find_slot(u), u)


# -- the ubatch ----------------------------------------------------------------------------

@pytest.mark.parametrize("n_seq_max, batch", [
    (1, Batch.from_tokens([17])),
    (1, Batch.from_tokens([np.int64(17)], logits_all=True)),
    (3, Batch.from_tokens([5], seq_id=2)),
    (3, Batch(tokens=[9], seq_ids=[1])),
    (3, Batch(tokens=[9], seq_ids=[(0,)], logits=[True])),
    (4, Batch(tokens=[9, 10, 11, 12], seq_ids=[[0], [1], [2], [3]], logits=[True] * 4)),
    (4, Batch(tokens=[9, 10, 11], seq_ids=[[3], [0], [2]], logits=[True] * 3)),
    (3, Batch(tokens=[9, 10], seq_ids=[2, 1])),                        # no flags: the last only
    (3, Batch(tokens=[9, 10, 11], seq_ids=[[0], [1], [2]], pos=[4, 5, 6], logits=[True] * 3)),
])
def test_generation_ubatch_equals_allocator_and_split(n_seq_max, batch):
    kv = KVCells(64, n_seq_max)
    for s in range(n_seq_max):
        place(kv, list(range(4 + s)), [s] * (4 + s))
    fast = generation_ubatch(batch, 320, n_seq_max, kv, n_max=512)
    ab = BatchAllocator.init(batch, 320, n_seq_max, kv)
    (slow,) = ab.split_all(512, "simple")
    assert fast is not None
    for name in ("tokens", "pos", "output", "idxs"):
        a, b = getattr(fast, name), getattr(slow, name)
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), name
    assert fast.embd is None and slow.embd is None
    for name in ("seq_ids", "n_seq_tokens", "n_seqs", "equal_seqs", "seq_id_unq", "n_tokens"):
        assert getattr(fast, name) == getattr(slow, name), name
    assert ab.out_ids == fast.idxs[fast.output].tolist()


def test_generation_ubatch_of_an_embeddings_context_outputs_every_token():
    kv = KVCells(16, 2)
    batch = Batch(tokens=[3, 4], seq_ids=[0, 1])
    fast = generation_ubatch(batch, 320, 2, kv, n_max=512, output_all=True)
    (slow,) = BatchAllocator.init(batch, 320, 2, kv, output_all=True).split_all(512, "simple")
    assert fast.output.tolist() == slow.output.tolist() == [True, True]


@pytest.mark.parametrize("batch", [
    Batch(tokens=[True]), Batch(tokens=[320]), Batch(tokens=[-1]), Batch(tokens=[1, 2]),
    Batch(tokens=np.array([3])), Batch(tokens=[3], pos=[1]), Batch(tokens=[3], logits=[False]),
    Batch(tokens=[3], seq_ids=[[0, 1]]), Batch(tokens=[3], seq_ids=[4]),
    Batch(tokens=[3], seq_ids=[True]), Batch(embd=np.zeros((1, 64), np.float32)),
    Batch(tokens=[3, 4], seq_ids=[1, 1]),                       # one sequence twice: a prompt chunk
    Batch(tokens=[3, 4], seq_ids=[0, 1], logits=[True, False]),  # mixed flags
    Batch(tokens=[3, 4], seq_ids=[0, 1], pos=[0, True]),         # a bool position
    Batch(tokens=[3, 4], seq_ids=[0, 1], pos=[0, 1]),            # not sequence 1's next position
    Batch(tokens=[3, 4, 5], seq_ids=[0, 1, 2]),                  # more than n_max tokens
])
def test_generation_ubatch_leaves_other_batches_to_the_allocator(batch):
    assert generation_ubatch(batch, 320, 4, KVCells(16, 4), n_max=2) is None


def test_invalid_one_token_batches_still_return_minus_one(tiny_model):
    ctx = llama.Context(tiny_model, n_ctx=256, backend="ref")
    for bad in (Batch(tokens=[320]), Batch(tokens=[True]), Batch.from_tokens([3], seq_id=1)):
        assert ctx.decode(bad) == -1
    assert ctx.memory.seq_pos_max(0) == -1


# -- decode --------------------------------------------------------------------------------

def decode_steps(model, backend: str, general: bool, n: int = 40,
                 prompt: tuple[int, ...] = (5, 17, 200)) -> tuple[list[np.ndarray], llama.Context]:
    """A prompt then n one-token steps; `general` sends each step as an int64 array, which
    the fast path leaves to the allocator."""
    ctx = llama.Context(model, n_ctx=256, n_batch=64, n_ubatch=64, backend=backend)
    assert ctx.decode(Batch.from_tokens(list(prompt))) == 0
    rows = [ctx.get_logits_ith(-1).copy()]
    for i in range(n):
        tok = (7 * i + 3) % model.n_vocab
        batch = Batch(tokens=np.array([tok])) if general else Batch.from_tokens([tok])
        assert ctx.decode(batch) == 0
        assert ctx.get_logits().shape == (1, model.n_vocab)
        rows.append(ctx.get_logits_ith(0).copy())
    return rows, ctx


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_fast_path_decode_equals_general_path(tiny_model, backend):
    """Same logits at every step and the same cells and K/V rows after 40 steps (past n_kv
    padding boundaries, so the mask grows and the CPU graph rebinds its inputs)."""
    fast, a = decode_steps(tiny_model, backend, general=False)
    slow, b = decode_steps(tiny_model, backend, general=True)
    for i, (x, y) in enumerate(zip(fast, slow)):
        np.testing.assert_array_equal(x, y, err_msg=f"step {i}")
    ca, cb = a.memory.cells, b.memory.cells
    assert ca.pos.tolist() == cb.pos.tolist() and ca.seq.tolist() == cb.seq.tolist()
    assert (ca.head, ca.used, ca.used_max_p1(), ca.seq_pos_max(0)) == (cb.head, cb.used, cb.used_max_p1(), 42)
    for name, arr in a.memory.bindings().items():
        np.testing.assert_array_equal(arr, b.memory.bindings()[name], err_msg=name)


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_batched_steps_fast_path_equal_general_path(tiny_model, backend):
    """Steps of one token for each of 3 sequences (a server's step): the fast path's logits
    and cache equal those of the same steps through the allocator, bit for bit."""
    results = []
    for general in (False, True):
        ctx = llama.Context(tiny_model, n_ctx=256, n_batch=64, n_ubatch=64, n_seq_max=3, backend=backend)
        prompt = [5, 17, 200, 9]
        assert ctx.decode(Batch(tokens=prompt * 3, seq_ids=[[s] for s in range(3) for _ in prompt])) == 0
        rows = []
        for i in range(20):
            toks = [(7 * i + 3 * s + 1) % tiny_model.n_vocab for s in range(3)]
            batch = Batch(tokens=np.array(toks) if general else toks, seq_ids=[[0], [1], [2]],
                          logits=[True] * 3)
            assert ctx.decode(batch) == 0
            rows.append(ctx.get_logits().copy())
        results.append((rows, ctx))
    (fast, a), (slow, b) = results
    for i, (x, y) in enumerate(zip(fast, slow)):
        assert x.shape == (3, tiny_model.n_vocab)
        np.testing.assert_array_equal(x, y, err_msg=f"step {i}")
    assert a.memory.cells.pos.tolist() == b.memory.cells.pos.tolist()
    for name, arr in a.memory.bindings().items():
        np.testing.assert_array_equal(arr, b.memory.bindings()[name], err_msg=name)


def test_cpu_one_token_steps_match_the_reference_backend(tiny_model):
    """The CPU graph keeps its pointers between steps while the inputs stay put; when n_kv
    or an input buffer changes it must notice, else its logits drift from the reference.
    From a one-token prompt the mask outgrows its buffer at 33 and 65 cells."""
    cpu, ctx = decode_steps(tiny_model, "cpu", general=False, n=100, prompt=(5,))
    ref, _ = decode_steps(tiny_model, "ref", general=False, n=100, prompt=(5,))
    assert ctx.memory.cells.get_n_kv() == 128
    for i, (x, y) in enumerate(zip(cpu, ref)):
        np.testing.assert_allclose(x, y, atol=2e-3, rtol=0, err_msg=f"step {i}")


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_one_token_without_output_takes_the_general_graph(tiny_model, backend):
    """The one-token graph selects no output rows (its token is always an output), so a
    one-token batch that wants no logits runs the general graph: a prompt fed token by token,
    logits only for the last, leaves the cache and the logits of the prompt in one batch."""
    prompt = [5, 17, 200, 42, 9]
    whole = llama.Context(tiny_model, n_ctx=256, n_batch=64, n_ubatch=64, backend=backend)
    assert whole.decode(Batch.from_tokens(prompt)) == 0
    steps = llama.Context(tiny_model, n_ctx=256, n_batch=64, n_ubatch=64, backend=backend)
    built = []
    real = steps.build_graph
    steps.build_graph = lambda params: built.append(params.tokens_class) or real(params)
    for i, tok in enumerate(prompt):
        last = i == len(prompt) - 1
        assert steps.decode(Batch(tokens=[tok], logits=[last])) == 0
        assert steps.get_logits().shape == ((1 if last else 0), tiny_model.n_vocab)
    assert built == []  # both graphs were reserved with the context
    np.testing.assert_allclose(steps.get_logits_ith(-1), whole.get_logits_ith(-1), atol=1e-4, rtol=0)
    for name, arr in whole.memory.bindings().items():
        np.testing.assert_allclose(np.asarray(steps.memory.bindings()[name], np.float32),
                                   np.asarray(arr, np.float32), atol=2e-3, rtol=0, err_msg=name)
    classes = {c.graph.hints["tokens"]: c.graph for c in steps.graph_cache.entries.values()}
    assert "inp_out_ids" in {t.name for t in classes["multi"].leafs}
    assert "inp_out_ids" not in {t.name for t in classes["single"].leafs}


def test_failed_one_token_step_leaves_no_trace(tiny_model, monkeypatch):
    ctx = llama.Context(tiny_model, n_ctx=256, backend="ref")
    assert ctx.decode(Batch.from_tokens([1, 2, 3])) == 0
    cells = ctx.memory.cells
    before = (cells.pos.tolist(), cells.seq.tolist(), cells.head, cells.used, cells.seq_pos_max(0))

    def failing(ub, slot):
        raise RuntimeError("simulated compute failure")

    monkeypatch.setattr(ctx, "_process_ubatch", failing)
    assert ctx.decode(Batch.from_tokens([4])) < -1
    assert (cells.pos.tolist(), cells.seq.tolist(), cells.head, cells.used, cells.seq_pos_max(0)) == before
    np.testing.assert_array_equal(ctx.get_logits(), np.zeros((1, tiny_model.n_vocab), np.float32))
    monkeypatch.undo()
    assert ctx.decode(Batch.from_tokens([4])) == 0 and ctx.memory.seq_pos_max(0) == 3


def test_switching_prompt_and_decode_builds_no_graph(tiny_model):
    ctx = llama.Context(tiny_model, n_ctx=256, backend="ref")
    built = []
    real = ctx.build_graph
    ctx.build_graph = lambda params: built.append(params) or real(params)
    for ids in ([1, 2, 3], [4], [5], [6, 7], [8], [9]):
        assert ctx.decode(Batch.from_tokens(ids)) == 0
    assert built == []
    assert ctx.n_reused == 2  # [5] after [4], [9] after [8]: llama.cpp's reuse of the previous graph


# -- KV cells ------------------------------------------------------------------------------

def scalar_mask(kv: KVCells, u: UBatch, n_kv: int, causal: bool, swa_type: SWAType, n_swa: int) -> np.ndarray:
    out = np.full((u.n_tokens, n_kv), NEG, np.float32)
    for i in range(u.n_tokens):
        s, p1 = u.seq_ids[i][0], int(u.pos[i])
        for j in range(n_kv):
            p0 = int(kv.pos[j])
            if p0 < 0 or not kv.seq[j, s] or (causal and p0 > p1):
                continue
            if ((swa_type == SWAType.STANDARD and p1 - p0 >= n_swa)
                    or (swa_type == SWAType.CHUNKED and p0 < (p1 // n_swa) * n_swa)
                    or (swa_type == SWAType.SYMMETRIC and abs(p1 - p0) > n_swa // 2)):
                continue
            out[i, j] = 0.0
    return out


@pytest.mark.parametrize("swa_type", list(SWAType))
@pytest.mark.parametrize("causal", [True, False])
def test_one_token_masks_match_scalar_loop(swa_type, causal):
    kv = KVCells(40, 3, n_pad=16)
    for s in range(3):
        place(kv, list(range(9)), [s] * 9)
    kv.seq_rm(1, 2, 4)
    kv.seq_cp(0, 2, 0, 3)
    n_swa = 0 if swa_type == SWAType.NONE else 4
    n_kv = kv.get_n_kv()
    out = np.empty((1, n_kv), np.float32)
    for s in range(3):
        for p in (0, 3, 8, 9, 12):  # inside the sequence, at its end, after it
            u = ub([p], [s])
            want = scalar_mask(kv, u, n_kv, causal, swa_type, n_swa)
            got = kv.kq_mask(u, n_kv, causal=causal, swa_type=swa_type, n_swa=n_swa, out=out)
            assert got is out
            np.testing.assert_array_equal(got, want, err_msg=f"seq {s} pos {p}")
    with pytest.raises(ValueError, match="out must be"):
        kv.kq_mask(ub([1], [0]), n_kv, out=np.empty((1, n_kv + 1), np.float32))


def first_usable_from_head(kv: KVCells) -> int | None:
    """find_slot for one token, brute force, on a cache without a window."""
    used = int(np.count_nonzero(kv.pos >= 0))
    head = 0 if kv.head > used + 2 else kv.head
    order = list(range(head, kv.size)) + list(range(head))
    return next((i for i in order if kv.pos[i] < 0), None)


@pytest.mark.parametrize("seed", range(4))
def test_used_cells_and_slots_follow_random_operations(seed):
    rng = random.Random(seed)
    kv = KVCells(24, 3)
    next_pos = [0, 0, 0]
    for _ in range(120):
        op = rng.choice(["put", "put", "put", "rm", "rm_all", "cp", "keep", "add", "div", "undo", "restore"])
        s = rng.randrange(3)
        p0, p1 = rng.randrange(-1, 12), rng.randrange(-1, 16)
        if op == "put":
            want = first_usable_from_head(kv)
            slot = kv.find_slot(ub([next_pos[s]], [s]))
            assert (None if slot is None else slot.idxs.tolist()) == (None if want is None else [want])
            if slot is not None:
                kv.apply_ubatch(slot, ub([next_pos[s]], [s]))
                next_pos[s] += 1
        elif op == "rm":
            kv.seq_rm(s, p0, p1)
        elif op == "rm_all":
            kv.seq_rm(-1, p0, p1)
        elif op == "cp":
            kv.seq_cp(s, rng.randrange(3), p0, p1)
        elif op == "keep":
            kv.seq_keep(s)
        elif op == "add":
            kv.seq_add(s, p0, p1, rng.randrange(-4, 5))
        elif op == "div":
            kv.seq_div(s, p0, p1, rng.randrange(1, 4))
        else:  # apply a ubatch, then undo it from a checkpoint or a snapshot
            u = ub([next_pos[s], next_pos[s] + 1], [s, s])
            slot = kv.find_slot(u)
            if slot is None:
                continue
            before = (kv.pos.tolist(), kv.seq.tolist(), kv.shift.tolist(), kv.head,
                      [(kv.seq_pos_min(t), kv.seq_pos_max(t)) for t in range(3)])
            state = kv.checkpoint(slot) if op == "undo" else kv.snapshot()
            assert isinstance(state, KVCellsUndo) == (op == "undo")  # no window: cells were empty
            kv.apply_ubatch(slot, u)
            kv.restore(state)
            assert (kv.pos.tolist(), kv.seq.tolist(), kv.shift.tolist(), kv.head,
                    [(kv.seq_pos_min(t), kv.seq_pos_max(t)) for t in range(3)]) == before
        nz = np.flatnonzero(kv.pos >= 0)
        assert kv.used == len(nz)
        assert kv.used_max_p1() == (int(nz[-1]) + 1 if len(nz) else 0)


def test_checkpoint_of_an_overwritten_window_cell_is_a_snapshot():
    kv = KVCells(8, 1, swa_type=SWAType.STANDARD, n_swa=2)
    place(kv, list(range(8)), [0] * 8)     # full: the next token reuses a cell out of the window
    u = ub([8], [0])
    slot = kv.find_slot(u)
    assert slot is not None and kv.pos[slot.idxs[0]] >= 0
    before = (kv.pos.tolist(), kv.seq.tolist(), kv.head, kv.used, kv.seq_pos_min(0))
    state = kv.checkpoint(slot)
    assert not isinstance(state, KVCellsUndo)
    kv.apply_ubatch(slot, u)
    assert kv.seq_pos_min(0) > before[4]
    kv.restore(state)
    assert (kv.pos.tolist(), kv.seq.tolist(), kv.head, kv.used, kv.seq_pos_min(0)) == before


def test_input_buffers_keep_arrays_until_the_shape_changes():
    bufs = InputBuffers()
    a = bufs.take("m", np.float32, (1, 32))
    assert bufs.take("m", np.float32, (1, 32)) is a
    b = bufs.take("m", np.float32, (2, 16))            # same memory, another shape
    assert b is not a and b.ctypes.data == a.ctypes.data
    c = bufs.take("m", np.float32, (1, 64))            # grows: new memory
    assert c.shape == (1, 64) and c.ctypes.data != a.ctypes.data
    assert bufs.take("m", np.int32, (1, 8)).dtype == np.int32
