"""Property test: mutated GGUF files either parse or raise GGUFError, fast and in little memory.

Valid small files (made with our writer) are mutated the ways hostile or damaged files differ
from good ones: bytes flipped, length and count fields inflated to huge values, type fields
changed, truncations, random u64 writes at random offsets, and splices of one file into
another. Hypothesis runs 2,000 deterministic cases with tracemalloc watching the peak of
every case; a second test replays a deterministic subset in a subprocess whose address space
is capped at 1 GiB, so an attempt to allocate gigabytes fails loudly instead of swapping.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from ggmlpy.gguf import GGMLType, GGUFError, GGUFFile, GGUFValueType as T, StringArray
from ggmlpy.gguf.writer import GGUFWriter

PEAK_LIMIT = 64 << 20  # bytes a single case may allocate (tracemalloc peak)
ADDRESS_SPACE_LIMIT = 1 << 30  # RLIMIT_AS of the subprocess


def _seed_files() -> list[bytes]:
    rng = np.random.default_rng(7)
    model = GGUFWriter("llama")
    model.add_uint32("llama.block_count", 2)
    model.add_float32("llama.rope.freq_base", 10000.0)
    model.add_bool("tokenizer.ggml.add_bos_token", True)
    model.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "a", "b", "ab", "\u2581x", "🦙"])
    model.add_array("tokenizer.ggml.scores", np.linspace(-1, 0, 7, dtype=np.float32))
    model.add_array("tokenizer.ggml.token_type", np.array([3, 3, 1, 1, 1, 1, 1], dtype=np.int32))
    model.add_array("flags", np.array([True, False]))
    model.add_array("nested", [np.array([1, 2], dtype=np.int16), ["x", "yz"]], T.ARRAY)
    model.add_tensor("token_embd.weight", rng.integers(0, 256, (2, 34), dtype=np.uint8), type=GGMLType.Q8_0)
    model.add_tensor("norm.weight", rng.standard_normal(8).astype(np.float32))
    model.add_tensor("out.weight", rng.standard_normal((2, 4)).astype(np.float16))

    aligned = GGUFWriter("gemma3", alignment=64)
    aligned.add_string("general.name", "Ünïcode ✓")
    aligned.add_key_value("big", 2**64 - 1, T.UINT64)
    aligned.add_key_value("neg", -5, T.INT64)
    aligned.add_key_value("pi", 3.14159, T.FLOAT64)
    aligned.add_tensor("q4k", rng.integers(0, 256, (1, 144), dtype=np.uint8), type=GGMLType.Q4_K)
    aligned.add_tensor("bf16", rng.integers(0, 1 << 16, (2, 2, 2, 2), dtype=np.uint16), type=GGMLType.BF16)

    tiny = GGUFWriter()
    tiny.add_tensor("w", np.arange(8, dtype=np.float32))

    vocab = GGUFWriter("llama")
    vocab.add_array("tokenizer.ggml.tokens", [f"tok{i}" * (i % 5) for i in range(60)])
    vocab.add_array("tokenizer.ggml.merges", [f"a{i} b{i}" for i in range(40)])
    vocab.add_array("empty", [], T.STRING)

    seeds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, w in enumerate([model, aligned, tiny, vocab]):
            seeds.append(w.write(Path(tmp) / f"{i}.gguf").read_bytes())
    return seeds


_SIZES = {T.UINT8: 1, T.INT8: 1, T.UINT16: 2, T.INT16: 2, T.UINT32: 4, T.INT32: 4, T.FLOAT32: 4,
          T.BOOL: 1, T.UINT64: 8, T.INT64: 8, T.FLOAT64: 8}


class _Walker:
    """An independent walk of a valid file that records where its numeric fields are."""

    def __init__(self, raw: bytes):
        self.raw = raw
        self.u64s: list[int] = [8, 16]  # tensor and metadata counts
        self.u32s: list[int] = [4]  # version
        self.pos = 24
        n_tensors, n_kv = struct.unpack_from("<QQ", raw, 8)
        for _ in range(n_kv):
            self.string()
            self.value(self.u32())
        for _ in range(n_tensors):
            self.string()
            for _ in range(self.u32()):  # n_dims, then the dimensions
                self.u64()
            self.u32()  # the tensor type
            self.u64()  # the data offset
        assert -(-self.pos // 32) * 32 <= len(raw)  # walked exactly the header

    def u32(self) -> int:
        self.u32s.append(self.pos)
        self.pos += 4
        return struct.unpack_from("<I", self.raw, self.pos - 4)[0]

    def u64(self) -> int:
        self.u64s.append(self.pos)
        self.pos += 8
        return struct.unpack_from("<Q", self.raw, self.pos - 8)[0]

    def string(self) -> None:
        length = self.u64()
        self.pos += length

    def value(self, vtype: int) -> None:
        if vtype == T.STRING:
            self.string()
        elif vtype == T.ARRAY:
            etype, count = self.u32(), self.u64()
            if etype in (T.STRING, T.ARRAY):
                for _ in range(count):
                    self.value(etype)
            else:
                self.pos += count * _SIZES[etype]
        else:
            self.pos += _SIZES[vtype]


SEEDS = _seed_files()
FIELDS = [(w.u64s, w.u32s) for w in map(_Walker, SEEDS)]
_TMP = tempfile.TemporaryDirectory()  # one scratch file, rewritten by every case
HUGE = [2**64 - 1, 2**63, 2**63 - 1, 2**62, 2**32, 2**32 - 1, 2**31, 1 << 20, 0, 1]


def mutate(seed: int, mutations: list[tuple]) -> bytes:
    """Apply mutations (as drawn by the strategies below) to seed file `seed`."""
    raw = bytearray(SEEDS[seed])
    u64s, u32s = FIELDS[seed]
    for kind, a, b, c in mutations:
        n = len(raw)
        if kind == "flip" and n:
            raw[a % n] ^= b % 255 + 1
        elif kind == "length":  # a length or count field inflated (or zeroed)
            at = u64s[a % len(u64s)]
            raw[at:at + 8] = struct.pack("<Q", b % (1 << 64))
        elif kind == "type":  # a type, version or n_dims field replaced
            at = u32s[a % len(u32s)]
            raw[at:at + 4] = struct.pack("<I", b % (1 << 32))
        elif kind == "truncate":
            del raw[a % (n + 1):]
        elif kind == "u64" and n:
            at = a % n
            raw[at:at + 8] = struct.pack("<Q", b % (1 << 64))
        elif kind == "splice":
            donor = SEEDS[c % len(SEEDS)]
            start = a % len(donor)
            piece = donor[start:start + 1 + b % 64]
            at = (a * 31 + b) % (n + 1)
            if c % 2:
                raw[at:at] = piece  # insert
            else:
                raw[at:at + len(piece)] = piece  # overwrite
    return bytes(raw)


def touch(value) -> None:
    """Read a metadata value the way a consumer would, lazy parts included."""
    if isinstance(value, StringArray):
        strings = value.tolist()
        assert len(strings) == len(value) == len(value.lengths())
        if len(value):
            assert value[len(value) - 1] == strings[-1]
    elif isinstance(value, np.ndarray):
        value.tobytes()
    elif isinstance(value, list):
        for v in value:
            touch(v)


def parse_or_reject(path: Path) -> str:
    """'parsed' or 'rejected'; any exception other than GGUFError propagates."""
    try:
        f = GGUFFile(path)
    except GGUFError as e:
        assert e.reason and e.path == str(path)
        return "rejected"
    with f:
        for value in f.metadata.values():
            touch(value)
        for t in f.tensors.values():
            assert t.data.nbytes == t.nbytes and t.offset + t.nbytes <= f.file_size
            t.data.tobytes()
    return "parsed"


_word = st.integers(0, 2**64 - 1)
mutation = st.one_of(
    st.tuples(st.just("flip"), _word, st.integers(0, 254), st.just(0)),
    st.tuples(st.just("length"), _word, st.one_of(st.sampled_from(HUGE), _word), st.just(0)),
    st.tuples(st.just("type"), _word, st.one_of(st.integers(0, 40), st.sampled_from([2**32 - 1, 2**31])),
              st.just(0)),
    st.tuples(st.just("truncate"), _word, st.just(0), st.just(0)),
    st.tuples(st.just("u64"), _word, st.one_of(st.sampled_from(HUGE), _word), st.just(0)),
    st.tuples(st.just("splice"), _word, st.integers(0, 255), st.integers(0, 7)),
)


@settings(max_examples=2000, deadline=1000, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, len(SEEDS) - 1), mutations=st.lists(mutation, min_size=1, max_size=3))
def test_mutated_files_parse_or_raise_gguf_error(seed, mutations):
    raw = mutate(seed, mutations)
    path = Path(_TMP.name) / "case.gguf"
    path.write_bytes(raw)
    tracemalloc.start()
    try:
        parse_or_reject(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < PEAK_LIMIT, f"{peak} bytes allocated for a {len(raw)}-byte file"


def test_seeds_parse_and_mutations_are_rejected():
    """The seeds are valid and the mutators damage them: the property above sees both
    outcomes, so it tests the reader rather than a corpus that is all good or all broken."""
    path = Path(_TMP.name) / "seed.gguf"
    for i, raw in enumerate(SEEDS):
        path.write_bytes(raw)
        assert parse_or_reject(path) == "parsed", i
        path.write_bytes(mutate(i, [("length", 0, 2**64 - 1, 0)]))  # tensor count inflated
        assert parse_or_reject(path) == "rejected", i


_SUBPROCESS = r"""
import json, random, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (__LIMIT__, __LIMIT__))
sys.path.insert(0, __TESTS__)
import test_gguf_fuzz as fz
from pathlib import Path
rng = random.Random(2024)
kinds = ["flip", "length", "type", "truncate", "u64", "splice"]
counts = {"parsed": 0, "rejected": 0}
slowest = 0.0
path = Path(__TMP__) / "case.gguf"
for i in range(__CASES__):
    seed = rng.randrange(len(fz.SEEDS))
    muts = [(rng.choice(kinds), rng.getrandbits(64), rng.choice(fz.HUGE + [rng.getrandbits(64)]),
             rng.randrange(8)) for _ in range(rng.randint(1, 3))]
    path.write_bytes(fz.mutate(seed, muts))
    start = time.perf_counter()
    counts[fz.parse_or_reject(path)] += 1
    slowest = max(slowest, time.perf_counter() - start)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork+exec, so a child of a large
# pytest process would report its parent's peak
peak_rss = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"counts": counts, "slowest_s": slowest, "peak_rss": peak_rss}))
"""


def test_hostile_files_under_an_address_space_limit(tmp_path):
    """A deterministic subset replayed with RLIMIT_AS = 1 GiB: a MemoryError or any other
    escape fails the subprocess, and peak RSS stays far below the limit."""
    code = (_SUBPROCESS.replace("__LIMIT__", str(ADDRESS_SPACE_LIMIT))
            .replace("__TESTS__", repr(str(Path(__file__).parent)))
            .replace("__TMP__", repr(str(tmp_path))).replace("__CASES__", "400"))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert sum(result["counts"].values()) == 400
    assert result["counts"]["rejected"] > 100 and result["counts"]["parsed"] > 0
    assert result["slowest_s"] < 1.0
    assert result["peak_rss"] < 256 << 20
