"""The native depthwise convolution (minirt/native/dwconv_impl.h) against a direct numpy reference.

The kernel has three layouts, chosen by geometry and vector width
(dw_use_direct_s2, dw_use_blocked): planes (row bands, stride 2 de-interleaved
in registers, rows narrower than a vector), channel blocks (a vector per pixel
of 16, 8 or 4 channels; all input rows at once for small planes, a ring of
rows for large ones, bands of rows for tall narrow ones; a partial last block)
and, for 3x3 stride 2 at 8 and 16 lanes, planes read in place (DIRECT below).  Each
has an unrolled path (3x3, 5x5, 7x7; stride 1 or 2; no dilation) and a generic
one (everything else), bands of rows split over threads when there are few
planes or blocks, fused activations and a fused residual.  Every case runs on
every ISA level this CPU has (they pick different layouts for the same shape)
and with 1-3 threads.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from minirt import native
from minirt.kernels import nn
from tests.native.conftest import requires_native

pytestmark = requires_native

RTOL, ATOL = 1e-5, 1e-5


def reference_depthwise(x, w, b, stride, pads, dilation):
    """Direct depthwise convolution: zero-pad, then sum tap-shifted strided views."""
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    (sh, sw), (dh, dw) = stride, dilation
    pt, pl, pb, pr = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (wd + pl + pr - (kw - 1) * dw - 1) // sw + 1
    y = np.zeros((n, c, oh, ow))
    for ky in range(kh):
        for kx in range(kw):
            y0, x0 = ky * dh, kx * dw
            tap = xp[:, :, y0 : y0 + (oh - 1) * sh + 1 : sh, x0 : x0 + (ow - 1) * sw + 1 : sw]
            y += tap * w[:, 0, ky, kx].astype(np.float64)[None, :, None, None]
    if b is not None:
        y += b.astype(np.float64)[None, :, None, None]
    return y


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


# (name, native code, a0, a1, numpy function)
ACTIVATIONS = [
    ("none", 0, 0.0, 0.0, lambda v: v),
    ("relu", 1, 0.0, 0.0, lambda v: np.maximum(v, 0.0)),
    ("clip", 2, -0.5, 2.0, lambda v: np.clip(v, -0.5, 2.0)),
    ("leaky", 3, 0.1, 0.0, lambda v: np.where(v < 0, 0.1 * v, v)),
    ("sigmoid", 4, 0.0, 0.0, _sigmoid),
    ("silu", 5, 0.0, 0.0, lambda v: v * _sigmoid(v)),
    ("hardsigmoid", 6, 0.2, 0.5, lambda v: np.clip(0.2 * v + 0.5, 0.0, 1.0)),
    ("hardswish", 7, 0.0, 0.0, lambda v: v * np.clip(v / 6.0 + 0.5, 0.0, 1.0)),
    ("gelu", 8, 0.0, 0.0, np.vectorize(lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))),
]

CASES = [
    # (N, C, H, W, k, stride, pads (top, left, bottom, right), dilation)
    (1, 3, 16, 16, 3, 1, (1, 1, 1, 1), 1),
    (1, 3, 16, 16, 3, 2, (1, 1, 1, 1), 1),
    (1, 2, 20, 20, 5, 1, (2, 2, 2, 2), 1),
    (1, 2, 21, 19, 5, 2, (2, 2, 2, 2), 1),
    (1, 2, 15, 15, 7, 1, (3, 3, 3, 3), 1),
    (1, 2, 17, 17, 7, 2, (3, 3, 3, 3), 1),
    (2, 3, 12, 13, 3, 1, (2, 2, 2, 2), 2),  # dilated: generic path
    (1, 2, 19, 23, 3, 2, (2, 2, 2, 2), 2),  # dilated stride 2
    (1, 3, 9, 10, 3, 3, (1, 1, 1, 1), 1),  # stride 3
    (1, 2, 10, 12, 3, 1, (0, 1, 2, 0), 1),  # asymmetric pads
    (1, 2, 11, 12, 3, 2, (0, 0, 1, 1), 1),  # TF SAME, stride 2
    (1, 2, 11, 13, 5, 2, (1, 2, 2, 1), 1),  # odd left pad: the split band starts with the other parity
    (1, 2, 9, 14, 3, 2, (0, 3, 0, 0), 1),  # left pad only, larger than one
    (2, 5, 7, 1, 3, 1, (1, 1, 1, 1), 1),  # width 1
    (1, 4, 6, 2, 3, 2, (1, 1, 1, 1), 1),  # width 2
    (1, 4, 5, 3, 3, 1, (1, 1, 1, 1), 1),  # width 3
    (1, 3, 15, 15, 3, 1, (1, 1, 1, 1), 1),
    (1, 3, 17, 17, 3, 2, (1, 1, 1, 1), 1),
    (1, 3, 9, 33, 5, 1, (2, 2, 2, 2), 1),
    (1, 2, 9, 33, 3, 2, (1, 1, 1, 1), 1),
    (3, 4, 2, 2, 3, 1, (1, 1, 1, 1), 1),  # tiny planes, batch 3
    (1, 2, 1, 1, 5, 1, (2, 2, 2, 2), 1),  # a single pixel, 5x5
    (1, 2, 4, 4, 7, 2, (3, 3, 3, 3), 1),  # kernel larger than the input
    (1, 3, 8, 9, 2, 1, (0, 0, 1, 1), 1),  # even kernel (generic)
    (1, 2, 9, 9, 3, 1, (0, 0, 0, 0), 1),  # no padding
    (1, 1, 70, 40, 3, 1, (1, 1, 1, 1), 1),  # one plane: bands of rows split over threads
    (1, 1, 300, 90, 3, 2, (1, 1, 1, 1), 1),  # padded plane above one band: several bands per plane
    (2, 16, 14, 14, 3, 1, (1, 1, 1, 1), 1),
    (1, 16, 14, 14, 3, 2, (1, 1, 1, 1), 1),
    (1, 8, 7, 7, 3, 1, (1, 1, 1, 1), 1),
    # channel blocks (7x7 outputs take them at every ISA level); channel counts around the block widths
    (2, 20, 7, 7, 3, 1, (1, 1, 1, 1), 1),  # batch 2, partial last block
    (1, 19, 14, 14, 3, 2, (1, 1, 1, 1), 1),
    (3, 3, 7, 9, 3, 1, (1, 1, 1, 1), 1),  # 3 channels: one partial block
    (1, 1, 6, 6, 3, 1, (1, 1, 1, 1), 1),  # one channel, fewer pixels than lanes
    (1, 17, 7, 7, 5, 2, (2, 2, 2, 2), 1),
    (1, 9, 9, 11, 7, 1, (3, 3, 3, 3), 1),
    (1, 9, 13, 13, 7, 2, (3, 3, 3, 3), 1),
    (1, 18, 8, 8, 3, 3, (1, 1, 1, 1), 1),  # stride 3: generic kernel on channel blocks
    (1, 18, 9, 9, 3, 1, (2, 2, 2, 2), 2),  # dilated
    (1, 18, 9, 10, 2, 1, (0, 0, 1, 1), 1),  # even kernel
    (1, 16, 8, 7, 3, 2, (0, 2, 1, 0), 1),  # asymmetric pads, odd width
    (1, 17, 200, 9, 3, 1, (1, 1, 1, 1), 1),  # tall and narrow: bands of rows of channel blocks
    (1, 11, 32, 32, 3, 1, (1, 1, 1, 1), 1),  # a ring of rows (AVX2, AVX-512)
    (2, 19, 40, 37, 3, 1, (1, 1, 1, 1), 1),  # ring (AVX-512), batch 2, partial block
    (1, 19, 41, 39, 3, 2, (0, 1, 1, 0), 1),  # ring, stride 2, asymmetric pads
    (1, 17, 36, 36, 5, 1, (2, 2, 2, 2), 1),  # ring, 5x5
    (1, 17, 30, 34, 3, 1, (2, 2, 2, 2), 2),  # ring, dilated
    (1, 17, 40, 48, 3, 3, (1, 1, 1, 1), 1),  # ring, stride 3
    (1, 17, 54, 56, 3, 2, (1, 1, 1, 1), 1),  # ring, 28-pixel rows stored 4 at a time (AVX-512), 27 rows
    (2, 18, 33, 56, 3, 1, (1, 1, 1, 1), 1),  # ring, 56-pixel rows stored in pairs (AVX-512), 33 rows, batch 2
    (1, 17, 60, 31, 3, 2, (1, 1, 1, 1), 1),  # ring, stride 2, input rows transposed 4 at a time (AVX-512)
    (1, 17, 30, 28, 7, 1, (3, 3, 3, 3), 1),  # ring, 7x7, 28-pixel rows transposed 4 at a time (AVX-512)
    (1, 17, 30, 60, 7, 1, (3, 3, 3, 3), 1),  # ring, 7x7, 60-pixel rows one at a time (two would overflow the ring)
    (1, 16, 64, 64, 3, 1, (1, 1, 1, 1), 1),  # 16 KB planes: AVX-512 keeps the plane path (L1 set aliasing)
]


def _out_shape(case):
    n, c, h, w, k, s, (pt, pl, pb, pr), d = case
    return n, c, (h + pt + pb - (k - 1) * d - 1) // s + 1, (w + pl + pr - (k - 1) * d - 1) // s + 1


def _inputs(case, seed=0):
    n, c, h, w, k = case[:5]
    rng = np.random.default_rng(seed + hash(case) % 2**31)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((c, 1, k, k), dtype=np.float32)
    b = rng.standard_normal(c, dtype=np.float32)
    return x, wt, b


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_depthwise_kernel_matches_reference(case, every_isa, threads):
    x, wt, b = _inputs(case)
    _, _, _, _, k, s, pads, d = case
    y = np.full(_out_shape(case), np.nan, np.float32)  # every output must be written
    native.dwconv2d(x, wt, b, y, (k, k), (s, s), (d, d), pads[:2])
    ref = reference_depthwise(x, wt, b, (s, s), pads, (d, d))
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("act", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
@pytest.mark.parametrize(
    "case",
    [(1, 3, 13, 18, 3, 1, (1, 1, 1, 1), 1), (1, 3, 13, 18, 5, 2, (2, 2, 2, 2), 1), (1, 2, 9, 9, 3, 1, (2, 2, 2, 2), 2)],
    ids=["3x3s1", "5x5s2", "dilated"],
)
def test_depthwise_fused_activation(case, act, every_isa, threads):
    _, code, a0, a1, fn = act
    x, wt, b = _inputs(case, seed=1)
    x *= 4.0  # reach the clamps of clip / hardswish / hardsigmoid
    _, _, _, _, k, s, pads, d = case
    y = np.empty(_out_shape(case), np.float32)
    native.dwconv2d(x, wt, b, y, (k, k), (s, s), (d, d), pads[:2], code, a0, a1)
    ref = fn(reference_depthwise(x, wt, None if b is None else b, (s, s), pads, (d, d)))
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=1e-4)


@pytest.mark.parametrize("case", [(1, 2, 10, 20, 3, 2, (1, 1, 1, 1), 1), (1, 18, 13, 13, 3, 2, (1, 1, 1, 1), 1)],
                         ids=["planes", "blocks"])
def test_depthwise_no_bias_and_nan_propagates(case, every_isa):
    x, wt, _ = _inputs(case)
    x[0, 1, 4, 7] = np.nan
    y = np.empty(_out_shape(case), np.float32)
    native.dwconv2d(x, wt, None, y, (3, 3), (2, 2), (1, 1), (1, 1), 1)  # relu keeps NaN
    ref = np.maximum(reference_depthwise(x, wt, None, (2, 2), (1, 1, 1, 1), (1, 1)), 0.0)
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)
    assert np.isnan(y[0, 1]).sum() == np.isnan(ref[0, 1]).sum() > 0
    assert not np.isnan(np.delete(y, 1, axis=1)).any()  # a NaN in one channel stays in its lane


@pytest.mark.parametrize(
    "shape",
    [
        # (N, C, H, W, (kh, kw), (sh, sw), pads): rectangular kernels, a stride larger than the kernel
        (1, 17, 50, 70, (1, 3), (3, 3), (0, 0, 0, 0)),  # rows between the windows are never read
        (1, 17, 50, 70, (3, 1), (2, 3), (1, 0, 1, 0)),
        (2, 5, 7, 8, (1, 5), (1, 2), (0, 2, 0, 2)),
        (1, 9, 30, 30, (5, 3), (1, 1), (2, 1, 2, 1)),
    ],
)
def test_depthwise_rectangular_kernels(shape, every_isa, threads):
    n, c, h, w, k, st, pads = shape
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((c, 1) + k, dtype=np.float32)
    b = rng.standard_normal(c, dtype=np.float32)
    ref = reference_depthwise(x, wt, b, st, pads, (1, 1))
    y = np.full(ref.shape, np.nan, np.float32)
    native.dwconv2d(x, wt, b, y, k, st, (1, 1), pads[:2])
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("act", [a for a in ACTIVATIONS if a[0] in ("none", "relu", "hardswish", "sigmoid")],
                         ids=lambda a: a[0])
@pytest.mark.parametrize(
    "case",
    [
        (2, 19, 7, 7, 3, 1, (1, 1, 1, 1), 1),  # channel blocks, all rows at once
        (1, 19, 40, 37, 3, 2, (1, 1, 1, 1), 1),  # ring of rows (AVX-512), planes (AVX2, baseline)
        (1, 3, 40, 37, 5, 1, (2, 2, 2, 2), 1),
        (1, 5, 9, 9, 3, 1, (2, 2, 2, 2), 2),  # generic kernel
    ],
    ids=["blocks", "ring", "5x5", "dilated"],
)
def test_depthwise_fused_residual(case, act, every_isa, threads):
    """y = act(conv + bias + residual): the residual is added before the activation, on every path."""
    _, code, a0, a1, fn = act
    x, wt, b = _inputs(case, seed=2)
    _, _, _, _, k, s, pads, d = case
    z = np.random.default_rng(5).standard_normal(_out_shape(case), dtype=np.float32)
    y = np.full(_out_shape(case), np.nan, np.float32)
    native.dwconv2d(x, wt, b, y, (k, k), (s, s), (d, d), pads[:2], code, a0, a1, residual=z)
    ref = fn(reference_depthwise(x, wt, b, (s, s), pads, (d, d)) + z)
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=1e-4)


@pytest.mark.parametrize("multiplier", [2, 3])
def test_depth_multiplier_does_not_take_the_depthwise_path(multiplier, every_isa, threads):
    """group == C with M = multiplier * C is a grouped conv (GEMM path); it must still be right."""
    rng = np.random.default_rng(multiplier)
    c = 4
    x = rng.standard_normal((2, c, 9, 11), dtype=np.float32)
    wt = rng.standard_normal((c * multiplier, 1, 3, 3), dtype=np.float32)
    y = nn.conv(x, wt, None, group=c, pads=(1, 1, 1, 1), strides=(2, 2))
    xr = np.repeat(x, multiplier, axis=1)  # output channel o reads input channel o // multiplier
    ref = reference_depthwise(xr, wt, None, (2, 2), (1, 1, 1, 1), (1, 1))
    np.testing.assert_allclose(y, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("act", ["Relu", "HardSwish", "Clip"])
def test_depthwise_through_fused_conv(act, every_isa, threads):
    """nn.conv_fused_native's depthwise branch, with and without a residual."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 6, 15, 17), dtype=np.float32)
    wt = rng.standard_normal((6, 1, 5, 5), dtype=np.float32)
    b = rng.standard_normal(6, dtype=np.float32)
    z = rng.standard_normal((2, 6, 8, 9), dtype=np.float32)
    fns = {"Relu": (1, 0.0, 0.0, lambda v: np.maximum(v, 0)),
           "HardSwish": (7, 0.0, 0.0, lambda v: v * np.clip(v / 6 + 0.5, 0, 1)),
           "Clip": (2, 0.0, 6.0, lambda v: np.clip(v, 0, 6))}
    code, a0, a1, fn = fns[act]
    base = reference_depthwise(x, wt, b, (2, 2), (2, 2, 2, 2), (1, 1))
    for res in (None, z):
        y = nn._conv2d_native(x, wt, b, res, (8, 9), (5, 5), (2, 2), (1, 1), (2, 2), 6, code, a0, a1)
        ref = fn(base + (0 if res is None else res))
        np.testing.assert_allclose(y, ref, rtol=RTOL, atol=1e-4)


