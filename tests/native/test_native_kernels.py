"""Native kernels against the numpy path of the same kernel function and against onnxruntime.

Every case runs with the best implementation for this CPU (AVX2+FMA here)
and with the baseline one, and with 1-3 threads.
"""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import nn
from tests.kernels.reference import reference_outputs
from tests.native.conftest import numpy_path

RTOL, ATOL = 1e-5, 1e-5


def _rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def _both(fn):
    y_native = fn()
    with numpy_path():
        y_numpy = fn()
    return y_native, y_numpy


# --------------------------------------------------------------------------- depthwise conv

DW_CASES = [
    # (N, C, H, W, k, stride, pads, dilation)
    (1, 8, 16, 16, 3, 1, (1, 1, 1, 1), 1),
    (2, 5, 9, 13, 3, 1, (1, 1, 1, 1), 1),
    (1, 7, 15, 11, 3, 2, (1, 1, 1, 1), 1),
    (1, 6, 16, 16, 3, 2, (0, 0, 1, 1), 1),  # TF-style asymmetric SAME
    (1, 4, 10, 17, 5, 1, (2, 2, 2, 2), 1),
    (1, 3, 19, 8, 5, 2, (2, 1, 0, 2), 1),
    (1, 4, 12, 12, 3, 1, (2, 2, 2, 2), 2),  # dilated
    (1, 3, 6, 6, 3, 3, (0, 0, 0, 0), 1),  # stride 3 (generic path)
    (1, 2, 3, 3, 5, 1, (2, 2, 2, 2), 1),  # kernel larger than the input
    (1, 2, 1, 40, 3, 1, (1, 1, 1, 1), 1),
    (1, 3, 8, 8, 2, 1, (0, 0, 1, 1), 1),  # even kernel, one pad
    (1, 3, 8, 8, 7, 2, (3, 3, 3, 3), 1),
]


@pytest.mark.parametrize("case", DW_CASES, ids=[str(c) for c in DW_CASES])
@pytest.mark.parametrize("bias", [True, False])
def test_depthwise_matches_numpy_and_onnxruntime(case, bias, isa, threads):
    n, c, h, w, k, s, pads, d = case
    rng = np.random.default_rng(hash(case) % 2**32)
    x, wt = _rand(rng, n, c, h, w), _rand(rng, c, 1, k, k)
    b = _rand(rng, c) if bias else None
    attrs = dict(group=c, pads=pads, strides=(s, s), dilations=(d, d))
    got, ref = _both(lambda: nn.conv(x, wt, b, **attrs))
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)
    (ort,) = reference_outputs("Conv", [x, wt] + ([b] if bias else []), attrs)
    np.testing.assert_allclose(got, ort, rtol=RTOL, atol=ATOL)


def test_depthwise_auto_pad_and_readonly_weights(isa):
    rng = np.random.default_rng(1)
    x, wt = _rand(rng, 1, 6, 11, 14), _rand(rng, 6, 1, 3, 3)
    wt.setflags(write=False)  # weights come memory-mapped and read-only
    for auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        attrs = dict(group=6, auto_pad=auto_pad, strides=(2, 2))
        got, ref = _both(lambda: nn.conv(x, wt, None, **attrs))
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)


def test_non_contiguous_input(isa):
    rng = np.random.default_rng(2)
    x = _rand(rng, 1, 4, 12, 20)[:, :, :, ::2]  # strided view
    wt = _rand(rng, 4, 1, 3, 3)
    got, ref = _both(lambda: nn.conv(x, wt, None, group=4, pads=(1, 1, 1, 1)))
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------- GEMM-based conv (native im2col + epilogue)

