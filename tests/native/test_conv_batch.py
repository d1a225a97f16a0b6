"""The whole-batch float convolution (mrt_conv2d_f32) against the numpy Conv path.

One native call runs im2col + GEMM + epilogue for every image of the batch, with
threads over images (or over the GEMM when there are fewer images than threads) and
the columns of several small images in one GEMM.  These cover the batch sizes that
take each of those routes, groups, strides, pads and dilations, the fused residual
and activations, on every ISA this CPU has.
"""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import nn
from tests.native.conftest import numpy_path
from tests.native.test_native_kernels import _np_act

pytestmark = pytest.mark.skipif(not native.available,
                                reason="native whole-batch conv not available")

GEOMETRIES = [
    # (C, M, H, W, k, stride, pads, dilation)
    (4, 6, 8, 8, 3, 1, (1, 1, 1, 1), 1),    # small plane: several images per GEMM
    (4, 6, 4, 4, 3, 1, (1, 1, 1, 1), 1),    # 4x4 (16 columns per image)
    (6, 8, 17, 19, 3, 2, (1, 0, 2, 1), 1),  # strided, asymmetric pads
    (4, 10, 18, 18, 3, 1, (1, 1, 1, 1), 1), # plane > 256 columns: one image per GEMM
    (4, 6, 12, 12, 3, 1, (2, 2, 2, 2), 2),  # dilated
    (6, 4, 9, 7, 1, 1, (0, 0, 0, 0), 1),    # 1x1: the input is the GEMM operand, one image per GEMM
    (6, 4, 3, 3, 1, 1, (0, 0, 0, 0), 1),    # 1x1 over 9 pixels (< MRT_CONV_DIRECT_MIN_PIXELS): images side by side
    (8, 20, 2, 24, 1, 1, (0, 0, 0, 0), 1),  # 1x1 over 2 x 24 (PP-OCR cls's 2 x 96 planes, narrower)
    (6, 4, 9, 7, 1, 2, (0, 0, 0, 0), 1),    # strided 1x1 (needs im2col)
    (2, 4, 7, 9, 5, 2, (2, 1, 0, 2), 1),    # 5x5
    # whole planes of <= 64 pixels with the input's size (AVX-512: one masked load per channel and tap)
    (4, 6, 8, 8, 5, 1, (2, 2, 2, 2), 1),    # 5x5 same
    (4, 6, 7, 7, 7, 1, (3, 3, 3, 3), 1),    # 7x7: 49 taps, the most it keeps
    (2, 4, 8, 8, 9, 1, (4, 4, 4, 4), 1),    # 9x9: 81 taps, the per-row im2col
    (4, 6, 6, 6, 3, 1, (2, 2, 2, 2), 2),    # dilated, same size
    (4, 6, 5, 7, 3, 1, (1, 1, 1, 1), 1),    # 35 pixels: a partial last vector
    (2, 4, 8, 8, 3, 1, (0, 2, 2, 0), 1),    # asymmetric pads, same size
]
ACTS = [("", ()), ("Relu", ()), ("Clip", (0.0, 6.0)), ("LeakyRelu", (0.1,)), ("Sigmoid", ()), ("SiLU", ()),
        ("HardSwish", ())]


def _case(geom, batch, group, residual, act, seed):
    c, m, h, w, k, s, pads, d = geom
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, c, h, w), dtype=np.float32) * 2
    wt = rng.standard_normal((m, c // group, k, k), dtype=np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    attrs = dict(group=group, pads=pads, strides=(s, s), dilations=(d, d))
    with numpy_path():
        conv = nn.conv(x, wt, b, **attrs)
    z = rng.standard_normal(conv.shape, dtype=np.float32) if residual else None
    return x, wt, b, z, attrs, conv


@pytest.mark.parametrize("geom", GEOMETRIES, ids=lambda g: "c{}m{}_{}x{}_k{}s{}d{}".format(*g[:6], g[7]))
@pytest.mark.parametrize("batch", [1, 3, 17])
@pytest.mark.parametrize("group", [1, 2])
def test_batch_conv_matches_numpy(geom, batch, group, every_isa, threads):
    i = GEOMETRIES.index(geom)
    residual = (i + batch + group) % 2 == 1
    act, params = ACTS[(i + batch + 3 * group) % len(ACTS)]
    x, wt, b, z, attrs, conv = _case(geom, batch, group, residual, act, seed=100 + i)
    expected = _np_act(conv.astype(np.float64) + (0 if z is None else z), act, params)
    got = nn.conv_fused_native(x, wt, b, z, activation=act, activation_params=params, **attrs)
    assert got is not None and got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("act,params", ACTS, ids=[a or "none" for a, _ in ACTS])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("batch", [1, 3, 17])
def test_batch_conv_epilogues(act, params, residual, batch, every_isa):
    x, wt, b, z, attrs, conv = _case(GEOMETRIES[0], batch, 2, residual, act, seed=7)
    expected = _np_act(conv.astype(np.float64) + (0 if z is None else z), act, params)
    got = nn.conv_fused_native(x, wt, b, z, activation=act, activation_params=params, **attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("geom", [GEOMETRIES[0], GEOMETRIES[3], GEOMETRIES[5]], ids=["8x8", "18x18", "1x1"])
@pytest.mark.parametrize("batch", [1, 3, 17])
def test_batch_conv_equals_per_image_loop(geom, batch, every_isa, threads):
    """Same accumulation order as one im2col and one GEMM per image (mrt_im2col_f32 + mrt_sgemm_f32,
    the epilogue fused): bit-identical."""
    x, wt, b, z, attrs, conv = _case(geom, batch, 1, True, "Relu", seed=11)
    got = nn.conv_fused_native(x, wt, b, z, activation="Relu", **attrs)
    np.testing.assert_array_equal(got, _per_image_loop(x, wt, b, z, attrs, conv.shape[2:]))


def _per_image_loop(x, wt, b, z, attrs, out):
    """act(conv + b + z) (Relu, one group) as one native im2col and one native GEMM per image."""
    n, c, h, w = x.shape
    m, k = wt.shape[0], wt.shape[2:]
    p = out[0] * out[1]
    relu = native.ACTIVATION_CODES["Relu"]
    y = np.empty((n, m) + tuple(out), np.float32)
    cols = np.empty((c * k[0] * k[1], p), np.float32)
    for i in range(n):
        native.im2col(x[i], cols, k, attrs["strides"], attrs["dilations"], attrs["pads"][:2], out)
        native.sgemm(wt.reshape(m, -1), cols, y[i].reshape(m, p), b, 1, z[i].reshape(m, p), relu)
    return y


def test_plain_conv_uses_batch_path_without_bias(every_isa):
    x, wt, _, _, attrs, _ = _case(GEOMETRIES[1], 5, 1, False, "", seed=3)
    got = nn.conv(x, wt, None, **attrs)
    with numpy_path():
        expected = nn.conv(x, wt, None, **attrs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)
