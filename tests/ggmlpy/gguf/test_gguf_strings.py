"""StringArray.tolist, which decodes a whole string array at once (length fields overwritten
with NULs, one decode, one split), against each string decoded alone (`raw(i)`): any bytes,
invalid UTF-8 at the strings' edges, empty strings, NULs inside strings (the careful path),
strings longer than 65,535 bytes (their length fields' high bytes are not zero)."""
from __future__ import annotations

import struct

import numpy as np
from hypothesis import given, settings, strategies as st

from ggmlpy.gguf.strings import StringArray


def _array(strings: list[bytes], lead: bytes = b"\x07" * 5) -> StringArray:
    """The strings as a GGUF string array placed `lead` bytes into a buffer, with a tail."""
    body = b"".join(struct.pack("<Q", len(s)) + s for s in strings)
    buf = np.frombuffer(lead + body + b"\x01\x02", np.uint8)
    return StringArray(buf, len(lead), len(strings), len(lead) + len(body))


def _one_by_one(arr: StringArray) -> list[str]:
    return [arr.raw(i).decode("utf-8", "surrogateescape") for i in range(len(arr))]


TRICKY = [b"", b"hello", "\u0120the".encode(), "日本".encode(), b"\xe6\x97", b"\xa5end",
          b"\xff\xfe", b"\xc3", b"\xa9", "\U0001F600".encode()[:3], b"<0x00>"]


def test_tricky_strings_decode_as_one_by_one():
    arr = _array(TRICKY)
    assert arr.tolist() == _one_by_one(arr)
    assert arr.tolist()[4] == "\udce6\udc97"   # an incomplete sequence stays escaped, not joined
    assert _array([]).tolist() == []


def test_nuls_inside_strings_take_the_careful_path():
    strings = [b"a\x00", b"\x00" * 9, b"", b"b\x00\x00c"]
    arr = _array(strings)
    assert arr.tolist() == _one_by_one(arr) == [s.decode() for s in strings]


def test_long_strings():
    strings = [b"x" * 70_000, "é".encode() * 40_000, b"", b"tail"]
    arr = _array(strings)
    assert arr.tolist() == _one_by_one(arr)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=12), st.sampled_from(TRICKY),
                          st.text(max_size=6).map(lambda t: t.encode())), max_size=40))
def test_any_bytes_decode_as_one_by_one(strings):
    arr = _array(strings)
    assert arr.tolist() == _one_by_one(arr)