# MobileNet's stride-2 layers (spatial sizes as in the model, fewer channels, partial blocks) and the
# other kernels of the channel-blocked path: Relu / Clip are applied to its accumulators (dw_cb_clamp)
STRIDE2_AND_BLOCKED = [
    (2, 19, 112, 112, 3, 2, (1, 1, 1, 1), 1),  # ring of rows, batch 2, partial block
    (1, 32, 56, 56, 3, 2, (1, 1, 1, 1), 1),
    (1, 20, 28, 28, 3, 2, (1, 1, 1, 1), 1),  # bands of rows
    (2, 17, 14, 14, 3, 2, (1, 1, 1, 1), 1),  # whole planes (7x7 outputs)
    (1, 18, 29, 31, 3, 2, (0, 1, 1, 0), 1),  # odd sizes, asymmetric pads
    (1, 17, 36, 36, 5, 2, (2, 2, 2, 2), 1),
    (1, 18, 9, 9, 3, 1, (2, 2, 2, 2), 2),  # generic kernel (dilated)
    (1, 18, 8, 8, 3, 3, (1, 1, 1, 1), 1),  # generic kernel (stride 3)
]


# planes of 16 KB keep the plane path at the AVX-512 and AVX2 levels (their activation: dw_act_rows)
PLANE_PATH = [(1, 16, 64, 64, 3, 1, (1, 1, 1, 1), 1), (1, 16, 128, 128, 3, 2, (0, 0, 1, 1), 1)]


