"""Native LayerNormalization rows (rowops_impl.h) against numpy in float64, and the kernel's choice of path."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import nn
from minirt.kernels.registry import NodeContext


def _reference(x: np.ndarray, scale, bias, axis: int, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x64 - mean) / np.sqrt(var + eps) * scale
    return y if bias is None else y + bias


# row lengths around every vector width (4, 8, 16) and a transformer's hidden sizes; an offset of 100
# on every value: the centred variance must not lose it
@pytest.mark.parametrize("shape, axis", [((1, 1), -1), ((3, 5), -1), ((2, 7, 16), -1), ((4, 17), -1),
                                         ((1, 64, 128), -1), ((2, 3, 33), -1), ((2, 1000), -1),
                                         ((2, 4, 3, 5), 2), ((3, 2, 8), 1)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layernorm_rows_match_float64(shape, axis, with_bias, every_isa, threads):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 100).astype(np.float32)
    norm_shape = shape[axis % len(shape):]
    scale = rng.standard_normal(norm_shape).astype(np.float32)
    bias = rng.standard_normal(norm_shape).astype(np.float32) if with_bias else None
    y = nn.layer_norm(x, scale, bias, axis=axis, epsilon=1e-5)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, _reference(x, scale, bias, axis, 1e-5), rtol=2e-5, atol=2e-5)
    # the low-level entry in place
    z = x.copy()
    native.layernorm_rows(z, scale, bias, z, 1e-5)
    np.testing.assert_array_equal(z, y)


def test_constant_row_and_large_epsilon(every_isa):
    x = np.array([[2.0] * 20, list(range(20))], dtype=np.float32)
    scale, bias = np.full(20, 2.0, np.float32), np.full(20, 0.5, np.float32)
    y = nn.layer_norm(x, scale, bias, epsilon=0.25)
    np.testing.assert_array_equal(y[0], 0.5)  # zero variance: (x - mean) = 0 exactly
    np.testing.assert_allclose(y, _reference(x, scale, bias, -1, 0.25), rtol=1e-6, atol=1e-6)


def test_kernel_keeps_numpy_for_what_the_native_rows_do_not_cover(every_isa):
    """Mean / InvStdDev outputs, broadcasting scale, float64 and stash_type 11 take the numpy path
    (same results as before); a scale that does not broadcast still raises its clear error."""
    from tests.native.conftest import numpy_path

    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 40)).astype(np.float32)
    s = rng.standard_normal(40).astype(np.float32)
    three = NodeContext("ln", "LayerNormalization", 3, (np.float32, np.float32, np.float32), 17)
    got = nn.layer_norm(x, s, None, ctx=three)
    with numpy_path():
        want = nn.layer_norm(x, s, None, ctx=three)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # scale (1, 40) broadcasts the result to rank 3 too; float64 and stash_type 11 stay numpy
    for args, kw in (((x, s.reshape(1, 40), None), {}), ((x.astype(np.float64), s, None), {}),
                     ((x, s, None), {"stash_type": 11})):
        got = nn.layer_norm(*args, **kw)
        with numpy_path():
            want = nn.layer_norm(*args, **kw)
        np.testing.assert_array_equal(got, want)
    # native and numpy paths agree on the common case
    with numpy_path():
        want = nn.layer_norm(x, s, s)
    np.testing.assert_allclose(nn.layer_norm(x, s, s), want, rtol=2e-6, atol=2e-6)
    with pytest.raises(ValueError, match="do not broadcast"):
        nn.layer_norm(x, rng.standard_normal(7).astype(np.float32))


# RMS normalization (SimplifiedLayerNormalization, mrt_rmsnorm_f32): the same rows without centring or bias
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (2, 7, 16), (4, 17), (1, 64, 128), (2, 3, 33), (2, 1000)])
def test_rmsnorm_rows_match_float64(shape, every_isa, threads):
    rng = np.random.default_rng(sum(shape) + 1)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    scale = rng.standard_normal(shape[-1]).astype(np.float32)
    x64 = x.astype(np.float64)
    expected = x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + 1e-6) * scale
    y = np.full_like(x, np.nan)
    native.rmsnorm_rows(x, scale, y, 1e-6)
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=2e-6)
    native.rmsnorm_rows(x, scale, x, 1e-6)  # in place
    np.testing.assert_allclose(x, expected, rtol=2e-6, atol=2e-6)
