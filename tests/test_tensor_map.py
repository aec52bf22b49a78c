"""lockstep_kernels/cuda/tensor_map.py without a GPU: which arrays it refuses, and that a map is encoded once
per (address, shape, box) however many launches use it. The driver's encoder is a stand-in that
counts its calls (libcuda is absent on CPU machines)."""

from types import SimpleNamespace

import numpy as np
import pytest

from lockstep_kernels.cuda import tensor_map


def _array(shape, dtype=np.uint16, ptr=1 << 20, contiguous=True):
    return SimpleNamespace(shape=shape, dtype=np.dtype(dtype), flags=SimpleNamespace(c_contiguous=contiguous),
                           data=SimpleNamespace(ptr=ptr))


@pytest.fixture
def encoder(monkeypatch):
    calls = []

    def encode(m, dtype, rank, ptr, dims, strides, box, elem, interleave, swizzle, l2, oob):
        calls.append((ptr.value, tuple(dims), strides[0], tuple(box), swizzle))
        return 0

    tensor_map._encoded.cache_clear()
    monkeypatch.setattr(tensor_map, "_encode", lambda: encode)
    yield calls
    tensor_map._encoded.cache_clear()


@pytest.mark.parametrize("bad", [_array((128, 64), np.float32), _array((128, 64), ptr=(1 << 20) + 8),
                                 _array((128, 4)), _array((128, 64), contiguous=False)],
                         ids=["32-bit", "misaligned", "rows of 8 bytes", "strided"])
def test_arrays_a_map_cannot_describe_are_refused(bad, encoder):
    with pytest.raises(ValueError, match="tensor map"):
        tensor_map.tiled_2d(bad, (64, 128), tensor_map.SWIZZLE_128B)
    assert encoder == []


def test_a_map_is_encoded_once_per_address_shape_and_box(encoder):
    w = _array((4096, 4096))
    first = tensor_map.tiled_2d(w, (32, 128), tensor_map.SWIZZLE_NONE)
    assert all(tensor_map.tiled_2d(w, (32, 128), tensor_map.SWIZZLE_NONE) is first for _ in range(5))
    assert encoder == [(1 << 20, (4096, 4096), 8192, (32, 128), tensor_map.SWIZZLE_NONE)]
    tensor_map.tiled_2d(w, (64, 128), tensor_map.SWIZZLE_128B)
    tensor_map.tiled_2d(_array((512, 4096)), (32, 128), tensor_map.SWIZZLE_NONE)
    assert len(encoder) == 3


def test_a_driver_error_is_named(monkeypatch, encoder):
    monkeypatch.setattr(tensor_map, "_encode", lambda: lambda *a: 1)
    with pytest.raises(RuntimeError, match="cuTensorMapEncodeTiled failed with CUDA error 1"):
        tensor_map.tiled_2d(_array((64, 64)), (32, 64), tensor_map.SWIZZLE_NONE)