@pytest.mark.parametrize("case", STRIDE2_AND_BLOCKED + PLANE_PATH, ids=[str(c) for c in STRIDE2_AND_BLOCKED + PLANE_PATH])
def test_depthwise_relu_clip_equal_the_unfused_conv_then_the_activation(case, every_isa, threads):
    """Fused Relu / Clip give exactly max / clip of the unfused conv (the same sums), NaN kept, and
    match the float64 reference."""
    x, wt, b = _inputs(case, seed=4)
    x *= 3.0  # reach both bounds of the clip
    x[-1, -1, 5, 6] = np.nan
    _, _, _, _, k, s, pads, d = case
    plain = np.full(_out_shape(case), np.nan, np.float32)
    native.dwconv2d(x, wt, b, plain, (k, k), (s, s), (d, d), pads[:2])
    finite = ~np.isnan(plain)
    assert (~finite).any() and finite.any()
    ref = reference_depthwise(x, wt, b, (s, s), pads, (d, d))
    np.testing.assert_allclose(plain[finite], ref[finite], rtol=RTOL, atol=ATOL)
    for code, a0, a1, fn in ((1, 0.0, 0.0, lambda v: np.maximum(v, np.float32(0))),
                             (2, 0.0, 6.0, lambda v: np.clip(v, np.float32(0), np.float32(6))),
                             (2, -1.5, 0.5, lambda v: np.clip(v, np.float32(-1.5), np.float32(0.5)))):
        y = np.full(_out_shape(case), np.nan, np.float32)
        native.dwconv2d(x, wt, b, y, (k, k), (s, s), (d, d), pads[:2], code, a0, a1)
        np.testing.assert_array_equal(y, fn(plain))  # NaN where plain has NaN (assert_array_equal: NaN == NaN)


