"""Pair-limited int8 weights (the builder's weights for AVX2 targets, D172: every pair a packed row holds side
by side has |w0| + |w1| <= 128): the packed matrix says so, and every int8 route (GEMM, matrix-vector,
QMatMul, the convolution routes, ConvTranspose) stays exact on every ISA, including the extremes where a
pair of u8 x s8 products comes closest to int16's limits (255 x 128 = 32640).  On AVX2 without VNNI these
take the vpmaddubsw tile (q_avx2_pairs16_tile); one pair over the limit sends the same shapes back to the
widening tile, as does a conv whose tap order (channels 2i, 2i + 1 of a tap) breaks the bound."""
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


def _weights(rng, shape):
    """Pair-limited int8 weights over the full range, as the builder makes them (conv shapes in both orders
    the kernels read), with pairs at the bound and single values at -128 / 127."""
    w = rng.integers(-127, 128, shape, dtype=np.int8)
    flat = w.reshape(shape[0], -1)
    flat[:, 0] = -128 if flat.shape[1] % 2 else flat[:, 0]
    if flat.shape[1] >= 4:
        flat[:, 2:4] = [100, -28]  # a pair exactly at the bound
    return limit_conv_pair_sums(w, 1) if w.ndim == 4 else limit_pair_sums(w, 1)


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
def test_qgemm_with_pair_limited_weights_is_exact(m, k, n, x_zero, every_isa, threads):
    rng = np.random.default_rng(m * 1000 + k + n + x_zero)
    w = _weights(rng, (m, k))
    x = rng.integers(0, 256, (k, n), dtype=np.uint8)
    x[:, :3] = 255  # the largest pair sums: 255 x +-64 twice
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
def test_qconv_with_pair_limited_weights_is_the_exact_integer_conv(xs, ws, strides, pads, group, every_isa, threads):
    """u8 input at the extremes of its range; with unit scales and no bias the float output is the exact
    integer sums (float32 holds them exactly), so native and numpy agree bit for bit; a pair over the bound
    (the widening route) gives the same sums; the u8 output is the float output requantized."""
    rng = np.random.default_rng(sum(xs) + sum(ws))
    w = _weights(rng, ws)
    xq = rng.integers(0, 256, xs, dtype=np.uint8)
    xq.reshape(-1)[::7] = 255
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
def test_qconv_transpose_with_pair_limited_weights_is_exact(n, c, m, h, wd, k, every_isa):
    rng = np.random.default_rng(c + m)
    x = rng.integers(0, 256, (n, c, h, wd), dtype=np.uint8)
    x[..., 0] = 255
    w = _weights(rng, (m * k[0] * k[1], c))
    packed = native.qpack(w)
    y = np.empty((n, m, h * k[0], wd * k[1]), np.float32)
    ones = np.ones(m * k[0] * k[1], np.float32)
    native.qconvtranspose_tiles(x, 9, packed, m, k, ones, None, y)
    sums = np.einsum("rc,nchw->nrhw", w.astype(np.int64), x.astype(np.int64) - 9)  # r = (m*kh + t)*kw + u
    ref = sums.reshape(n, m, k[0], k[1], h, wd).transpose(0, 1, 4, 2, 5, 3).reshape(y.shape)
    np.testing.assert_array_equal(y, ref.astype(np.float32))
