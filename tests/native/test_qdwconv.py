"""The native int8 depthwise conv (``mrt_qdwconv2d``, depthwise ``QConv``) against an
independent numpy integer reference, on every ISA level and with 1-3 threads.

The reference computes the integer sums sum((xq - x_zero[c]) * w) in int64 with explicit
zero padding, then the float32 epilogue ``post_a * act(scale * acc + bias + res) + post_b``
and, for a uint8 output, ``clamp(rint(y / y_scale) + y_zero)``.  The integer sums must match
exactly (checked with scale 1 and no epilogue); the epilogue is float arithmetic whose order
of operations (FMA contraction) may differ in the last bit, so float outputs are compared
with a relative tolerance and uint8 outputs within one step where y / y_scale sits on a
rounding boundary.
"""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import qlinear
from tests.native.conftest import numpy_path

ACTS = {  # name -> (native code, params, numpy function)
    "": (0, (), lambda v: v),
    "Relu": (1, (), lambda v: np.maximum(v, np.float32(0))),
    "Clip": (2, (-0.5, 1.5), lambda v: np.clip(v, np.float32(-0.5), np.float32(1.5))),
    "HardSwish": (7, (), lambda v: v * np.clip(v * np.float32(1 / 6) + np.float32(0.5), 0, 1)),
    "Sigmoid": (4, (), lambda v: np.float32(1) / (np.float32(1) + np.exp(-v))),  # the act_row path
}


def _int_sums(xq, x_zero, w, stride, pads):
    """sum over the taps of (xq - x_zero[c]) * w[c] as int64 (N, C, OH, OW), zero padding in x - x_zero."""
    n, c, h, wd = xq.shape
    k = w.shape[-1]
    t, left, b, r = pads
    xs = xq.astype(np.int64) - x_zero.astype(np.int64).reshape(1, c, 1, 1)
    xp = np.zeros((n, c, h + t + b, wd + left + r), np.int64)
    xp[:, :, t:t + h, left:left + wd] = xs
    oh = (h + t + b - k) // stride + 1
    ow = (wd + left + r - k) // stride + 1
    acc = np.zeros((n, c, oh, ow), np.int64)
    for ky in range(k):
        for kx in range(k):
            win = xp[:, :, ky:ky + stride * (oh - 1) + 1:stride, kx:kx + stride * (ow - 1) + 1:stride]
            acc += win * w[:, ky, kx].astype(np.int64).reshape(1, c, 1, 1)
    return acc


def _quantize(x, scale, zero):
    """quantize_u8 per channel, as QuantizeLinear: saturate(rint(x / scale) + zero)."""
    s = scale.reshape(1, -1, 1, 1)
    z = zero.astype(np.float32).reshape(1, -1, 1, 1)
    return np.clip(np.rint(x / s) + z, 0, 255).astype(np.uint8)


def _case(rng, n, c, h, wd, k):
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    x_scale = rng.uniform(0.01, 0.03, c).astype(np.float32)
    x_zero = rng.integers(0, 256, c).astype(np.float32)
    w = rng.integers(-128, 128, (c, k, k)).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.01, c).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    return x, x_scale, x_zero, w, w_scale, bias


def _run(x, x_scale, x_zero, w, scale, bias, k, stride, pads, act, post, y_q, res):
    n, c, h, wd = x.shape
    oh = (h + pads[0] + pads[2] - k) // stride + 1
    ow = (wd + pads[1] + pads[3] - k) // stride + 1
    code, params, _ = ACTS[act]
    a0, a1 = (tuple(params) + (0.0, 0.0))[:2]
    prep = native.qdwconv2d_prepare(x.shape, (k, k), (stride, stride), (1, 1), pads[:2], (oh, ow), x_scale, x_zero,
                                    w.astype(np.float32), scale, bias, code, a0, a1, post)
    y = np.empty((n, c, oh, ow), np.uint8 if y_q else np.float32)
    native.qdwconv2d_call(prep, x, y, res, y_q)
    return y


