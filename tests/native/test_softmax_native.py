"""Native Softmax / LogSoftmax rows (rowops_impl.h) against numpy in float64."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import nn


def _reference(x: np.ndarray, log: bool) -> np.ndarray:
    x64 = x.astype(np.float64)
    shifted = x64 - x64.max(axis=-1, keepdims=True)
    total = np.exp(shifted).sum(axis=-1, keepdims=True)
    return shifted - np.log(total) if log else np.exp(shifted) / total


# row lengths around every vector width (4, 8, 16) and the attention sizes of real models
@pytest.mark.parametrize("shape", [(1,), (3, 1), (2, 5), (7, 8), (4, 15), (3, 16), (5, 17), (2, 33), (1, 4, 64, 64),
                                   (2, 1000), (6, 3, 77)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_rows_match_float64(shape, log, every_isa, threads):
    # an offset of 1000 on every row: the result must not depend on it (log-softmax subtracts max first)
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 8 + 1000).astype(np.float32)
    y = np.full_like(x, np.nan)
    native.softmax_rows(x, y, log)
    ref = _reference(x, log)
    if log:
        np.testing.assert_allclose(y, ref, rtol=1e-6, atol=2e-6)
    else:
        np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-9)
        np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-5)


def test_softmax_in_place_and_extremes(every_isa):
    x = np.array([[0.0, -np.inf, 1.0, 2.0, 3.0, -1e30, 80.0, 100.0, 5.0],
                  [1e30, 1e30, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                  [-3.0] * 9], dtype=np.float32)
    y = x.copy()
    native.softmax_rows(y, y, False)  # in place
    # -inf and -1e30 contribute nothing; two equal maxima share the mass; a constant row is uniform
    np.testing.assert_allclose(y, _reference(x, False), rtol=2e-6, atol=1e-30)
    assert y[0, 1] < 1e-30 and y[0, 5] < 1e-30
    np.testing.assert_allclose(y[1, :2], 0.5, rtol=1e-6)
    np.testing.assert_allclose(y[2], 1 / 9, rtol=1e-6)


@pytest.mark.parametrize("width", [9, 64, 128])
def test_masked_entries_are_exact_zeros_not_subnormals(width, every_isa):
    """An attention mask of float32's lowest value (transformers' BERT) or any logit more than 87 below
    the row's max gives exactly 0, not a subnormal: exp(x) is 0 below x = -87 (FN(vexp_group)).
    Subnormals there made the next product (the attention's P @ V) 40x slower."""
    rng = np.random.default_rng(width)
    x = rng.standard_normal((4, width)).astype(np.float32)
    x[:, width // 2:] += np.finfo(np.float32).min  # masked half
    x[3, 1:] = -95.0                               # e^-95 is subnormal in float32
    y = np.empty_like(x)
    native.softmax_rows(x, y, False)
    tiny = np.finfo(np.float32).tiny
    assert not np.any((y != 0) & (np.abs(y) < tiny)), "subnormal results"
    assert (y[:3, width // 2:] == 0).all() and (y[3, 1:] == 0).all() and y[3, 0] == 1.0
    np.testing.assert_allclose(y, _reference(x, False), rtol=2e-6, atol=1e-37)
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("log", [False, True])
def test_nan_row_turns_nan_and_others_do_not(log, every_isa):
    x = np.zeros((3, 20), dtype=np.float32)
    x[0, 0] = np.nan   # first element: it becomes the running max
    x[1, 13] = np.nan  # in a vector lane after the first
    y = np.empty_like(x)
    native.softmax_rows(x, y, log)
    assert np.isnan(y[0]).all() and np.isnan(y[1]).all()
    assert np.isfinite(y[2]).all()


@pytest.mark.parametrize("op, axis", [("Softmax", -1), ("LogSoftmax", -1), ("Softmax", 1)])
def test_kernel_native_path_equals_numpy_path(op, axis, every_isa):
    from tests.native.conftest import numpy_path

    x = np.random.default_rng(3).standard_normal((2, 3, 4, 37)).astype(np.float32)
    fn = nn.softmax_13 if op == "Softmax" else nn.log_softmax_13
    got = fn(x, axis=axis)
    with numpy_path():
        want = fn(x, axis=axis)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-7)
    assert got.dtype == np.float32 and got.shape == x.shape
