"""The ``out=`` contract of kernels the memory plan hands buffers to (D17): the result goes into ``out``
when it has exactly the result's shape and dtype and overlaps no input; otherwise a fresh array."""
from __future__ import annotations

import numpy as np
import pytest

from minirt.kernels import tensor


def _parts():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, c, 3, 4)).astype(np.float32) for c in (2, 5, 1)]


def test_concat_writes_into_a_fitting_out():
    parts = _parts()
    out = np.full((1, 8, 3, 4), np.nan, np.float32)
    got = tensor.concat(*parts, axis=1, out=out)
    assert got is out
    np.testing.assert_array_equal(got, np.concatenate(parts, axis=1))


@pytest.mark.parametrize("bad", ["shape", "dtype", "overlap", "strided"])
def test_concat_ignores_an_unfit_out(bad):
    parts = _parts()
    want = np.concatenate(parts, axis=1)
    if bad == "shape":
        out = np.empty((1, 9, 3, 4), np.float32)
    elif bad == "dtype":
        out = np.empty((1, 8, 3, 4), np.float64)
    elif bad == "strided":
        out = np.empty((1, 8, 3, 8), np.float32)[..., ::2]
    else:  # out overlaps an input: writing it would corrupt what is still being read
        big = np.zeros(2 * want.size, np.float32)
        parts[1] = big[: parts[1].size].reshape(parts[1].shape)
        parts[1][...] = 1.0
        want = np.concatenate(parts, axis=1)
        out = big[: want.size].reshape(want.shape)
    got = tensor.concat(*parts, axis=1, out=out)
    assert got is not out
    np.testing.assert_array_equal(got, want)


def test_concat_with_out_still_reports_mismatched_shapes():
    a, b = np.zeros((1, 2, 3), np.float32), np.zeros((1, 2, 4), np.float32)
    with pytest.raises(ValueError, match="Concat"):
        tensor.concat(a, b, axis=1, out=np.empty((1, 4, 3), np.float32))


@pytest.mark.parametrize("perm", [None, (0, 2, 3, 1), (3, 1, 0, 2)])
def test_transpose_out(perm):
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32)
    want = np.ascontiguousarray(x.transpose(perm))
    out = np.empty(want.shape, np.float32)
    got = tensor.transpose(x, perm=perm, out=out)
    assert got is out
    np.testing.assert_array_equal(got, want)
    # an out that aliases the input is refused
    alias = x.reshape(want.shape)
    got = tensor.transpose(x, perm=perm, out=alias)
    assert got is not alias
    np.testing.assert_array_equal(got, want)


def _geometry_cases():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 4, 6, 5)).astype(np.float32)
    return x, rng


def test_conv_native_path_writes_into_out():
    from minirt import native
    from minirt.kernels import nn

    if not native.available:
        pytest.skip("native kernels not available")
    x, rng = _geometry_cases()
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    want = nn.conv(x, w, pads=(1, 1, 1, 1))
    out = np.full(want.shape, np.nan, np.float32)
    got = nn.conv(x, w, pads=(1, 1, 1, 1), out=out)
    assert got is out
    np.testing.assert_array_equal(got, want)
    wrong = np.empty((1, 3, 6, 6), np.float32)
    assert nn.conv(x, w, pads=(1, 1, 1, 1), out=wrong) is not wrong


def test_conv_transpose_tiles_and_global_pool_write_into_out():
    from minirt import native
    from minirt.kernels import fused, nn

    if not native.available:
        pytest.skip("native layout kernels not available")
    x, rng = _geometry_cases()
    w = rng.standard_normal((4, 2, 2, 2)).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    want = nn.conv_transpose(x, w, b, strides=(2, 2))
    out = np.full(want.shape, np.nan, np.float32)
    assert nn.conv_transpose(x, w, b, strides=(2, 2), out=out) is out
    np.testing.assert_array_equal(out, want)
    out2 = np.full(want.shape, np.nan, np.float32)
    got = fused.fused_conv_transpose(x, w, b, strides=(2, 2), activation="Relu", out=out2)
    assert got is out2
    np.testing.assert_array_equal(got, np.maximum(want, 0))
    pooled = np.full((1, 4, 1, 1), np.nan, np.float32)
    assert nn.global_average_pool(x, out=pooled) is pooled
    np.testing.assert_allclose(pooled, x.mean(axis=(2, 3), keepdims=True), rtol=1e-6)