CASES = [
    # (N, C, H, W, k, stride, pads)
    (1, 1, 7, 9, 3, 1, (1, 1, 1, 1)),
    (2, 5, 9, 13, 3, 1, (1, 1, 1, 1)),
    (1, 33, 11, 17, 3, 2, (1, 1, 1, 1)),
    (1, 6, 16, 16, 3, 2, (0, 0, 1, 1)),
    (2, 4, 10, 17, 5, 1, (2, 2, 2, 2)),
    (1, 16, 19, 8, 5, 2, (2, 1, 0, 2)),
    (1, 3, 3, 3, 5, 1, (2, 2, 2, 2)),  # kernel larger than the input
    (1, 2, 1, 40, 3, 1, (1, 1, 1, 1)),
    (1, 7, 23, 31, 3, 1, (0, 0, 0, 0)),
    (3, 9, 6, 5, 3, 1, (1, 1, 1, 1)),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("u8_input", [True, False])
def test_integer_sums_are_exact(case, u8_input, every_isa, threads):
    """scale 1, no bias / activation: the float output is the integer sum itself."""
    n, c, h, wd, k, stride, pads = case
    rng = np.random.default_rng(abs(hash(case)) % 2**32)
    x, x_scale, x_zero, w, _, _ = _case(rng, n, c, h, wd, k)
    xq = _quantize(x, x_scale, x_zero)
    acc = _int_sums(xq, x_zero, w, stride, pads)
    y = _run(xq if u8_input else x, x_scale, x_zero, w, np.ones(c, np.float32), None, k, stride, pads, "",
             (1.0, 0.0), None, None)
    np.testing.assert_array_equal(y, acc.astype(np.float32))


def _reference(xq, x_zero, w, scale, bias, stride, pads, act, post, res):
    acc = _int_sums(xq, x_zero, w, stride, pads).astype(np.float32)
    v = acc * scale.reshape(1, -1, 1, 1) + bias.reshape(1, -1, 1, 1)
    if res is not None:
        v = v + res
    v = ACTS[act][2](v.astype(np.float32))
    return (np.float32(post[0]) * v + np.float32(post[1])).astype(np.float32)


@pytest.mark.parametrize("case", CASES[1:7], ids=[str(c) for c in CASES[1:7]])
@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("out_u8", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_epilogue(case, act, out_u8, residual, every_isa, threads):
    n, c, h, wd, k, stride, pads = case
    rng = np.random.default_rng(abs(hash((case, act))) % 2**32)
    x, x_scale, x_zero, w, w_scale, bias = _case(rng, n, c, h, wd, k)
    xq = _quantize(x, x_scale, x_zero)
    scale = (x_scale * w_scale).astype(np.float32)
    post = (0.75, -0.125)
    oh = (h + pads[0] + pads[2] - k) // stride + 1
    ow = (wd + pads[1] + pads[3] - k) // stride + 1
    res = rng.standard_normal((n, c, oh, ow)).astype(np.float32) if residual else None
    ref = _reference(xq, x_zero, w, scale, bias, stride, pads, act, post, res)
    y_q = (0.02, 100) if out_u8 else None
    got = _run(xq, x_scale, x_zero, w, scale, bias, k, stride, pads, act, post, y_q, res)
    if not out_u8:
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
        return
    ref_q = qlinear.requantize_u8(ref, *y_q)
    diff = np.abs(got.astype(np.int32) - ref_q.astype(np.int32))
    assert diff.max() <= 1
    t = ref / np.float32(y_q[0])
    near_tie = np.abs(np.abs(t - np.floor(t)) - 0.5) < 1e-3
    assert not (diff.astype(bool) & ~near_tie).any()  # off by one only at a rounding tie


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("act", ["", "Relu", "Clip"])
def test_uint8_output_on_rounding_boundaries(stride, act, every_isa, threads):
    """The uint8 output is the float output requantized (the same epilogue, then the division) byte for
    byte, also where the values sit on or within a few ulps of rounding boundaries, which the folded
    requantization of the VNNI kernel (D181) must hand to the step-by-step arithmetic: scale 1/8 and
    y_scale 1/4 put y / y_scale on half-integers for half the sums with bias 1/8, and 2^-22 .. 2^-10
    from them with the other biases."""
    rng = np.random.default_rng(3)
    c, h, wd, k = 16, 12, 20, 3
    deltas = [0.0, 2.0 ** -22, -(2.0 ** -22), 2.0 ** -20, -(2.0 ** -20), 2.0 ** -16, -(2.0 ** -16), 2.0 ** -10]
    xq = rng.integers(97, 104, (1, c, h, wd)).astype(np.uint8)
    x_scale, x_zero = np.ones(c, np.float32), np.full(c, 100, np.float32)
    w = rng.integers(-1, 2, (c, k, k)).astype(np.int8)
    scale = np.full(c, 0.125, np.float32)
    bias = np.array([0.125 + deltas[i % len(deltas)] for i in range(c)], np.float32)
    pads = (1, 1, 1, 1)
    y_q = (0.25, 7)
    got = _run(xq, x_scale, x_zero, w, scale, bias, k, stride, pads, act, (1.0, 0.0), y_q, None)
    yf = _run(xq, x_scale, x_zero, w, scale, bias, k, stride, pads, act, (1.0, 0.0), None, None)
    t = yf / np.float32(y_q[0])
    assert np.mean(np.abs(np.abs(t - np.floor(t)) - 0.5) < 1e-3) > 0.1  # (the case does sit on boundaries)
    np.testing.assert_array_equal(got, qlinear.requantize_u8(yf, *y_q))


def test_float_input_is_quantized_per_channel(every_isa):
    """A float input is quantized while it is copied in: the same sums as the quantized input."""
    rng = np.random.default_rng(5)
    x, x_scale, x_zero, w, _, _ = _case(rng, 2, 7, 12, 19, 3)
    x[0, 0, 0, :3] = [np.nan, 1e9, -1e9]  # NaN -> 0 (as the GEMM path's quantization), out of range saturates
    xq = _quantize(np.nan_to_num(x, nan=0.0), x_scale, x_zero)
    xq[0, 0, 0, 0] = 0
    ones = np.ones(7, np.float32)
    got = _run(x, x_scale, x_zero, w, ones, None, 3, 1, (1, 1, 1, 1), "", (1.0, 0.0), None, None)
    np.testing.assert_array_equal(got, _int_sums(xq, x_zero, w, 1, (1, 1, 1, 1)).astype(np.float32))


def _assert_matches_numpy_path(got, ref):
    """A native QConv result against the numpy path's: uint8 outputs within one quantization step
    (the float epilogue's rounding can fall on either side of a step), float outputs to 1e-5."""
    if got.dtype == np.uint8:
        assert np.abs(got.astype(np.int32) - ref.astype(np.int32)).max() <= 1
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("out_u8", [False, True])
@pytest.mark.parametrize("u8_input", [False, True])
def test_qconv_depthwise_native_matches_numpy_path(out_u8, u8_input, every_isa):
    """The QConv kernel: the native depthwise path against its numpy path (fake quantization in
    float32), with per-tensor and per-channel input scales, post_scale / post_shift, out=."""
    rng = np.random.default_rng(7)
    c = 12
    x = rng.standard_normal((2, c, 14, 11)).astype(np.float32)
    w = rng.integers(-128, 128, (c, 1, 3, 3)).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.01, c).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    for x_scale, x_zero in ((np.array(0.02, np.float32), np.array(120, np.uint8)),
                            (rng.uniform(0.01, 0.03, c).astype(np.float32), rng.integers(0, 256, c).astype(np.uint8))):
        xin = _quantize(x, np.broadcast_to(x_scale, (c,)), np.broadcast_to(x_zero, (c,))) if u8_input else x
        attrs = dict(group=c, kernel_shape=(3, 3), pads=(1, 1, 1, 1), strides=(2, 2), activation="HardSwish",
                     post_scale=0.5, post_shift=0.25)
        if out_u8:
            attrs.update(output_scale=0.03, output_zero_point=7)
        out = np.empty((2, c, 7, 6), np.uint8 if out_u8 else np.float32)
        got = qlinear.qconv(xin, x_scale, x_zero, w, w_scale, b, None, out=out, **attrs)
        assert got is out  # the memory plan's buffer is used
        with numpy_path():
            ref = qlinear.qconv(xin, x_scale, x_zero, w, w_scale, b, None, **attrs)
        _assert_matches_numpy_path(got, ref)


def test_qconv_post_scale_on_the_gemm_path(every_isa):
    """post_scale / post_shift on a (non-depthwise) QConv: native GEMM epilogue vs the numpy path,
    float and uint8 outputs, with a residual and with several images side by side."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 8, 6, 5)).astype(np.float32)
    w = rng.integers(-128, 128, (16, 8, 3, 3)).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.01, 16).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    z = rng.standard_normal((3, 16, 6, 5)).astype(np.float32)
    xs, xz = np.array(0.02, np.float32), np.array(128, np.uint8)
    for extra in ({}, {"output_scale": 0.05, "output_zero_point": 9}):
        for zz in (None, z):
            attrs = dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), activation="Relu", post_scale=-0.5,
                         post_shift=0.3, **extra)
            got = qlinear.qconv(x, xs, xz, w, w_scale, b, zz, **attrs)
            with numpy_path():
                ref = qlinear.qconv(x, xs, xz, w, w_scale, b, zz, **attrs)
            _assert_matches_numpy_path(got, ref)


def test_post_scale_with_pool_is_refused():
    x = np.zeros((1, 2, 4, 4), np.float32)
    w = np.ones((2, 2, 1, 1), np.int8)
    with pytest.raises(ValueError, match="post_scale"):
        qlinear.qconv(x, np.array(0.1, np.float32), np.array(0, np.uint8), w, np.ones(2, np.float32),
                      pool_kernel_shape=(2, 2), post_scale=2.0)


U8_CASES = CASES + [
    (1, 3, 5, 150, 3, 1, (1, 1, 1, 1)),  # rows wider than a 64-column block
    (2, 4, 20, 20, 5, 1, (2, 2, 2, 2)),
    (1, 2, 9, 70, 7, 1, (3, 3, 3, 3)),
    (1, 5, 12, 13, 3, 1, (2, 0, 1, 2)),  # asymmetric padding
    (1, 3, 9, 151, 3, 2, (1, 1, 1, 1)),  # stride 2 (the parity planes on VNNI), wide rows
    (2, 4, 21, 70, 5, 2, (2, 3, 2, 1)),  # odd left padding
    (1, 2, 15, 17, 7, 2, (3, 3, 3, 3)),
    (1, 3, 8, 8, 3, 2, (0, 0, 0, 0)),  # no padding: the last input row and column unused
]


@pytest.mark.parametrize("case", U8_CASES, ids=[str(c) for c in U8_CASES])
@pytest.mark.parametrize("u8_input", [True, False])
def test_uint8_output_is_exact(case, u8_input, every_isa, threads):
    """uint8 output (the AVX512-VNNI path where available), uint8 or float input (quantized while
    copied in, NaN -> 0): with scale 1 and an output scale of 16 (exact divisions) the result is
    exactly clamp(rint(sum / 16) + 128)."""
    n, c, h, wd, k, stride, pads = case
    rng = np.random.default_rng(abs(hash(case)) % 2**32 + 1)
    x, x_scale, x_zero, w, _, _ = _case(rng, n, c, h, wd, k)
    x[0, 0, 0, 0] = np.nan
    xq = _quantize(np.nan_to_num(x, nan=0.0), x_scale, x_zero)
    xq[0, 0, 0, 0] = 0
    acc = _int_sums(xq, x_zero, w, stride, pads)
    got = _run(xq if u8_input else x, x_scale, x_zero, w, np.ones(c, np.float32), None, k, stride, pads, "", (1.0, 0.0), (16.0, 128),
               None)
    want = np.clip(np.rint(acc / 16.0) + 128, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got, want)
