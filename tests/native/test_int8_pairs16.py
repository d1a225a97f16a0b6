"""The three kinds of int8 weights the AVX2 kernels tell apart (D172), exact on every ISA and every int8 route
(GEMM, matrix-vector, QMatMul, the convolution routes, ConvTranspose), including the extremes where a pair of
u8 x s8 products comes closest to int16's limits:
  - pair-limited (the builder's weights for AVX2 targets: every pair a packed row holds side by side has
    |w0| + |w1| <= 128, 255 x 128 = 32640): the vpmaddubsw tile (q_avx2_pairs16_tile);
  - symmetric, [-127, 127] (every quantizer's weights): the centred-activation tile (q_avx2_sign_tile);
  - with -128: the int16 widening tile (q_avx2_tile).
A conv whose tap order (channels 2i, 2i + 1 of a tap) breaks the pair bound leaves the pair tile too."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.builder.quantize.weights import limit_conv_pair_sums, limit_pair_sums
from minirt.kernels import qlinear

from .conftest import INT8_ISAS, numpy_path, requires_native, run_on_level

pytestmark = requires_native


@pytest.fixture(params=INT8_ISAS)
def every_isa(request):
    yield from run_on_level(request)


WEIGHTS = ["pair-limited", "symmetric", "with -128"]


def _weights(rng, shape, kind="pair-limited"):
    """int8 weights over the full range: pair-limited as the builder makes them for AVX2 targets (conv shapes
    in both orders the kernels read, pairs at the bound, a lone -128 where a row is odd), symmetric
    ([-127, 127], pairs of +-127), or with -128 in every row."""
    w = rng.integers(-127, 128, shape, dtype=np.int8)
    flat = w.reshape(shape[0], -1)
    if kind == "pair-limited":
        flat[:, 0] = -128 if flat.shape[1] % 2 else flat[:, 0]
        if flat.shape[1] >= 4:
            flat[:, 2:4] = [100, -28]  # a pair exactly at the bound
        return limit_conv_pair_sums(w, 1) if w.ndim == 4 else limit_pair_sums(w, 1)
    extremes = [127, -127] if kind == "symmetric" else [-128, 127]
    flat[:, :2] = extremes[:min(2, flat.shape[1])]
    return w


@pytest.mark.parametrize("pair,expected", [((100, 28), True), ((-128, 0), True), ((64, -64), True),
                                           ((100, 29), False), ((-127, 127), False)])
def test_the_packed_matrix_says_whether_its_pairs_fit_int16_products(pair, expected):
    rng = np.random.default_rng(1)
    w = limit_pair_sums(rng.integers(-127, 128, (9, 37), dtype=np.int8), 1)
    assert native.qpacked_pairs16(native.qpack(w), 9, 37)
    w[3, 10:12] = pair
    assert native.qpacked_pairs16(native.qpack(w), 9, 37) is expected
    w[3, 10:14] = (0, 127, 127, 0)  # (11 and 12 are in different pairs: fine)
    assert native.qpacked_pairs16(native.qpack(w), 9, 37)
    w[5, 36] = -128  # (the odd last value pairs with the zero padding)
    assert native.qpacked_pairs16(native.qpack(w), 9, 37)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 33), (6, 4, 32), (13, 27, 1000), (64, 576, 300),
                                   (5, 700, 40), (9, 700, 1), (32, 288, 16)])
@pytest.mark.parametrize("x_zero", [0, 128, 255])
@pytest.mark.parametrize("kind", WEIGHTS)
def test_qgemm_is_exact_for_every_kind_of_weights(m, k, n, x_zero, kind, every_isa, threads):
    rng = np.random.default_rng(m * 1000 + k + n + x_zero)
    w = _weights(rng, (m, k), kind)
    x = rng.integers(0, 256, (k, n), dtype=np.uint8)
    x[:, :3] = 255  # the largest pair sums
    x[:, 3:5] = 0
    c = np.empty((m, n), np.float32)
    native.qgemm(native.qpack(w), m, k, x, x_zero, np.ones(m, np.float32), c)
    ref = w.astype(np.int64) @ (x.astype(np.int64) - x_zero)
    np.testing.assert_array_equal(c, ref.astype(np.float32))


@pytest.mark.parametrize("rows,k,n", [(1, 64, 40), (7, 130, 33), (50, 256, 96)])
def test_static_qmatmul_with_pair_limited_weights_matches_numpy(rows, k, n, every_isa):
    """Integer-valued inputs with unit scales: the products are exact in float32, native and numpy alike."""
    rng = np.random.default_rng(rows + k)
    a = rng.integers(0, 256, (rows, k)).astype(np.float32)
    a[:, :5] = 255
    b = _weights(rng, (n, k)).T  # (K, N) int8 whose columns are the weight rows
    b_scale = np.ones(n, np.float32)
    y = qlinear.qmatmul(a, np.float32(1), np.uint8(0), b, b_scale)
    with numpy_path():
        ref = qlinear.qmatmul(a, np.float32(1), np.uint8(0), b, b_scale)
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_array_equal(y, (a.astype(np.int64) @ b.astype(np.int64)).astype(np.float32))


@pytest.mark.parametrize("xs,ws,strides,pads,group", [
    ((1, 16, 20, 20), (32, 16, 3, 3), (1, 1), (1, 1, 1, 1), 1),   # implicit route, 3x3
    ((1, 24, 40, 40), (40, 24, 1, 1), (1, 1), (0, 0, 0, 0), 1),   # implicit 1x1 over a wide plane
    ((1, 8, 30, 30), (20, 8, 3, 3), (2, 2), (1, 1, 1, 1), 1),     # implicit, stride 2 phases
    ((2, 32, 9, 9), (64, 32, 1, 1), (1, 1), (0, 0, 0, 0), 1),     # images side by side
    ((1, 8, 17, 13), (12, 4, 3, 3), (2, 2), (1, 0, 1, 2), 2),     # groups, im2col
    ((3, 32, 4, 4), (32, 32, 3, 3), (1, 1), (1, 1, 1, 1), 1),     # small planes into panels
    ((1, 3, 32, 32), (24, 3, 3, 3), (2, 2), (1, 1, 1, 1), 1),     # a stem
])
@pytest.mark.parametrize("kind", WEIGHTS)
def test_qconv_is_the_exact_integer_conv_for_every_kind_of_weights(xs, ws, strides, pads, group, kind, every_isa,
                                                                    threads):
    """u8 input at the extremes of its range; with unit scales and no bias the float output is the exact
    integer sums (float32 holds them exactly), so native and numpy agree bit for bit; a pair over the bound
    (the widening route) gives the same sums; the u8 output is the float output requantized."""
    rng = np.random.default_rng(sum(xs) + sum(ws))
    w = _weights(rng, ws, kind)
    xq = rng.integers(0, 256, xs, dtype=np.uint8)
    xq.reshape(-1)[::7] = 255
    xq.reshape(-1)[3::7] = 0
    unit, zero = np.ones(ws[0], np.float32), np.zeros(ws[0], np.float32)
    xzp = np.uint8(100)
    kw = dict(strides=strides, pads=pads, group=group)
    y = qlinear.qconv(xq, np.float32(1), xzp, w, unit, zero, **kw)
    with numpy_path():
        ref = qlinear.qconv(xq, np.float32(1), xzp, w, unit, zero, **kw)
    np.testing.assert_array_equal(y, ref)
    w_wide = w.copy()
    w_wide.reshape(ws[0], -1)[:, 0:2] = 127  # (a pair over the bound: the widening route)
    y_wide = qlinear.qconv(xq, np.float32(1), xzp, w_wide, unit, zero, **kw)
    with numpy_path():
        ref_wide = qlinear.qconv(xq, np.float32(1), xzp, w_wide, unit, zero, **kw)
    np.testing.assert_array_equal(y_wide, ref_wide)
    wsc = rng.random(ws[0], dtype=np.float32) * 0.01 + 0.001
    b = rng.standard_normal(ws[0], dtype=np.float32)
    xsc = np.float32(0.02)
    y = qlinear.qconv(xq, xsc, xzp, w, wsc, b, **kw)
    out = dict(output_scale=float(np.abs(y).max()) / 200, output_zero_point=37)
    yq = qlinear.qconv(xq, xsc, xzp, w, wsc, b, **kw, **out)
    np.testing.assert_array_equal(yq, qlinear.requantize_u8(y, out["output_scale"], 37))


@pytest.mark.parametrize("n,c,m,h,wd,k", [(1, 16, 8, 5, 7, (2, 2)), (2, 40, 3, 4, 4, (2, 2))])
@pytest.mark.parametrize("kind", WEIGHTS)
def test_qconv_transpose_is_exact_for_every_kind_of_weights(n, c, m, h, wd, k, kind, every_isa):
    rng = np.random.default_rng(c + m)
    x = rng.integers(0, 256, (n, c, h, wd), dtype=np.uint8)
    x[..., 0] = 255
    w = _weights(rng, (m * k[0] * k[1], c), kind)
    packed = native.qpack(w)
    y = np.empty((n, m, h * k[0], wd * k[1]), np.float32)
    ones = np.ones(m * k[0] * k[1], np.float32)
    native.qconvtranspose_tiles(x, 9, packed, m, k, ones, None, y)
    sums = np.einsum("rc,nchw->nrhw", w.astype(np.int64), x.astype(np.int64) - 9)  # r = (m*kh + t)*kw + u
    ref = sums.reshape(n, m, k[0], k[1], h, wd).transpose(0, 1, 4, 2, 5, 3).reshape(y.shape)
    np.testing.assert_array_equal(y, ref.astype(np.float32))
