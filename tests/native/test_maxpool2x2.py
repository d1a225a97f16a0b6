"""The 2x2 / stride-2 MaxPool fast path of the native pool (row pairs in blocks) against numpy."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native


def _reference(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    v = x.reshape(n, c, h // 2, 2, w // 2, 2)
    m = np.fmax.reduce(np.fmax.reduce(v, axis=5), axis=3)  # fmax ignores NaN...
    nan = np.isnan(v).any(axis=(3, 5))
    return np.where(nan, np.float32(np.nan), m)  # ...and NaN sticks, as in onnxruntime / numpy.maximum


# plane sizes around the block line (4096 floats) and the vector widths, tiny and wide rows
@pytest.mark.parametrize("shape", [(1, 1, 2, 2), (2, 3, 4, 6), (360, 32, 8, 8), (1, 16, 112, 112), (1, 2, 6, 4098),
                                   (1, 1, 2, 8194), (3, 5, 10, 34)])
def test_maxpool_2x2_stride_2(shape, every_isa, threads):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[rng.integers(0, x.size, size=3)] = np.nan
    y = np.full(shape[:2] + (shape[2] // 2, shape[3] // 2), -7.0, np.float32)
    native.maxpool2d(x, y, (2, 2), (2, 2), (1, 1), (0, 0))
    np.testing.assert_array_equal(y, _reference(x))


def test_odd_planes_and_padding_take_the_general_path(every_isa):
    from minirt.kernels import nn
    from tests.native.conftest import numpy_path

    x = np.random.default_rng(1).standard_normal((2, 3, 7, 9)).astype(np.float32)  # odd: floor output
    for attrs in ({}, {"pads": (1, 1, 1, 1)}, {"ceil_mode": 1}):
        got = nn.max_pool_10(x, kernel_shape=(2, 2), strides=(2, 2), **attrs)
        with numpy_path():
            want = nn.max_pool_10(x, kernel_shape=(2, 2), strides=(2, 2), **attrs)
        np.testing.assert_array_equal(got, want)
