"""Every tensor of both real models decodes bit for bit as the gguf package decodes it.

The tensors are read with the gguf package's own reader, which keeps this test independent
of ggmlpy's reader.
"""
from __future__ import annotations

import struct
from collections import Counter

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize as gguf_dequantize

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import dequantize, dequantize_rows

EXPECTED_TYPES = {
    "smollm2": {GGMLType.F32, GGMLType.Q4_1, GGMLType.Q8_0},
    "gemma3": {GGMLType.F32, GGMLType.Q4_K, GGMLType.Q5_0, GGMLType.Q6_K, GGMLType.Q8_0},
}


_SCALAR_BYTES = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
                 GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4,
                 GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4, GGUFValueType.UINT64: 8,
                 GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}


class TensorReader(GGUFReader):
    """gguf's reader minus the decoding of metadata arrays, which takes it half a minute for
    gemma's 262k-token vocabulary; tensor infos and tensor data are still read by gguf."""

    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        return _array_size(memoryview(self.data), orig_offs), [], [], [GGUFValueType.ARRAY]


def _array_size(buf: memoryview, offs: int) -> int:
    start = offs
    item_type, count = struct.unpack_from("<IQ", buf, offs)
    offs += 12
    if item_type in _SCALAR_BYTES:
        return 12 + count * _SCALAR_BYTES[GGUFValueType(item_type)]
    for _ in range(count):
        if item_type == GGUFValueType.STRING:
            offs += 8 + struct.unpack_from("<Q", buf, offs)[0]
        else:
            offs += _array_size(buf, offs)
    return offs - start


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request):
    path = request.getfixturevalue(f"{request.param}_path")
    return request.param, TensorReader(path)


def test_every_tensor_matches_gguf(model):
    name, reader = model
    seen: Counter[GGMLType] = Counter()
    for tensor in reader.tensors:
        t = GGMLType(int(tensor.tensor_type))
        ne = [int(n) for n in tensor.shape]
        ours = dequantize(tensor.data, t, ne)
        ref = np.asarray(gguf_dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        assert ours.shape == ref.shape == tuple(reversed(ne)), tensor.name
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), tensor.name
        seen[t] += 1
    assert set(seen) == EXPECTED_TYPES[name]


def test_embedding_rows(model):
    _, reader = model
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    t, ne = GGMLType(int(embd.tensor_type)), [int(n) for n in embd.shape]
    rows = [0, 1, 2, ne[1] // 2, ne[1] - 1, 1]
    ref = np.asarray(gguf_dequantize(embd.data[rows], embd.tensor_type), dtype=np.float32)
    got = dequantize_rows(embd.data, t, ne, rows)
    assert got.shape == (len(rows), ne[0])
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