@pytest.mark.parametrize("case", [
    (1, 19, 112, 112, 3, 2, (1, 1, 1, 1), 1),  # ring of rows, rows a multiple of 16 pixels
    (1, 17, 56, 56, 3, 1, (1, 1, 1, 1), 1),  # ring, rows of 56 pixels
    (1, 33, 28, 29, 3, 2, (0, 1, 1, 0), 1),  # bands of rows, odd width
], ids=["ring112", "ring56", "bands"])
def test_depthwise_misaligned_input(case, every_isa, threads):
    """Planes that start at any float offset (the channel-blocked fill reads 4-float chunks and whole
    vectors unaligned) give the same floats as an aligned copy, and match the reference."""
    x, wt, b = _inputs(case, seed=6)
    _, _, _, _, k, s, pads, d = case
    aligned = np.full(_out_shape(case), np.nan, np.float32)
    native.dwconv2d(x, wt, b, aligned, (k, k), (s, s), (d, d), pads[:2], 2, 0.0, 6.0)
    np.testing.assert_allclose(aligned, np.clip(reference_depthwise(x, wt, b, (s, s), pads, (d, d)), 0, 6),
                               rtol=RTOL, atol=ATOL)
    for shift in (1, 3):
        buf = np.empty(x.size + shift, np.float32)
        shifted = buf[shift:].reshape(x.shape)
        shifted[...] = x
        y = np.full(_out_shape(case), np.nan, np.float32)
        native.dwconv2d(shifted, wt, b, y, (k, k), (s, s), (d, d), pads[:2], 2, 0.0, 6.0)
        np.testing.assert_array_equal(y, aligned)


