"""The disk cache every backend stores compiled code in: one keying (sha256 of the sorted
parts), one entry format (payload + json record) and one rule for bad entries (reported,
removed, rebuilt)."""
from __future__ import annotations

import json

import pytest

from ggmlpy.disk_cache import DiskCache, cache_dir, cache_key

PARTS = {"source": "0" * 64, "arch": "sm_90", "tool": "13.0"}


def test_key_is_the_hash_of_the_sorted_parts():
    assert cache_key(PARTS) == cache_key(dict(reversed(list(PARTS.items()))))
    assert len({cache_key(PARTS)} | {cache_key({**PARTS, k: "other"}) for k in PARTS}) == 1 + len(PARTS)


def test_folder_is_per_backend_under_ggmlpy_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GGMLPY_CACHE", str(tmp_path))
    assert cache_dir("cpu") == tmp_path / "cpu"
    assert DiskCache("cuda").dir == tmp_path / "cuda"
    monkeypatch.delenv("GGMLPY_CACHE")
    assert cache_dir("cpu").parts[-3:] == (".cache", "ggmlpy", "cpu")


def test_round_trip_and_record(tmp_path):
    cache = DiskCache("cpu", tmp_path)
    assert cache.get(PARTS, ".o") is None and cache.misses == 1
    cache.put(PARTS, b"code", ".o")
    assert cache.get(PARTS, ".o") == b"code" and cache.hits == 1
    payload, record = cache.paths(PARTS, ".o")
    assert payload.name == cache_key(PARTS) + ".o"
    meta = json.loads(record.read_text())
    assert meta["parts"] == PARTS and meta["format"] == 1 and len(meta["sha256"]) == 64
    assert [e for e, _ in cache.events] == ["miss", "store", "hit"]
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]  # temporaries renamed away


@pytest.mark.parametrize("damage, why", [
    (lambda payload, record: payload.write_bytes(b"other"), "corrupt"),
    (lambda payload, record: record.write_text("{not json"), "unreadable"),
    (lambda payload, record: record.write_text(json.dumps({**json.loads(record.read_text()), "format": 0})), "stale"),
    (lambda payload, record: record.write_text(
        json.dumps({**json.loads(record.read_text()), "parts": {**PARTS, "tool": "12.0"}})), "stale"),
])
def test_bad_entries_are_reported_removed_and_rebuilt(tmp_path, damage, why):
    cache = DiskCache("cuda", tmp_path)
    cache.put(PARTS, b"payload")
    payload, record = cache.paths(PARTS)
    damage(payload, record)
    assert cache.get(PARTS) is None
    event, detail = cache.events[-1]
    assert event == "discard" and why in detail and cache.discards == 1 and cache.misses == 1
    assert not payload.exists() and not record.exists()
    cache.put(PARTS, b"payload")
    assert cache.get(PARTS) == b"payload"


def test_a_payload_without_its_record_is_a_miss(tmp_path):
    cache = DiskCache("cpu", tmp_path)
    cache.put(PARTS, b"payload")
    cache.paths(PARTS)[1].unlink()
    assert cache.get(PARTS) is None and cache.discards == 0 and cache.misses == 1


def test_an_unwritable_cache_costs_only_a_rebuild(tmp_path):
    (tmp_path / "cpu").write_text("a file where the folder should be")
    cache = DiskCache("cpu", tmp_path / "cpu")
    cache.put(PARTS, b"payload")  # logged, not raised
    cache.remember("plan", "value")
    assert cache.get(PARTS) is None and cache.recall("plan") is None


def test_index_maps_a_cheap_key_to_a_value(tmp_path):
    cache = DiskCache("cpu", tmp_path)
    assert cache.recall("plan") is None
    cache.remember("plan", "a" * 64)
    assert cache.recall("plan") == "a" * 64
    assert DiskCache("cpu", tmp_path).recall("plan") == "a" * 64  # another process's cache
