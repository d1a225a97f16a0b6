"""Random-sampling kernels: shapes, dtypes, seeding and distribution statistics
(random streams cannot be compared with another runtime's)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_elementwise import run_kernel


def test_random_uniform_and_normal():
    (u,) = run_kernel("RandomUniform", [], {"shape": [200, 50], "low": -2.0, "high": 3.0, "seed": 1.0}, opset=22)
    assert u.shape == (200, 50) and u.dtype == np.float32
    assert u.min() >= -2 and u.max() < 3 and abs(u.mean() - 0.5) < 0.05
    (n,) = run_kernel("RandomNormal", [], {"shape": [20000], "mean": 1.0, "scale": 2.0, "dtype": 11}, opset=22)
    assert n.dtype == np.float64 and abs(n.mean() - 1) < 0.05 and abs(n.std() - 2) < 0.05


def test_seed_repeats_and_like_ops():
    x = np.zeros((3, 4), np.float16)
    a = run_kernel("RandomUniformLike", [x], {"seed": 3.0}, opset=22)[0]
    b = run_kernel("RandomUniformLike", [x], {"seed": 3.0}, opset=22)[0]
    assert a.dtype == np.float16 and a.shape == (3, 4)
    np.testing.assert_array_equal(a, b)
    (c,) = run_kernel("RandomNormalLike", [x], {"dtype": 1}, opset=22)
    assert c.dtype == np.float32 and c.shape == (3, 4)


@pytest.mark.parametrize("dtype", [None, 9, 6])
def test_bernoulli(dtype):
    p = np.tile(np.array([0.0, 0.25, 0.9, 1.0]), (5000, 1))
    attrs = {"seed": 7.0} if dtype is None else {"seed": 7.0, "dtype": dtype}
    (y,) = run_kernel("Bernoulli", [p], attrs, opset=22)
    assert y.dtype == (p.dtype if dtype is None else {9: np.bool_, 6: np.int32}[dtype])
    np.testing.assert_allclose(y.astype(float).mean(axis=0), [0, 0.25, 0.9, 1], atol=0.03)


def test_multinomial():
    logits = np.log(np.array([[0.1, 0.6, 0.3], [0.5, 0.0001, 0.4999]], np.float32))
    (y,) = run_kernel("Multinomial", [logits], {"sample_size": 20000, "seed": 2.0, "dtype": 7}, opset=22)
    assert y.shape == (2, 20000) and y.dtype == np.int64
    freq = np.stack([(y == k).mean(axis=1) for k in range(3)], axis=1)
    np.testing.assert_allclose(freq, [[0.1, 0.6, 0.3], [0.5, 0.0, 0.5]], atol=0.02)