# The direct stride-2 path (dw_use_direct_s2: 3x3, stride 2, one column of left padding, from one vector
# of output columns per row: 16 at the AVX-512 level, 8 at AVX2), which reads x in place: rows of
# vertical padding, the first and last vectors of a row, pairs of vectors that overlap, reads that pass
# the end of a row or reach the end of x.
DIRECT = [
    (1, 3, 112, 112, 3, 2, (1, 1, 1, 1), 1),  # 56 columns: vectors 0-31, then 32-47 and 40-55
    (2, 3, 57, 57, 3, 2, (1, 1, 1, 1), 1),  # odd width: the last vector's reads pass the row's end; batch 2
    (1, 2, 40, 33, 3, 2, (1, 1, 1, 1), 1),  # 17 columns: two overlapping vectors
    (1, 2, 15, 31, 3, 2, (1, 1, 1, 1), 1),  # 16 columns: one vector whose last tap is the right pad
    (1, 2, 30, 40, 3, 2, (0, 1, 2, 1), 1),  # no top pad, two rows of bottom pad
    (1, 2, 23, 35, 3, 2, (2, 1, 0, 0), 1),  # two rows of top pad, none at the bottom or right
    (1, 2, 36, 37, 3, 2, (1, 1, 1, 1), 1),  # 19 columns, the last one's right tap is the right pad
    (3, 2, 17, 64, 3, 2, (1, 1, 0, 0), 1),  # 32 columns: one pair, rows aligned; batch 3, no bottom pad
]


