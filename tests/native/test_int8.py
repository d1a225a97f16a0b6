"""Native int8 GEMM (u8 x s8 -> s32, float epilogue) against exact numpy integer math and the numpy QConv/QMatMul."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import qlinear

from .conftest import numpy_path, requires_native

pytestmark = requires_native


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 33), (6, 4, 32), (13, 27, 1000), (64, 576, 300), (5, 700, 40)])
def test_qgemm_is_exact(m, k, n, every_isa, threads):
    rng = np.random.default_rng(m * 1000 + k + n)
    w = rng.integers(-128, 128, (m, k), dtype=np.int8)  # full int8 range: no saturation anywhere
    x = rng.integers(0, 256, (k, n), dtype=np.uint8)
    x[:, :3] = 255
    w[:, :2] = -128
    scale = np.ones(m, np.float32)
    c = np.empty((m, n), np.float32)
    native.qgemm(native.qpack(w), m, k, x, 7, scale, c)
    ref = w.astype(np.int64) @ (x.astype(np.int64) - 7)
    np.testing.assert_array_equal(c, ref.astype(np.float32))


@pytest.mark.parametrize("x_zero", [0, 127, 128, 255])
def test_qgemm_zero_points_exact(x_zero, every_isa):
    """Every zero point is exact (the SDOT path shifts the activations by 128 and corrects
    with the weight row sums)."""
    rng = np.random.default_rng(x_zero)
    m, k, n = 17, 131, 70
    w = rng.integers(-128, 128, (m, k), dtype=np.int8)
    x = rng.integers(0, 256, (k, n), dtype=np.uint8)
    c = np.empty((m, n), np.float32)
    native.qgemm(native.qpack(w), m, k, x, x_zero, np.ones(m, np.float32), c)
    ref = w.astype(np.int64) @ (x.astype(np.int64) - x_zero)
    np.testing.assert_array_equal(c, ref.astype(np.float32))


def test_qgemm_epilogue(every_isa):
    rng = np.random.default_rng(1)
    m, k, n = 10, 20, 50
    w = rng.integers(-127, 128, (m, k), dtype=np.int8)
    x = rng.integers(0, 256, (k, n), dtype=np.uint8)
    scale = rng.random(m, dtype=np.float32) * 0.01
    bias = rng.standard_normal(m, dtype=np.float32)
    res = rng.standard_normal((m, n), dtype=np.float32)
    c = np.empty((m, n), np.float32)
    native.qgemm(native.qpack(w), m, k, x, 128, scale, c, bias, res, native.ACT_CLIP, -0.5, 0.5)
    ref = scale[:, None] * (w.astype(np.float64) @ (x.astype(np.float64) - 128)) + bias[:, None] + res
    np.testing.assert_allclose(c, np.clip(ref, -0.5, 0.5), rtol=1e-5, atol=1e-5)


def test_quantize_u8_matches_numpy(isa):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(1001) * 5).astype(np.float32)
    x[:4] = [0.5, 1.5, -0.5, 1e9]
    q = np.empty(x.shape, np.uint8)
    native.quantize_u8(x, q, 0.5, 100)
    ref = np.clip(np.rint(x / np.float32(0.5)) + 100, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(q, ref)


@pytest.mark.parametrize("xs,ws,strides,pads,group,act,params", [
    ((1, 16, 20, 20), (32, 16, 3, 3), (1, 1), (1, 1, 1, 1), 1, "Relu", ()),
    ((2, 32, 9, 9), (64, 32, 1, 1), (1, 1), (0, 0, 0, 0), 1, "", ()),
    ((1, 8, 17, 13), (12, 4, 3, 3), (2, 2), (1, 0, 1, 2), 2, "Clip", (0.0, 6.0)),
    ((1, 6, 11, 11), (6, 6, 5, 5), (1, 2), (2, 2, 2, 2), 1, "HardSwish", ()),
])
@pytest.mark.parametrize("quant", ["u8", "s8", "dynamic"])
def test_qconv_native_matches_numpy(xs, ws, strides, pads, group, act, params, quant, every_isa):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.integers(-127, 128, ws, dtype=np.int8)
    wsc = rng.random(ws[0], dtype=np.float32) * 0.01 + 0.001
    b = rng.standard_normal(ws[0], dtype=np.float32)
    xsc, xzp = {"u8": (np.float32(0.02), np.uint8(128)), "s8": (np.float32(0.03), np.int8(-3)),
                "dynamic": (None, None)}[quant]
    kw = dict(strides=strides, pads=pads, group=group, activation=act, activation_params=params)
    y = qlinear.qconv(x, xsc, xzp, w, wsc, b, **kw)
    with numpy_path():
        ref = qlinear.qconv(x, xsc, xzp, w, wsc, b, **kw)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.parametrize("transB", [0, 1])
def test_qmatmul_native_matches_numpy(transB, every_isa):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 10, 96), dtype=np.float32)
    b = rng.integers(-127, 128, (40, 96) if transB else (96, 40), dtype=np.int8)
    bs = rng.random(40, dtype=np.float32) * 0.01
    bias = rng.standard_normal(40, dtype=np.float32)
    y = qlinear.qmatmul(a, np.float32(0.02), np.uint8(128), b, bs, bias, transB=transB, activation="Relu")
    with numpy_path():
        ref = qlinear.qmatmul(a, np.float32(0.02), np.uint8(128), b, bs, bias, transB=transB, activation="Relu")
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.parametrize("m,k,n,bias_mode", [(64, 32, 1000, 1), (7, 5, 33, 2), (13, 300, 17, 1), (1, 0, 5, 1)])
def test_sgemm_matches_numpy(m, k, n, bias_mode, isa, threads):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(m if bias_mode == 1 else n, dtype=np.float32)
    res = rng.standard_normal((m, n), dtype=np.float32)
    c = np.empty((m, n), np.float32)
    native.sgemm(a, b, c, bias, bias_mode, res, native.ACT_RELU)
    ref = a.astype(np.float64) @ b + (bias[:, None] if bias_mode == 1 else bias[None, :]) + res
    np.testing.assert_allclose(c, np.maximum(ref, 0), rtol=1e-4, atol=1e-4)