CONV_CASES = [
    # (N, C, H, W, M, k, stride, pads, dilation, group)
    (1, 3, 17, 15, 8, 3, 2, (1, 1, 1, 1), 1, 1),
    (2, 4, 9, 9, 6, 3, 1, (1, 1, 1, 1), 1, 1),
    (1, 4, 10, 10, 6, 3, 1, (0, 0, 0, 0), 2, 2),  # grouped + dilated
    (1, 8, 7, 7, 5, 1, 1, (0, 0, 0, 0), 1, 1),  # 1x1: direct GEMM
    (1, 8, 9, 9, 5, 1, 2, (0, 0, 0, 0), 1, 1),  # strided 1x1 -> im2col
    (1, 3, 6, 6, 4, 1, 1, (1, 1, 1, 1), 1, 1),  # padded 1x1
    (1, 6, 12, 5, 4, 5, 1, (2, 0, 1, 2), 1, 1),  # asymmetric pads
    (1, 4, 8, 8, 4, 3, 1, (1, 1, 1, 1), 1, 4),  # group == C but M == C*1 ... depthwise-like with bias
    (1, 4, 8, 8, 8, 3, 1, (1, 1, 1, 1), 1, 4),  # channel multiplier 2 (not depthwise)
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(c) for c in CONV_CASES])
def test_conv_matches_numpy_and_onnxruntime(case, isa, threads):
    n, c, h, w, m, k, s, pads, d, g = case
    rng = np.random.default_rng(hash(case) % 2**32)
    x, wt, b = _rand(rng, n, c, h, w), _rand(rng, m, c // g, k, k), _rand(rng, m)
    attrs = dict(group=g, pads=pads, strides=(s, s), dilations=(d, d))
    got, ref = _both(lambda: nn.conv(x, wt, b, **attrs))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    (ort,) = reference_outputs("Conv", [x, wt, b], attrs)
    np.testing.assert_allclose(got, ort, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- fused epilogues


def _np_act(y, name, params):
    if name == "":
        return y
    if name == "Relu":
        return np.maximum(y, 0)
    if name == "Clip":
        return np.clip(y, params[0], params[1])
    if name == "LeakyRelu":
        return np.where(y >= 0, y, params[0] * y)
    if name in ("Sigmoid", "SiLU"):
        with np.errstate(over="ignore"):
            sig = 1 / (1 + np.exp(-y.astype(np.float64)))
        return sig if name == "Sigmoid" else y * sig
    if name == "HardSigmoid":
        return np.clip(params[0] * y + params[1], 0, 1)
    if name == "HardSwish":
        return y * np.clip(y / 6 + 0.5, 0, 1)
    if name == "Tanh":
        return np.tanh(y.astype(np.float64))
    raise AssertionError(name)


ACTS = [("", ()), ("Relu", ()), ("Clip", (0.0, 6.0)), ("LeakyRelu", (0.1,)), ("Sigmoid", ()), ("SiLU", ()),
        ("HardSigmoid", (0.2, 0.5)), ("HardSwish", ()), ("Tanh", ())]


@pytest.mark.parametrize("act,params", ACTS, ids=[a or "none" for a, _ in ACTS])
@pytest.mark.parametrize("kind", ["depthwise", "3x3", "1x1"])
@pytest.mark.parametrize("residual", [False, True])
def test_fused_epilogue(act, params, kind, residual, isa):
    rng = np.random.default_rng(3)
    c = 6
    x = _rand(rng, 1, c, 9, 11) * 3
    if kind == "depthwise":
        wt, g, m = _rand(rng, c, 1, 3, 3), c, c
    elif kind == "3x3":
        wt, g, m = _rand(rng, 5, c, 3, 3), 1, 5
    else:
        wt, g, m = _rand(rng, 5, c, 1, 1), 1, 5
    k = wt.shape[2]
    b = _rand(rng, m)
    attrs = dict(group=g, pads=(k // 2,) * 4)
    with numpy_path():
        conv = nn.conv(x, wt, b, **attrs)
    z = _rand(rng, *conv.shape) if residual else None
    expected = _np_act(conv.astype(np.float64) + (0 if z is None else z), act, params)
    got = nn.conv_fused_native(x, wt, b, z, activation=act, activation_params=params, **attrs)
    assert got is not None and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)


def test_fused_declines_what_it_cannot_do():
    rng = np.random.default_rng(4)
    x, wt = _rand(rng, 1, 2, 5, 5), _rand(rng, 2, 2, 3, 3)
    assert nn.conv_fused_native(x, wt, activation="Softplus") is None  # (no native epilogue computes it)
    assert nn.conv_fused_native(x.astype(np.float64), wt.astype(np.float64)) is None
    x3, w3 = x[:, :, :, None, :], wt[:, :, :, None, :]
    assert nn.conv_fused_native(x3, w3) is None  # 3-D conv (1-D runs as 2-D: tests/native/test_conv_1d_native.py)
    assert nn.conv_fused_native(x, wt, None, np.zeros((1, 2, 1, 1), np.float32)) is None  # broadcasting residual
    with numpy_path():
        assert nn.conv_fused_native(x, wt) is None


def test_sigmoid_saturates_cleanly(isa):
    x = np.array([-1000, -100, -88, -20, -1e-3, 0, 1e-3, 20, 88, 100, 1000], np.float32).reshape(1, 1, 1, -1)
    wt = np.ones((1, 1, 1, 1), np.float32)
    for act in ("Sigmoid", "SiLU"):
        got = nn.conv_fused_native(x, wt, activation=act)
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, _np_act(x.astype(np.float64), act, ()), rtol=1e-6, atol=1e-30)


# --------------------------------------------------------------------------- pooling

POOL_CASES = [
    # (N, C, H, W, k, stride, pads, dilation, ceil_mode)
    (1, 3, 16, 16, 2, 2, (0, 0, 0, 0), 1, 0),
    (2, 4, 15, 13, 3, 2, (1, 1, 1, 1), 1, 0),
    (1, 3, 15, 13, 3, 2, (1, 1, 1, 1), 1, 1),
    (1, 2, 14, 14, 3, 2, (0, 0, 0, 0), 1, 1),  # ceil mode without pads
    (1, 5, 20, 20, 5, 1, (2, 2, 2, 2), 1, 0),  # SPPF
    (1, 2, 9, 11, 3, 1, (0, 1, 2, 0), 1, 0),  # asymmetric
    (1, 2, 12, 12, 2, 1, (1, 1, 1, 1), 2, 0),  # dilated
    (1, 2, 10, 10, 3, 3, (1, 1, 1, 1), 1, 1),  # stride 3
    (1, 1, 1, 7, 1, 2, (0, 0, 0, 0), 1, 0),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=[str(c) for c in POOL_CASES])
def test_max_pool(case, isa, threads):
    n, c, h, w, k, s, pads, d, ceil = case
    x = _rand(np.random.default_rng(5), n, c, h, w)
    attrs = dict(kernel_shape=(k, k), strides=(s, s), pads=pads, dilations=(d, d), ceil_mode=ceil)
    got, ref = _both(lambda: nn.max_pool_10(x, **attrs))
    np.testing.assert_array_equal(got, ref)
    (ort,) = reference_outputs("MaxPool", [x], attrs, opset=12)
    np.testing.assert_array_equal(got, ort)


def test_max_pool_propagates_nan(isa):
    x = np.zeros((1, 1, 4, 4), np.float32)
    x[0, 0, 1, 1] = np.nan
    got, ref = _both(lambda: nn.max_pool_10(x, kernel_shape=(2, 2), strides=(1, 1)))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))