@pytest.mark.parametrize("act", [a for a in ACTIVATIONS if a[0] in ("none", "relu", "clip", "hardswish")],
                         ids=lambda a: a[0])
@pytest.mark.parametrize("case", DIRECT, ids=[str(c) for c in DIRECT])
def test_depthwise_direct_path_matches_reference(case, act, every_isa, threads):
    """Every output written and right, with Relu / Clip on the accumulators, another activation after the
    rows, and a residual."""
    _, code, a0, a1, fn = act
    x, wt, b = _inputs(case, seed=8)
    x *= 3.0  # reach the clamps
    _, _, _, _, k, s, pads, d = case
    ref = reference_depthwise(x, wt, b, (s, s), pads, (d, d))
    z = np.random.default_rng(9).standard_normal(ref.shape, dtype=np.float32)
    for res in (None, z):
        y = np.full(ref.shape, np.nan, np.float32)
        native.dwconv2d(x, wt, b, y, (k, k), (s, s), (d, d), pads[:2], code, a0, a1, residual=res)
        np.testing.assert_allclose(y, fn(ref + (0 if res is None else res)), rtol=RTOL, atol=1e-4)


@pytest.mark.parametrize("case", DIRECT + [(1, 1, 300, 90, 3, 2, (1, 1, 1, 1), 1)],
                         ids=[str(c) for c in DIRECT] + ["one plane in bands"])