@pytest.mark.parametrize("case", POOL_CASES, ids=[str(c) for c in POOL_CASES])
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(case, count_include_pad, isa, threads):
    n, c, h, w, k, s, pads, d, ceil = case
    x = _rand(np.random.default_rng(6), n, c, h, w)
    attrs = dict(kernel_shape=(k, k), strides=(s, s), pads=pads, dilations=(d, d), ceil_mode=ceil,
                 count_include_pad=count_include_pad)
    got, ref = _both(lambda: nn.average_pool_19(x, **attrs))
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    if d == 1:  # onnxruntime's AveragePool-19 dilation support is recent; compare where it is settled
        attrs.pop("dilations")
        (ort,) = reference_outputs("AveragePool", [x], attrs, opset=11)
        np.testing.assert_allclose(got, ort, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- threads


def test_threads_give_identical_results():
    if not native.available:
        pytest.skip(native.reason)
    rng = np.random.default_rng(7)
    x, wt, b = _rand(rng, 2, 32, 40, 40), _rand(rng, 32, 1, 3, 3), _rand(rng, 32)
    results = []
    before = native.threads()
    try:
        for t in (1, 2, 4, 7):
            native.set_threads(t)
            results.append((nn.conv(x, wt, b, group=32, pads=(1, 1, 1, 1)),
                            nn.max_pool_10(x, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))))
    finally:
        native.set_threads(before)
    for r in results[1:]:
        for a, e in zip(r, results[0]):
            np.testing.assert_array_equal(a, e)


def test_concurrent_python_threads():
    """Two Python threads running native kernels at once (cffi releases the GIL) share the pool safely."""
    if not native.available:
        pytest.skip(native.reason)
    import threading

    rng = np.random.default_rng(8)
    x, wt = _rand(rng, 1, 64, 56, 56), _rand(rng, 64, 1, 3, 3)
    with numpy_path():
        expected = nn.conv(x, wt, None, group=64, pads=(1, 1, 1, 1))
    errors = []

    def work():
        native.set_threads(2)
        for _ in range(20):
            y = nn.conv(x, wt, None, group=64, pads=(1, 1, 1, 1))
            if not np.allclose(y, expected, rtol=RTOL, atol=ATOL):
                errors.append("mismatch")

    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