def test_depthwise_direct_path_same_floats_at_any_thread_count(case, every_isa):
    """Threads split planes (or bands of rows of few planes); every output is the same float sum."""
    x, wt, b = _inputs(case, seed=10)
    x[0, -1, 3, 4] = np.nan  # stays in its own outputs
    _, _, _, _, k, s, pads, d = case
    before = native.threads()
    results = []
    try:
        for t in (1, 2, 3, 4):
            native.set_threads(t)
            y = np.full(_out_shape(case), np.nan, np.float32)
            native.dwconv2d(x, wt, b, y, (k, k), (s, s), (d, d), pads[:2], 2, 0.0, 6.0)
            results.append(y)
    finally:
        native.set_threads(before)
    for y in results[1:]:
        np.testing.assert_array_equal(y, results[0])
    finite = np.isfinite(results[0])
    ref = np.clip(reference_depthwise(x, wt, b, (s, s), pads, (d, d)), 0, 6)
    np.testing.assert_allclose(results[0][finite], ref[finite], rtol=RTOL, atol=ATOL)


def _next_to_a_guard_page(shape, at_end):
    """A float32 array that ends (at_end) or starts exactly at an inaccessible page: a read past its
    end or before its start faults.  None where mprotect is not available."""
    import ctypes
    import mmap

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mprotect = libc.mprotect
    except (OSError, AttributeError):
        return None
    mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    nbytes = int(np.prod(shape)) * 4
    span = -(-nbytes // page) * page
    buf = mmap.mmap(-1, span + 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    for guard in (base, base + page + span):
        if mprotect(guard, page, 0) != 0:
            return None
    offset = page + (span - nbytes if at_end else 0)
    arr = np.frombuffer(buf, np.float32, count=int(np.prod(shape)), offset=offset).reshape(shape)
    return arr


@pytest.mark.parametrize("at_end", [True, False], ids=["ends at a guard page", "starts at a guard page"])
@pytest.mark.parametrize("case", [DIRECT[1], DIRECT[3], DIRECT[6]], ids=["odd width", "16 columns", "19 columns"])
def test_depthwise_direct_path_reads_only_the_input(case, at_end, every_isa):
    """The last vectors of the last rows of the last plane do not read past x (nor the first before it)."""
    x, wt, b = _inputs(case, seed=11)
    guarded = _next_to_a_guard_page(x.shape, at_end)
    if guarded is None:
        pytest.skip("no mprotect")
    guarded[...] = x
    _, _, _, _, k, s, pads, d = case
    y = np.full(_out_shape(case), np.nan, np.float32)
    native.dwconv2d(guarded, wt, b, y, (k, k), (s, s), (d, d), pads[:2])
    np.testing.assert_allclose(y, reference_depthwise(x, wt, b, (s, s), pads, (d, d)), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", STRIDE2_AND_BLOCKED + DIRECT[:4] + [
    (1, 17, 56, 56, 3, 1, (1, 1, 1, 1), 1),  # ring of rows, stride 1
    (1, 17, 20, 20, 5, 1, (2, 2, 2, 2), 1),  # 5x5, whole planes
    (1, 17, 15, 15, 7, 1, (3, 3, 3, 3), 1),  # 7x7: HardSwish after the rows (dw_act_rows)
] + PLANE_PATH, ids=[str(c) for c in STRIDE2_AND_BLOCKED + DIRECT[:4]] + ["ring s1", "5x5", "7x7", "planes", "planes s2"])
def test_depthwise_hardswish_on_the_accumulators(case, every_isa, threads):
    """Fused HardSwish (on the accumulators of the channel-blocked and direct paths up to 5x5, in vectors
    over the stored rows elsewhere) is v * clip(v / 6 + 0.5, 0, 1) of the unfused conv, NaN kept."""
    x, wt, b = _inputs(case, seed=12)
    x *= 3.0  # both ends of the clip
    x[-1, -1, 3, 2] = np.nan
    _, _, _, _, k, s, pads, d = case
    plain = np.full(_out_shape(case), np.nan, np.float32)
    native.dwconv2d(x, wt, b, plain, (k, k), (s, s), (d, d), pads[:2])
    y = np.full(_out_shape(case), np.nan, np.float32)
    native.dwconv2d(x, wt, b, y, (k, k), (s, s), (d, d), pads[:2], 7)
    ref = plain * np.clip(plain / np.float32(6) + np.float32(0.5), 0, 1)
    assert np.isnan(ref).any()
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)  # NaN where ref has NaN
