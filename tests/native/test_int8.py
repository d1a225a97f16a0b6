"""Native int8 GEMM (u8 x s8 -> s32, float epilogue) against exact numpy integer math and the numpy QConv/QMatMul."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import qlinear

from .conftest import INT8_ISAS, numpy_path, requires_native, run_on_level

pytestmark = requires_native


@pytest.fixture(params=INT8_ISAS)
def every_isa(request):
    """Each test runs on every int8 GEMM level this CPU can run (on an AMX machine, with and without AMX)."""
    yield from run_on_level(request)


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
    native.qgemm(native.qpack(w), m, k, x, 128, scale, c, bias, res, native.ACTIVATION_CODES["Clip"], -0.5, 0.5)
    ref = scale[:, None] * (w.astype(np.float64) @ (x.astype(np.float64) - 128)) + bias[:, None] + res
    np.testing.assert_allclose(c, np.clip(ref, -0.5, 0.5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 63, 1), (70, 64, 1), (130, 65, 1), (9, 700, 1), (13, 200, 2),
                                   (7, 9, 16), (32, 288, 16), (6, 5, 17), (11, 131, 9)])
@pytest.mark.parametrize("x_zero", [0, 128, 255])
def test_qgemm_narrow_exact(m, k, n, x_zero, every_isa, threads):
    """N <= 16 (16-column panels on VNNI) and N == 1 (the matrix-vector path): exact for the full ranges."""
    rng = np.random.default_rng(m * 100 + k + n + x_zero)
    w = rng.integers(-128, 128, (m, k), dtype=np.int8)
    x = rng.integers(0, 256, (k, n), dtype=np.uint8)
    x[: k // 2 + 1, 0] = 255
    w[:, : k // 2 + 1] = -128
    c = np.empty((m, n), np.float32)
    native.qgemm(native.qpack(w), m, k, x, x_zero, np.ones(m, np.float32), c)
    ref = w.astype(np.int64) @ (x.astype(np.int64) - x_zero)
    np.testing.assert_array_equal(c, ref.astype(np.float32))


@pytest.mark.parametrize("n", [1, 9])
def test_qgemm_narrow_epilogue(n, every_isa):
    """Bias, residual and activation on narrow GEMMs (16-column panels, matrix-vector path)."""
    rng = np.random.default_rng(n)
    m, k = 70, 100
    w = rng.integers(-127, 128, (m, k), dtype=np.int8)
    x = rng.integers(0, 256, (k, n), dtype=np.uint8)
    scale = rng.random(m, dtype=np.float32) * 0.01
    bias = rng.standard_normal(m, dtype=np.float32)
    res = rng.standard_normal((m, n), dtype=np.float32)
    c = np.empty((m, n), np.float32)
    native.qgemm(native.qpack(w), m, k, x, 3, scale, c, bias, res, native.ACTIVATION_CODES["Clip"], -0.5, 0.5)
    ref = scale[:, None] * (w.astype(np.float64) @ (x.astype(np.float64) - 3)) + bias[:, None] + res
    np.testing.assert_allclose(c, np.clip(ref, -0.5, 0.5), rtol=1e-5, atol=1e-5)


def _im2col_ref(x, k, s, d, pb, out, pad):
    c, h, wd = x.shape
    xp = np.full((c, h + 2 * k[0] * d[0] + 2 * pb[0], wd + 2 * k[1] * d[1] + 2 * pb[1] + 2 * out[1] * s[1]), pad,
                 np.uint8)
    xp[:, pb[0]:pb[0] + h, pb[1]:pb[1] + wd] = x
    cols = np.empty((c, k[0], k[1], out[0], out[1]), np.uint8)
    for ky in range(k[0]):
        for kx in range(k[1]):
            y0, x0 = ky * d[0], kx * d[1]
            cols[:, ky, kx] = xp[:, y0:y0 + s[0] * out[0]:s[0], x0:x0 + s[1] * out[1]:s[1]][:, :out[0], :out[1]]
    return cols.reshape(c * k[0] * k[1], out[0] * out[1])


@pytest.mark.parametrize("c,h,wd,k,s,d,pb", [
    (3, 4, 4, (3, 3), (1, 1), (1, 1), (1, 1)), (2, 8, 8, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 5, 63, (3, 3), (1, 1), (1, 1), (1, 1)), (2, 5, 64, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 6, 7, (5, 3), (1, 1), (2, 2), (3, 0)), (1, 3, 2, (3, 3), (1, 1), (1, 1), (2, 2)),
    (2, 9, 9, (3, 3), (2, 2), (1, 1), (1, 1)), (2, 6, 40, (1, 3), (2, 1), (1, 3), (0, 4)),
    # stride 2 over rows of > 32 columns: the vector even-byte gather, its tail and the padded edges
    (3, 9, 77, (3, 3), (2, 2), (1, 1), (1, 1)), (1, 4, 70, (1, 1), (2, 2), (1, 1), (0, 0)),
    (2, 3, 66, (3, 3), (2, 2), (1, 1), (1, 1)), (2, 7, 90, (3, 3), (2, 2), (2, 2), (2, 2)),
    (1, 5, 321, (3, 3), (2, 2), (1, 1), (1, 1)),
    # stride 2 over rows of <= 32 output columns: one masked load of the span, its even bytes (D147)
    (3, 28, 28, (3, 3), (2, 2), (1, 1), (1, 1)), (2, 13, 63, (3, 3), (2, 2), (1, 1), (1, 1)),
    (2, 6, 64, (3, 3), (2, 2), (1, 1), (1, 1)), (2, 7, 30, (5, 5), (2, 2), (2, 2), (4, 4)),
    (1, 5, 3, (3, 3), (2, 2), (1, 1), (2, 2)), (2, 6, 20, (3, 1), (1, 2), (1, 1), (1, 0)),
    # whole planes of <= 64 pixels with the output the size of the input (one load per row)
    (2, 1, 64, (1, 3), (1, 1), (1, 1), (0, 1)), (3, 8, 8, (5, 5), (1, 1), (1, 1), (2, 2)),
    (2, 6, 6, (3, 3), (1, 1), (2, 2), (2, 2)), (1, 4, 4, (7, 7), (1, 1), (1, 1), (3, 3)),
    (2, 7, 9, (3, 3), (1, 1), (1, 1), (1, 1)), (2, 5, 5, (1, 1), (1, 1), (1, 1), (0, 0)),
    (4, 2, 2, (3, 3), (1, 1), (1, 1), (1, 1)), (2, 8, 8, (9, 9), (1, 1), (1, 1), (4, 4)),
])
def test_im2col_u8_small_images(c, h, wd, k, s, d, pb, every_isa):
    """The whole-plane im2col (<= 64 pixels, output the input's size), the narrow one (rows of <= 63
    columns at stride 1), the stride-2 one and the general one agree with numpy, padding (both sides),
    dilation and windows entirely outside the image included."""
    rng = np.random.default_rng(h * wd)
    x = rng.integers(0, 256, (c, h, wd), dtype=np.uint8)
    out = tuple((n + 2 * p - dd * (kk - 1) - 1) // ss + 1 for n, p, dd, kk, ss in zip((h, wd), pb, d, k, s))
    cols = np.empty((c * k[0] * k[1], out[0] * out[1]), np.uint8)
    native.im2col_u8(x, cols, k, s, d, pb, out, 77)
    np.testing.assert_array_equal(cols, _im2col_ref(x, k, s, d, pb, out, 77))


def test_qmatmul_one_row_matches_numpy(every_isa):
    """A batch-1 QMatMul (one row: the matrix-vector path)."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((1, 515), dtype=np.float32)
    b = rng.integers(-127, 128, (70, 515), dtype=np.int8)
    bs = rng.random(70, dtype=np.float32) * 0.01
    bias = rng.standard_normal(70, dtype=np.float32)
    y = qlinear.qmatmul(a, np.float32(0.02), np.uint8(100), b, bs, bias, transB=1, activation="Relu")
    with numpy_path():
        ref = qlinear.qmatmul(a, np.float32(0.02), np.uint8(100), b, bs, bias, transB=1, activation="Relu")
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.parametrize("rows,k,n", [(2, 1, 1), (3, 5, 10), (33, 37, 70), (360, 512, 64), (17, 515, 33),
                                      (40, 8, 16), (5, 131, 200)])
@pytest.mark.parametrize("x_zero", [0, 128, 255])
def test_qmatmul_rows_exact(rows, k, n, x_zero, every_isa, threads):
    """QMatMul of several rows (the activations quantized row by row and read by the GEMM as its
    columns, q_pack_xt) against integer numpy: quantize, (xq - x_zero) @ W^T, exactly.  K not a
    multiple of 4 exercises the padded rows; values outside the uint8 range saturate."""
    rng = np.random.default_rng(rows * 1000 + k + n + x_zero)
    x_scale = np.float32(0.125)  # a power of two: a / x_scale is exact, so the integers are known
    q_raw = rng.integers(-20, 276, (rows, k))
    a = ((q_raw - x_zero) * x_scale).astype(np.float32)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    y = np.empty((rows, n), np.float32)
    native.qmatmul(a, float(x_scale), x_zero, native.qpack(w), n, np.ones(n, np.float32), None, y)
    xq = np.clip(q_raw, 0, 255)
    ref = (xq - x_zero) @ w.astype(np.int64).T
    np.testing.assert_array_equal(y, ref.astype(np.float32))


@pytest.mark.parametrize("scale", [0.5, 0.02, 1 / 255, 3.7e-3, 0.1234567, 1e-40, 1e30, 3e38])
def test_quantize_u8_is_exactly_the_division(scale, every_isa):
    """quantize_u8 rounds x / scale as the division does (round half to even), including where a
    multiplication by 1 / scale would round the other way (D145): x on and one or two ulps around
    every half-integer multiple of the scale, random values, zeros, NaN, +-inf, huge values; a
    subnormal or huge scale (whose reciprocal is inf or subnormal)."""
    s = np.float32(scale)
    half = (np.arange(-300, 300, dtype=np.float64) + 0.5)
    with np.errstate(over="ignore"):  # (a huge scale's multiples overflow float32: +-inf, tested too)
        base = (half * np.float64(s)).astype(np.float32)
    near = [base]
    for steps in (1, 2):
        up, down = base.copy(), base.copy()
        for _ in range(steps):
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        near += [up, down]
    rng = np.random.default_rng(9)
    with np.errstate(over="ignore"):
        spread = (rng.standard_normal(4096) * 100 * np.float64(s)).astype(np.float32)
    x = np.concatenate(near + [spread, np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-45], np.float32)])
    for zp in (0, 128, 255):
        q = np.empty(x.shape, np.uint8)
        native.quantize_u8(x, q, float(s), zp)
        with np.errstate(all="ignore"):
            t = np.divide(x, s)
        t = np.where(np.isnan(t), np.float32(-zp), t)  # (NaN -> the lowest code, as the kernel)
        ref = (np.rint(np.clip(t, np.float32(-zp), np.float32(255 - zp))) + zp).astype(np.uint8)
        np.testing.assert_array_equal(q, ref)


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
    ((4, 32, 3, 3), (64, 32, 1, 1), (1, 1), (0, 0, 0, 0), 1, "", ()),  # 9 pixels: images side by side
    ((1, 8, 17, 13), (12, 4, 3, 3), (2, 2), (1, 0, 1, 2), 2, "Clip", (0.0, 6.0)),
    ((1, 6, 11, 11), (6, 6, 5, 5), (1, 2), (2, 2, 2, 2), 1, "HardSwish", ()),
    ((1, 32, 4, 4), (32, 32, 3, 3), (1, 1), (1, 1, 1, 1), 1, "Relu", ()),  # digits-like: N = 16
    ((1, 1, 8, 8), (16, 1, 3, 3), (1, 1), (1, 1, 1, 1), 1, "Relu", ()),
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


@pytest.mark.parametrize("pool", [(), (2, 2)])
@pytest.mark.parametrize("xs,ws,strides,pads,group", [
    ((1, 16, 20, 20), (32, 16, 3, 3), (1, 1), (1, 1, 1, 1), 1),  # implicit route (VNNI)
    ((2, 32, 9, 9), (64, 32, 1, 1), (1, 1), (0, 0, 0, 0), 1),    # 1x1, one GEMM per image
    ((4, 32, 3, 3), (64, 32, 1, 1), (1, 1), (0, 0, 0, 0), 1),    # 1x1 over 9 pixels, images side by side
    ((1, 8, 17, 13), (12, 4, 3, 3), (2, 2), (1, 0, 1, 2), 2),    # groups, im2col
    ((1, 3, 32, 32), (24, 3, 4, 4), (4, 4), (0, 0, 0, 0), 1),    # a patch embedding
])
def test_dynamic_qconv_is_the_static_call_with_the_inputs_own_parameters(xs, ws, strides, pads, group, pool,
                                                                         every_isa, threads):
    """A dynamic QConv's native call quantizes its input by the input's own range (D146): bit for bit
    the static call with _dynamic_params' scale and zero point, for every route, with and without the
    fused max pooling, on inputs of other ranges one after the other."""
    rng = np.random.default_rng(21)
    w = rng.integers(-127, 128, ws, dtype=np.int8)
    wsc = rng.random(ws[0], dtype=np.float32) * 0.01 + 0.001
    b = rng.standard_normal(ws[0], dtype=np.float32)
    kw = dict(strides=strides, pads=pads, group=group, activation="Relu")
    if pool:
        kw.update(pool_kernel_shape=pool, pool_strides=pool)
    for spread, shift in ((1.0, 0.0), (30.0, 5.0), (0.01, -0.5)):
        x = (rng.standard_normal(xs, dtype=np.float32) * np.float32(spread) + np.float32(shift)).astype(np.float32)
        sc, zp, _, _ = qlinear._dynamic_params(x, 255)
        y = qlinear.qconv(x, None, None, w, wsc, b, **kw)
        ref = qlinear.qconv(x, np.float32(sc), np.uint8(zp), w, wsc, b, **kw)
        np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("xs,ws,strides,pads,act", [
    ((1, 16, 8, 8), (32, 16, 3, 3), (1, 1), (1, 1, 1, 1), "Relu"),
    ((2, 32, 9, 9), (64, 32, 1, 1), (1, 1), (0, 0, 0, 0), "HardSwish"),
    ((1, 24, 13, 11), (40, 24, 3, 3), (2, 2), (1, 0, 1, 2), ""),
    ((1, 48, 30, 30), (20, 48, 1, 1), (1, 1), (0, 0, 0, 0), "Relu"),  # several column blocks
])
def test_qconv_chained_u8_in_and_out(xs, ws, strides, pads, act, every_isa, threads):
    """The chained QConv forms: a uint8 input equals the float input it quantizes, and the
    uint8 output (output_scale / output_zero_point) is exactly quantize_u8 of the float output,
    native and numpy alike (native vs numpy: within one step where the float results round apart)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.integers(-127, 128, ws, dtype=np.int8)
    wsc = rng.random(ws[0], dtype=np.float32) * 0.01 + 0.001
    b = rng.standard_normal(ws[0], dtype=np.float32)
    xsc, xzp = np.float32(0.02), np.uint8(120)
    kw = dict(strides=strides, pads=pads, activation=act)
    xq = np.empty(xs, np.uint8)
    native.quantize_u8(x, xq, float(xsc), int(xzp))
    y = qlinear.qconv(x, xsc, xzp, w, wsc, b, **kw)
    np.testing.assert_array_equal(qlinear.qconv(xq, xsc, xzp, w, wsc, b, **kw), y)
    out = dict(output_scale=float(np.abs(y).max()) / 200, output_zero_point=37)
    yq = qlinear.qconv(x, xsc, xzp, w, wsc, b, **kw, **out)
    assert yq.dtype == np.uint8 and yq.shape == y.shape
    np.testing.assert_array_equal(yq, qlinear.requantize_u8(y, out["output_scale"], 37))
    ref = np.empty(y.shape, np.uint8)
    native.quantize_u8(np.ascontiguousarray(y), ref, out["output_scale"], 37)
    np.testing.assert_array_equal(yq, ref)
    np.testing.assert_array_equal(qlinear.qconv(xq, xsc, xzp, w, wsc, b, **kw, **out), yq)
    with numpy_path():
        yq_np = qlinear.qconv(xq, xsc, xzp, w, wsc, b, **kw, **out)
        y_np = qlinear.qconv(x, xsc, xzp, w, wsc, b, **kw)
        np.testing.assert_array_equal(qlinear.qconv(x, xsc, xzp, w, wsc, b, **kw, **out), yq_np)
    np.testing.assert_array_equal(yq_np, qlinear.requantize_u8(y_np, out["output_scale"], 37))
    assert np.abs(yq_np.astype(int) - yq).max() <= 1 and (yq_np != yq).mean() < 0.01


def test_qconv_u8_input_needs_static_uint8_quantization():
    x = np.zeros((1, 4, 5, 5), np.uint8)
    w = np.ones((2, 4, 3, 3), np.int8)
    with pytest.raises(ValueError, match="X_scale"):
        qlinear.qconv(x, None, None, w, np.ones(2, np.float32))
    with pytest.raises(ValueError, match="uint8 X_zero_point"):
        qlinear.qconv(x, np.float32(0.1), np.int8(0), w, np.ones(2, np.float32))
    with pytest.raises(ValueError, match="output_scale"):
        qlinear.qconv(x.astype(np.float32), np.float32(0.1), np.uint8(0), w, np.ones(2, np.float32),
                      output_scale=0.0)


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
    native.sgemm(a, b, c, bias, bias_mode, res, native.ACTIVATION_CODES["Relu"])
    ref = a.astype(np.float64) @ b + (bias[:, None] if bias_mode == 1 else bias[None, :]) + res
    np.testing.assert_allclose(c, np.maximum(ref, 0), rtol=1e-4, atol=1e-4)


def _qconv_case(rng, c, hw, m, k, s, pb, group, d, n):
    """Inputs of a prepared-QConv test and the exact integer sums: (h, wd, oh, ow, x, xq, packed weights,
    x_scale, x_zero, per-row scale, bias, residual, int sums)."""
    h, wd = hw
    oh = (h + pb[0] + pb[2] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (wd + pb[1] + pb[3] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    x = rng.standard_normal((n, c, h, wd), dtype=np.float32)
    w = rng.integers(-127, 128, (m, c // group, *k), dtype=np.int8)
    packed = native.qpack(w.reshape(m, -1))
    x_scale, x_zero = 0.03, 121
    scale = (rng.random(m, dtype=np.float32) * 0.01 + 0.001) * np.float32(x_scale)
    bias = rng.standard_normal(m, dtype=np.float32)
    res = rng.standard_normal((n, m, oh, ow), dtype=np.float32)
    xq = np.empty(x.shape, np.uint8)
    native.quantize_u8(x, xq, x_scale, x_zero)
    acc = _qconv_int_ref(xq, x_zero, w, k, s, pb, group, (oh, ow), d)
    return h, wd, oh, ow, x, xq, packed, x_scale, x_zero, scale, bias, res, acc


def _qconv_int_ref(xq, x_zero, w, k, s, pb, group, out, d=(1, 1)):
    """Exact int32 sums of (xq - x_zero) * w per output (n, m, oh*ow), plain numpy."""
    n, c, h, wd = xq.shape
    m = w.shape[0]
    cg, mg = c // group, m // group
    xp = np.full((n, c, h + pb[0] + pb[2], wd + pb[1] + pb[3]), x_zero, np.int64)
    xp[:, :, pb[0]:pb[0] + h, pb[1]:pb[1] + wd] = xq
    xp -= x_zero
    oh, ow = out
    acc = np.zeros((n, m, oh, ow), np.int64)
    for g in range(group):
        wg = w[g * mg:(g + 1) * mg].astype(np.int64)
        for ky in range(k[0]):
            for kx in range(k[1]):
                y0, x0 = ky * d[0], kx * d[1]
                win = xp[:, g * cg:(g + 1) * cg, y0:y0 + s[0] * oh:s[0], x0:x0 + s[1] * ow:s[1]]
                acc[:, g * mg:(g + 1) * mg] += np.einsum("nchw,mc->nmhw", win, wg[:, :, ky, kx])
    return acc.reshape(n, m, oh * ow)


@pytest.mark.parametrize("c,hw,m,k,s,pb,group,d", [
    (3, (8, 8), 16, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)),    # digits conv1: p = 64
    (16, (4, 4), 8, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)),    # digits conv2: p = 16 (narrow GEMM per image)
    (16, (5, 5), 12, (1, 1), (1, 1), (0, 0, 0, 0), 1, (1, 1)),   # 1x1 direct, p = 25
    (8, (9, 9), 6, (3, 3), (2, 2), (1, 0, 1, 2), 2, (1, 1)),     # strided, padded, 2 groups
    (4, (1, 1), 10, (1, 1), (1, 1), (0, 0, 0, 0), 1, (1, 1)),    # p = 1
    # planes of <= 64 pixels at stride 1 side by side: on AVX-512 im2col'ed straight into packed panels
    (8, (6, 6), 6, (3, 3), (1, 1), (1, 1, 1, 1), 2, (1, 1)),     # 2 groups (K = 36 per group), p = 36
    (5, (6, 8), 7, (3, 3), (1, 1), (2, 1, 1, 1), 1, (1, 1)),     # K = 45 (a partial quad), oh 7 != h 6, p = 56
    (3, (7, 7), 9, (3, 3), (1, 1), (2, 2, 2, 2), 1, (2, 2)),     # dilation 2, p = 49: images straddle panels
    (2, (8, 8), 5, (7, 7), (1, 1), (3, 3, 3, 3), 1, (1, 1)),     # 7x7: 49 taps (all kept masks)
    (1, (8, 8), 4, (9, 9), (1, 1), (4, 4, 4, 4), 1, (1, 1)),     # 9x9: taps past the kept masks
    (6, (3, 5), 3, (1, 3), (1, 1), (0, 1, 0, 1), 1, (1, 1)),     # 1x3 window, p = 15 (narrow panels at n <= 1)
    (3, (4, 8), 10, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)),    # p = 32: two images per 64 columns
    (5, (2, 2), 6, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)),     # p = 4: 16 images per 64 columns, 16-col panels
    # one image (n = 1) of <= 64 pixels: its panels from q_im2col_panels1_task (all the cases above, and:)
    (24, (4, 4), 10, (3, 3), (1, 1), (1, 1, 1, 1), 2, (1, 1)),   # 2 groups of K = 108, p = 16
    (7, (3, 4), 5, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)),     # K = 63 (a partial quad), p = 12
    (2, (4, 4), 3, (9, 9), (1, 1), (4, 4, 4, 4), 1, (1, 1)),     # 81 taps: the general panels route
    (1000, (4, 4), 4, (3, 3), (1, 1), (1, 1, 1, 1), 2, (1, 1)),  # 2 threads split the quads in a group, mid-channel
    (130, (8, 8), 6, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)),   # ... p = 64, 32-column panels
    (40, (5, 8), 6, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)),    # p = 40: a partly filled second panel
    # p >= 256, group 1, kernel > 1x1: one image per GEMM, implicit (planes, no im2col)
    (4, (20, 20), 8, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)),   # p = 400
    (5, (17, 23), 12, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)),  # a partial channel quad and 8-row tile
    (6, (33, 40), 10, (3, 3), (2, 2), (1, 0, 1, 2), 1, (1, 1)),  # stride 2 (four phase planes), uneven pads
    (3, (24, 26), 9, (5, 5), (1, 1), (2, 2, 2, 2), 1, (1, 1)),   # 5x5, 3 channels (the stem's padding)
    (7, (30, 28), 6, (3, 3), (1, 1), (2, 2, 2, 2), 1, (2, 2)),   # dilation 2
    (3, (40, 34), 5, (3, 3), (2, 1), (1, 1, 0, 1), 1, (1, 1)),   # strides 2 x 1
    (1, (40, 40), 136, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)), # several row blocks and weight-row blocks
    (8, (18, 18), 8, (3, 3), (1, 1), (0, 0, 0, 0), 1, (1, 1)),   # no padding: p = 256
    # (on AVX2 without VNNI, fewer than 4 channels take the im2col route, D180: the implicit one there with 4-5)
    (5, (24, 26), 9, (5, 5), (1, 1), (2, 2, 2, 2), 1, (1, 1)),   # implicit 5x5
    (4, (40, 34), 5, (3, 3), (2, 1), (1, 1, 0, 1), 1, (1, 1)),   # implicit, strides 2 x 1
    (4, (40, 40), 136, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)), # implicit: row blocks and weight-row blocks
])
@pytest.mark.parametrize("n", [1, 3, 17])
def test_qconv_batched_small_planes_exact(c, hw, m, k, s, pb, group, d, n, every_isa, threads):
    """Images side by side in one GEMM (D24) or one by one from padded planes (implicit) give
    exactly the per-image results (n = 1 calls) and the numpy integer math, for every
    input/output form, residual and activation."""
    rng = np.random.default_rng(11 + n)
    h, wd, oh, ow, x, xq, packed, x_scale, x_zero, scale, bias, res, acc = _qconv_case(rng, c, hw, m, k, s, pb, group,
                                                                                      d, n)
    y_scale, y_zero = 0.02, 40
    clip = (-0.5, 1.5)  # (a Clip's bounds, inside the outputs' range so that both bind)
    for act in (0, 1, 2, 7):  # none, Relu, Clip (in the AVX-512 store too, D144), HardSwish
        a = clip if act == 2 else (0.0, 0.0)
        prep = native.qconv2d_prepare(x.shape, packed, m, group, k, s, d, pb[:2], (oh, ow), scale, bias, act, *a)
        prep1 = native.qconv2d_prepare((1, c, h, wd), packed, m, group, k, s, d, pb[:2], (oh, ow), scale, bias, act,
                                       *a)
        for residual in (None, res):
            for src in (x, xq):
                for y_q in (None, (y_scale, y_zero)):
                    y = np.empty((n, m, oh, ow), np.uint8 if y_q else np.float32)
                    native.qconv2d_call(prep, src, x_scale, x_zero, y, residual=residual, y_q=y_q)
                    per = np.empty_like(y)
                    for i in range(n):
                        yi = np.empty_like(y[i:i + 1])
                        native.qconv2d_call(prep1, np.ascontiguousarray(src[i:i + 1]), x_scale, x_zero, yi,
                                            residual=None if residual is None else residual[i:i + 1], y_q=y_q)
                        per[i] = yi[0]
                    np.testing.assert_array_equal(y, per)
                    if act == 7:
                        continue
                    ref = scale[:, None] * acc.astype(np.float32) + bias[:, None]
                    if residual is not None:
                        ref = ref + residual.reshape(n, m, -1)
                    if act == 1:
                        ref = np.where(ref < 0, np.float32(0), ref)
                    if act == 2:
                        ref = np.minimum(np.maximum(ref, np.float32(clip[0])), np.float32(clip[1]))
                    if y_q:
                        ref = np.clip(np.rint(ref / np.float32(y_scale)) + y_zero, 0, 255).astype(np.uint8)
                    np.testing.assert_array_equal(y.reshape(n, m, -1), ref)


@pytest.mark.parametrize("k,hw,pb", [((1, 1), (16, 20), (0, 0, 0, 0)),   # a 1x1 conv: the GEMM route's tile store
                                     ((3, 3), (20, 20), (1, 1, 1, 1))])  # p >= 256: the implicit route's
@pytest.mark.parametrize("act", [0, 1, 2])  # none, Relu, Clip: the activations the store folds (D181)
def test_qconv_uint8_output_on_rounding_boundaries(k, hw, pb, act, every_isa, threads):
    """A uint8 output whose values sit on, or within a few ulps of, rounding boundaries: the folded
    requantization (AVX-512 VNNI, D181) must give the step-by-step bytes there too.  Scale 1/8 and
    y_scale 1/4 make y / y_scale = acc / 2 + 4 bias: on a half-integer for every even acc when
    bias = 1/8, and 2^-22 .. 2^-10 away from one with the other biases; both forms disagree on such values
    unless the fold hands them to the step-by-step arithmetic."""
    rng = np.random.default_rng(7)
    c, m, n = 8, 40, 1
    deltas = [0.0, 2.0 ** -22, -(2.0 ** -22), 2.0 ** -20, -(2.0 ** -20), 2.0 ** -16, -(2.0 ** -16), 2.0 ** -10]
    h, wd = hw
    oh, ow = h + pb[0] + pb[2] - k[0] + 1, wd + pb[1] + pb[3] - k[1] + 1
    w = rng.integers(-1, 2, (m, c, *k), dtype=np.int8)
    packed = native.qpack(w.reshape(m, -1))
    x_scale, x_zero = 1.0, 100
    xq = rng.integers(97, 104, (n, c, h, wd), dtype=np.uint8)
    acc = _qconv_int_ref(xq, x_zero, w, k, (1, 1), pb, 1, (oh, ow))
    scale = np.full(m, 0.125, np.float32)
    bias = np.array([0.125 + deltas[i % len(deltas)] for i in range(m)], np.float32)
    y_scale, y_zero = 0.25, 7
    clip = (-0.5, 3.0)
    a = clip if act == 2 else (0.0, 0.0)
    prep = native.qconv2d_prepare(xq.shape, packed, m, 1, k, (1, 1), (1, 1), pb[:2], (oh, ow), scale, bias, act, *a)
    y = np.empty((n, m, oh, ow), np.uint8)
    native.qconv2d_call(prep, xq, x_scale, x_zero, y, y_q=(y_scale, y_zero))
    ref = scale[:, None] * acc.astype(np.float32) + bias[:, None]
    if act == 1:
        ref = np.where(ref < 0, np.float32(0), ref)
    if act == 2:
        ref = np.minimum(np.maximum(ref, np.float32(clip[0])), np.float32(clip[1]))
    t = ref / np.float32(y_scale)
    assert np.mean(np.abs(np.abs(t - np.floor(t)) - 0.5) < 1e-3) > 0.1  # (the case does sit on boundaries)
    np.testing.assert_array_equal(y.reshape(n, m, -1),
                                  np.clip(np.rint(t) + y_zero, 0, 255).astype(np.uint8))


# Each route of the one-image-per-GEMM conv: implicit planes (kernels > 1x1, p >= 256, group 1; the
# shapes of test_qconv_batched_small_planes_exact), the packed GEMM with 1x1 float inputs quantized
# while packed, the im2col GEMM (groups), and small planes side by side (n > 1).
POST_ROUTE_CASES = [
    (4, (20, 20), 8, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)),   # implicit, p = 400
    (5, (17, 23), 12, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)),  # implicit: partial channel quad and 8-row tile
    (6, (33, 40), 10, (3, 3), (2, 2), (1, 0, 1, 2), 1, (1, 1)),  # implicit, stride 2, uneven pads
    (3, (24, 26), 9, (5, 5), (1, 1), (2, 2, 2, 2), 1, (1, 1)),   # implicit 5x5
    (7, (30, 28), 6, (3, 3), (1, 1), (2, 2, 2, 2), 1, (2, 2)),   # implicit, dilation 2
    (3, (40, 34), 5, (3, 3), (2, 1), (1, 1, 0, 1), 1, (1, 1)),   # implicit, strides 2 x 1
    (1, (40, 40), 136, (3, 3), (1, 1), (1, 1, 1, 1), 1, (1, 1)), # implicit: row blocks and weight-row blocks
    (8, (18, 18), 8, (3, 3), (1, 1), (0, 0, 0, 0), 1, (1, 1)),   # implicit, no padding: p = 256
    (16, (20, 20), 24, (1, 1), (1, 1), (0, 0, 0, 0), 1, (1, 1)), # 1x1 direct (float input packed from floats)
    (16, (10, 10), 20, (1, 1), (1, 1), (0, 0, 0, 0), 1, (1, 1)), # 1x1, p = 100: a 16-wide last panel (4 columns)
    (12, (17, 17), 14, (1, 1), (1, 1), (0, 0, 0, 0), 1, (1, 1)), # 1x1, p = 289: the second block is 32 + 1 columns
    (8, (20, 20), 12, (3, 3), (1, 1), (1, 1, 1, 1), 2, (1, 1)),  # 2 groups: im2col GEMM, one image per call
    (8, (9, 9), 6, (3, 3), (2, 2), (1, 0, 1, 2), 2, (1, 1)),     # small planes side by side
]


@pytest.mark.parametrize("c,hw,m,k,s,pb,group,d", POST_ROUTE_CASES)
@pytest.mark.parametrize("n", [1, 3])
def test_qconv_post_affine_and_per_channel_output(c, hw, m, k, s, pb, group, d, n, every_isa, threads):
    """QConv's post affine (post_scale / post_shift: y = a * act(...) + b, after the activation and
    before any requantization) and a per-channel uint8 output on every conv route, with
    residual and the activations applied in the store (Relu, HardSwish) or after it (Clip):
    the float32 epilogue of the numpy integer sums, exactly (HardSwish: within float rounding),
    and images one at a time give the same values."""
    rng = np.random.default_rng(23 + n)
    h, wd, oh, ow, x, xq, packed, x_scale, x_zero, scale, bias, res, acc = _qconv_case(rng, c, hw, m, k, s, pb, group,
                                                                                      d, n)
    y_scale = rng.uniform(0.01, 0.05, m).astype(np.float32)  # per output channel
    y_zero = rng.integers(0, 256, m).astype(np.int32)
    post_a, post_b = np.float32(-0.75), np.float32(0.375)
    for act, a0, a1 in ((native.ACTIVATION_CODES[""], 0.0, 0.0), (native.ACTIVATION_CODES["Relu"], 0.0, 0.0), (native.ACTIVATION_CODES["HardSwish"], 0.0, 0.0),
                       (native.ACTIVATION_CODES["Clip"], -0.5, 0.5)):
        prep = native.qconv2d_prepare(x.shape, packed, m, group, k, s, d, pb[:2], (oh, ow), scale, bias, act, a0, a1)
        prep1 = native.qconv2d_prepare((1, c, h, wd), packed, m, group, k, s, d, pb[:2], (oh, ow), scale, bias, act,
                                       a0, a1)
        for residual in (None, res):
            ref = scale[:, None] * acc.astype(np.float32) + bias[:, None]
            if residual is not None:
                ref = ref + residual.reshape(n, m, -1)
            if act == native.ACTIVATION_CODES["Relu"]:
                ref = np.where(ref < 0, np.float32(0), ref)
            elif act == native.ACTIVATION_CODES["HardSwish"]:
                ref = ref * np.clip(ref / np.float32(6) + np.float32(0.5), 0, 1).astype(np.float32)
            elif act == native.ACTIVATION_CODES["Clip"]:
                ref = np.clip(ref, np.float32(a0), np.float32(a1))
            ref = post_a * ref + post_b
            ref_q = np.clip(np.rint(ref / y_scale[:, None]) + y_zero[:, None], 0, 255).astype(np.uint8)
            for src in (x, xq):
                for y_q in (None, (y_scale, y_zero)):
                    y = np.empty((n, m, oh, ow), np.uint8 if y_q else np.float32)
                    native.qconv2d_call(prep, src, x_scale, x_zero, y, residual=residual, y_q=y_q,
                                        post=(post_a, post_b))
                    per = np.empty_like(y)
                    for i in range(n):
                        yi = np.empty_like(y[i:i + 1])
                        native.qconv2d_call(prep1, np.ascontiguousarray(src[i:i + 1]), x_scale, x_zero, yi,
                                            residual=None if residual is None else residual[i:i + 1], y_q=y_q,
                                            post=(post_a, post_b))
                        per[i] = yi[0]
                    np.testing.assert_array_equal(y, per)
                    got = y.reshape(n, m, -1)
                    if act == native.ACTIVATION_CODES["HardSwish"]:  # x / 6 + 1/2 may be one FMA: the last bit may differ
                        if y_q:
                            assert np.abs(got.astype(np.int32) - ref_q.astype(np.int32)).max() <= 1
                        else:
                            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
                    else:
                        np.testing.assert_array_equal(got, ref_q if y_q else ref)


def _max_pool_ref(y, k, s):
    """MaxPool without padding (floor rounding), plain numpy: max over the k[0]*k[1] strided taps."""
    oh, ow = (y.shape[2] - k[0]) // s[0] + 1, (y.shape[3] - k[1]) // s[1] + 1
    taps = [y[:, :, ky:ky + s[0] * (oh - 1) + 1:s[0], kx:kx + s[1] * (ow - 1) + 1:s[1]]
            for ky in range(k[0]) for kx in range(k[1])]
    out = taps[0].copy()
    for t in taps[1:]:
        out = np.where((t > out) | np.isnan(t), t, out)
    return out


@pytest.mark.parametrize("xs,ws,pads,pool", [
    ((1, 16, 8, 8), (32, 16, 3, 3), (1, 1, 1, 1), ((2, 2), (2, 2))),  # digits' conv + MaxPool
    ((3, 8, 9, 7), (12, 8, 3, 3), (1, 1, 1, 1), ((2, 2), (2, 2))),    # odd sizes: the last row/column dropped
    ((2, 6, 10, 10), (4, 6, 1, 1), (0, 0, 0, 0), ((3, 3), (2, 2))),   # general window, overlapping
    ((5, 4, 6, 6), (8, 4, 3, 3), (0, 0, 0, 0), ((2, 3), (1, 3))),     # rectangular window, stride 1 rows
    ((40, 3, 8, 8), (16, 3, 3, 3), (1, 1, 1, 1), ((2, 2), (2, 2))),   # many images side by side per GEMM
    # 2x2/2 over planes of <= 64 pixels: on AVX-512 four registers per plane, taps picked by index
    ((7, 5, 5, 3), (6, 5, 3, 3), (1, 1, 1, 1), ((2, 2), (2, 2))),     # p = 15 (one register), 2 x 1 pooled
    ((6, 3, 4, 4), (5, 3, 3, 3), (1, 1, 1, 1), ((2, 2), (2, 2))),     # p = 16
    ((4, 2, 6, 10), (9, 2, 3, 3), (1, 1, 1, 1), ((2, 2), (2, 2))),    # p = 60, rows of 10
    ((2, 3, 10, 9), (4, 3, 3, 3), (1, 1, 1, 1), ((2, 2), (2, 2))),    # p = 90: the per-plane loop
])
@pytest.mark.parametrize("quant", ["static", "dynamic", "u8-input"])
def test_qconv_fused_max_pool(xs, ws, pads, pool, quant, every_isa, threads):
    """QConv with pool_kernel_shape / pool_strides: native == MaxPool (numpy reference) of the native
    unpooled QConv, exactly (with a residual, NaN in it propagating), and the numpy path agrees;
    static, dynamic and already-quantized (uint8, a chained producer's) inputs."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.integers(-127, 128, ws, dtype=np.int8)
    wsc = rng.random(ws[0], dtype=np.float32) * 0.01 + 0.001
    b = rng.standard_normal(ws[0], dtype=np.float32)
    xsc, xzp = (None, None) if quant == "dynamic" else (np.float32(0.02), np.uint8(128))
    if quant == "u8-input":
        xq = np.empty(xs, np.uint8)
        native.quantize_u8(x, xq, float(xsc), int(xzp))
        x = xq
    k, s = pool
    kw = dict(pads=pads, activation="Relu")
    y = qlinear.qconv(x, xsc, xzp, w, wsc, b, **kw)
    z = rng.standard_normal(y.shape, dtype=np.float32)
    z.flat[::37] = np.nan
    for resid in (None, z):
        full = qlinear.qconv(x, xsc, xzp, w, wsc, b, resid, **kw)
        pooled = qlinear.qconv(x, xsc, xzp, w, wsc, b, resid, **kw, pool_kernel_shape=k, pool_strides=s)
        ref = _max_pool_ref(full, k, s)
        assert pooled.shape == ref.shape
        np.testing.assert_array_equal(pooled, ref)
        with numpy_path():
            pooled_np = qlinear.qconv(x, xsc, xzp, w, wsc, b, resid, **kw, pool_kernel_shape=k, pool_strides=s)
        np.testing.assert_allclose(pooled_np, ref, rtol=1e-4, atol=1e-4 * float(np.nanmax(np.abs(ref))))
        assert np.array_equal(np.isnan(pooled_np), np.isnan(ref))


def test_qconv_fused_max_pool_errors():
    x = np.zeros((1, 2, 4, 4), np.float32)
    w = np.ones((3, 2, 3, 3), np.int8)
    args = (x, np.float32(0.1), np.uint8(0), w, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="pool_strides needs pool_kernel_shape"):
        qlinear.qconv(*args, pool_strides=(2, 2))
    with pytest.raises(ValueError, match="two positive integers"):
        qlinear.qconv(*args, pool_kernel_shape=(2, 0))
    with pytest.raises(ValueError):  # the 2x2 conv output is smaller than the window: MaxPool's error
        qlinear.qconv(*args, pool_kernel_shape=(3, 3))


@pytest.mark.parametrize("axis", [1, 2, -1, 0])
def test_qmatmul_flatten_axis(axis, every_isa):
    """QMatMul's flatten_axis equals Flatten then QMatMul (native and numpy paths); bad axes are
    Flatten's error."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 4, 2, 6), dtype=np.float32)
    outer = int(np.prod(a.shape[:axis % 4]))
    k = a.size // outer
    b = rng.integers(-127, 128, (5, k), dtype=np.int8)
    bs = rng.random(5, dtype=np.float32) * 0.01 + 0.001
    args = (np.float32(0.02), np.uint8(128), b, bs, rng.standard_normal(5, dtype=np.float32))
    ref = qlinear.qmatmul(a.reshape(outer, k), *args, transB=1, activation="Relu")
    np.testing.assert_array_equal(qlinear.qmatmul(a, *args, transB=1, activation="Relu", flatten_axis=axis), ref)
    with numpy_path():
        y_np = qlinear.qmatmul(a, *args, transB=1, activation="Relu", flatten_axis=axis)
    np.testing.assert_allclose(y_np, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="Flatten: axis"):
        qlinear.qmatmul(a, *args, transB=1, flatten_axis=5)


def test_writeable_int8_weights_are_not_cached_by_identity(every_isa):
    """QConv / QMatMul whose weights are a writeable array (a computed value, refilled in place between
    runs) follow its current values: only read-only arrays (the model's constants) are packed once."""
    from minirt.kernels.registry import NodeContext
    from tests.native.conftest import numpy_path

    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 16, 6, 6)).astype(np.float32)
    w = rng.integers(-127, 128, (32, 16, 3, 3), dtype=np.int8)
    ws = np.full(32, 0.01, np.float32)
    ctx = NodeContext("qc", "QConv", 1, (np.float32,), 1)
    a = rng.standard_normal((4, 48)).astype(np.float32)
    b = rng.integers(-127, 128, (20, 48), dtype=np.int8)
    bs = np.full(20, 0.02, np.float32)
    mctx = NodeContext("qm", "QMatMul", 1, (np.float32,), 1)
    for _ in range(3):
        got = qlinear.qconv(x, np.float32(0.03), np.uint8(128), w, ws, pads=(1, 1, 1, 1), ctx=ctx)
        got_m = qlinear.qmatmul(a, np.float32(0.02), np.uint8(120), b, bs, transB=1, ctx=mctx)
        with numpy_path():
            want = qlinear.qconv(x, np.float32(0.03), np.uint8(128), w, ws, pads=(1, 1, 1, 1))
            want_m = qlinear.qmatmul(a, np.float32(0.02), np.uint8(120), b, bs, transB=1)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(got_m, want_m, rtol=1e-5, atol=1e-4)
        w[...] = rng.integers(-127, 128, w.shape, dtype=np.int8)  # the same objects, new values
        b[...] = rng.integers(-127, 128, b.shape, dtype=np.int8)


@pytest.mark.parametrize("n, hw", [(3, 8), (2, 6), (5, 4), (2, 12), (1, 10)])
def test_qconv_fused_max_pool_batched_with_nan_residual(n, hw, every_isa):
    """QConv + 2x2/2 MaxPool over small planes, several images per GEMM (the pooled planes placed per
    image and channel): equal to the numpy path, a NaN in the residual turning its window's maximum NaN."""
    from tests.native.conftest import numpy_path

    rng = np.random.default_rng(hw)
    x = rng.standard_normal((n, 4, hw, hw)).astype(np.float32)
    w = rng.integers(-127, 128, (8, 4, 3, 3), dtype=np.int8)
    ws = np.full(8, 0.01, np.float32)
    z = rng.standard_normal((n, 8, hw, hw)).astype(np.float32)
    z[0, 1, 2, 3] = np.nan
    z[-1, 7, -1, -1] = np.nan
    kw = dict(pads=(1, 1, 1, 1), pool_kernel_shape=(2, 2), pool_strides=(2, 2), activation="Relu")
    got = qlinear.qconv(x, np.float32(0.03), np.uint8(128), w, ws, None, z, **kw)
    with numpy_path():
        want = qlinear.qconv(x, np.float32(0.03), np.uint8(128), w, ws, None, z, **kw)
    assert got.shape == want.shape == (n, 8, hw // 2, hw // 2)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,c,h,w,f", [(1, 3, 8, 80, 2), (2, 5, 6, 22, 2), (1, 4, 4, 6, 2), (1, 2, 6, 9, 3),
                                       (1, 3, 5, 7, 1)])
@pytest.mark.parametrize("with_mul", [False, True])
def test_quantize_add_up_u8_matches_numpy(n, c, h, w, f, with_mul, every_isa, threads):
    """quantize_u8(x * xm + nearest-upsampled xu) in one pass (QConv's X_up / X_mul): exactly the numpy
    product, sum, repeated values and rint; full vectors, row tails, the generic factor path, several
    planes, with and without the per-plane multiplier."""
    rng = np.random.default_rng(n * 100 + w)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32) * 4
    xu = rng.standard_normal((n, c, h // f, w // f)).astype(np.float32) * 4
    xm = (rng.random((n, c, 1, 1)).astype(np.float32) + 0.5) if with_mul else None
    x[0, 0, 0, :2] = [np.nan, np.inf]  # NaN -> the zero point's low clamp, inf -> 255
    q = np.empty(x.shape, np.uint8)
    native.quantize_add_up_u8(x, xu, q, 0.05, 120, xm)
    s = (x if xm is None else x * xm) + np.repeat(np.repeat(xu, f, axis=2), f, axis=3)
    with np.errstate(invalid="ignore"):
        ref = np.clip(np.rint(s / np.float32(0.05)) + 120, 0, 255)
    ref[np.isnan(ref)] = 0
    np.testing.assert_array_equal(q, ref.astype(np.uint8))


def test_quantize_add_up_u8_needs_an_integer_factor():
    x, xu = np.zeros((1, 2, 4, 5), np.float32), np.zeros((1, 2, 2, 2), np.float32)  # 5 columns from 2
    with pytest.raises(ValueError, match="integer factor"):
        native.quantize_add_up_u8(x, xu, np.empty(x.shape, np.uint8), 0.05, 120)


@pytest.mark.parametrize("shape,up,f", [((1, 8, 16, 20), (1, 8, 8, 10), 2), ((2, 5, 12, 9), (2, 5, 4, 3), 3),
                                        ((1, 4, 1, 20), (1, 4, 4, 5), 4)])  # the last: the Add broadcasts x
@pytest.mark.parametrize("mul", [None, "per_image", "shared", "scalar"])
def test_qconv_x_up_is_the_add_of_the_upsampled_input(shape, up, f, mul, every_isa, threads):
    """QConv(x, ..., X_up, X_mul, x_up_factor=f) == QConv(x * X_mul + Resize(X_up, nearest, f)) bit for
    bit, native (quantized while adding) and numpy; a broadcasting x or X_mul takes the float sum."""
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    x_up = rng.standard_normal(up).astype(np.float32)
    x_mul = {None: None, "scalar": np.array([[[[1.5]]]], np.float32),
             "per_image": rng.random((shape[0], shape[1], 1, 1)).astype(np.float32) + 0.5,
             "shared": rng.random((1, shape[1], 1, 1)).astype(np.float32) + 0.5}[mul]
    c = shape[1]
    w = rng.integers(-127, 128, (6, c, 3, 3), dtype=np.int8)
    w_scale = (rng.random(6, dtype=np.float32) * 0.01 + 0.001)
    bias = rng.standard_normal(6).astype(np.float32)
    xs, xz = np.array(0.03, np.float32), np.array(118, np.uint8)
    for a in (w, w_scale, bias, xs, xz):
        a.flags.writeable = False
    attrs = dict(kernel_shape=(3, 3), pads=(1, 1, 1, 1), strides=(1, 1), activation="Relu")
    summed = (x if x_mul is None else x * x_mul) + np.repeat(np.repeat(x_up, f, axis=2), f, axis=3)
    ref = qlinear.qconv(summed, xs, xz, w, w_scale, bias, None, **attrs)
    got = qlinear.qconv(x, xs, xz, w, w_scale, bias, None, x_up, x_mul, x_up_factor=f, **attrs)
    np.testing.assert_array_equal(got, ref)
    with numpy_path():
        np.testing.assert_array_equal(
            qlinear.qconv(x, xs, xz, w, w_scale, bias, None, x_up, x_mul, x_up_factor=f, **attrs),
            qlinear.qconv(summed, xs, xz, w, w_scale, bias, None, **attrs))
    with pytest.raises(ValueError, match="x_up_factor"):
        qlinear.qconv(x, xs, xz, w, w_scale, bias, None, x_up, **attrs)  # X_up without its factor
    if x_mul is not None:  # X_mul alone: x * X_mul, quantized in one pass when per (image, channel)
        ref = qlinear.qconv(x * x_mul, xs, xz, w, w_scale, bias, None, **attrs)
        np.testing.assert_array_equal(qlinear.qconv(x, xs, xz, w, w_scale, bias, None, None, x_mul, **attrs), ref)
        with numpy_path():
            np.testing.assert_array_equal(qlinear.qconv(x, xs, xz, w, w_scale, bias, None, None, x_mul, **attrs),
                                          qlinear.qconv(x * x_mul, xs, xz, w, w_scale, bias, None, **attrs))


@pytest.mark.parametrize("n", [1, 2])
def test_quantize_upsample_concat_matches_numpy(n, every_isa, threads):
    """QuantizeUpsampleConcat: each input repeated f x f times (f = 8, 4, 2, 1 as PP-OCR det's last
    conv, and 3 through the generic path), concatenated over channels and quantized, exactly as
    numpy (and the numpy path); into the memory plan's buffer when one is given."""
    rng = np.random.default_rng(n)
    parts = [rng.standard_normal((n, c, 48 // f, 24 // f)).astype(np.float32) * 5
             for c, f in ((3, 8), (2, 4), (4, 2), (1, 1), (2, 3), (2, 2))]
    factors = (8, 4, 2, 1, 3, 2)
    # multipliers: per (image, channel), none, shared by the images, per image and channel, none, scalar
    muls = [rng.random((n, 3, 1, 1)).astype(np.float32) + 0.5, None, rng.random((1, 4, 1, 1)).astype(np.float32),
            rng.random((n, 1, 1, 1)).astype(np.float32), None, np.array([[[[0.75]]]], np.float32)]
    scaled = [p if m is None else p * m for p, m in zip(parts, muls)]
    up = np.concatenate([np.repeat(np.repeat(p, f, axis=2), f, axis=3) for p, f in zip(scaled, factors)], axis=1)
    ref = np.clip(np.rint(up / np.float32(0.04)) + 77, 0, 255).astype(np.uint8)
    out = np.empty(ref.shape, np.uint8)
    inputs = [v for pair in zip(parts, muls) for v in pair]
    got = qlinear.quantize_upsample_concat(*inputs, factors=factors, scale=0.04, zero_point=77, out=out)
    assert got is out
    np.testing.assert_array_equal(got, ref)
    with numpy_path():
        np.testing.assert_array_equal(qlinear.quantize_upsample_concat(*inputs, factors=factors, scale=0.04,
                                                                       zero_point=77), ref)


def test_quantize_upsample_concat_errors():
    a, b = np.zeros((1, 2, 4, 4), np.float32), np.zeros((1, 2, 2, 2), np.float32)
    with pytest.raises(ValueError, match="pairs"):
        qlinear.quantize_upsample_concat(a, None, b, None, factors=(1,), scale=0.1, zero_point=0)
    with pytest.raises(ValueError, match="plane size"):
        qlinear.quantize_upsample_concat(a, None, b, None, factors=(1, 3), scale=0.1, zero_point=0)
    with pytest.raises(ValueError, match="scale"):
        qlinear.quantize_upsample_concat(a, None, b, None, factors=(1, 2), scale=0.0, zero_point=0)
    with pytest.raises(ValueError, match="float32"):
        qlinear.quantize_upsample_concat(a.astype(np.float64), None, factors=(1,), scale=0.1, zero_point=0)


def _conv_transpose_tiles_ref(x_u8, x_zero, w, scale, bias):
    """Independent reference of QConvTranspose (stride == kernel): each tap (t, u) of output channel m
    is the exact integer sum over input channels of W[c, m, t, u] * (x - x_zero) at output
    (kh * i + t, kw * j + u); then scale[m] * sum + bias[m] in float32 (the kernel's order)."""
    n, c, h, wd = x_u8.shape
    m, kh, kw = w.shape[1:]
    xi = x_u8.astype(np.int64) - x_zero
    acc = np.zeros((n, m, h * kh, wd * kw), np.int64)
    for t in range(kh):
        for u in range(kw):
            acc[:, :, t::kh, u::kw] = np.einsum("nchw,cm->nmhw", xi, w[:, :, t, u].astype(np.int64))
    assert np.abs(acc).max() < 2 ** 24  # exact in float32
    y = acc.astype(np.float32) * scale.reshape(1, -1, 1, 1)
    return y if bias is None else y + bias.reshape(1, -1, 1, 1)


# (N, C, M, H, W, kernel): det's two 2x2 layers (24 -> 24 at 80x80: several bands; 24 -> 1), odd sizes,
# C not a multiple of 4, a 3x3 tile (the general placement), M*kh*kw not a multiple of the 6-row tile,
# one-pixel images (a one-column GEMM)
@pytest.mark.parametrize("n,c,m,h,wd,k", [(1, 24, 24, 80, 80, (2, 2)), (2, 24, 1, 33, 40, (2, 2)),
                                         (2, 5, 3, 7, 9, (2, 2)), (1, 3, 2, 5, 6, (3, 3)), (2, 37, 5, 11, 17, (2, 2)),
                                         (1, 2, 3, 4, 5, (1, 3)), (2, 9, 4, 1, 1, (2, 2))])
def test_qconv_transpose_exact(n, c, m, h, wd, k, every_isa, threads):
    rng = np.random.default_rng(n * 100 + c + m + h)
    x = rng.integers(0, 256, (n, c, h, wd), dtype=np.uint8)
    x[:, :, 0, :3] = 255
    w = rng.integers(-128, 128, (c, m) + k, dtype=np.int8)
    w[0, 0] = -128
    w_scale = rng.uniform(0.005, 0.02, m).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    xs, xz = np.float32(0.05), np.uint8(7)
    attrs = dict(kernel_shape=k, strides=k)
    scale = xs * w_scale
    # exact integer sums (unit scale, no bias)
    ones = np.ones(m, np.float32) / xs
    np.testing.assert_array_equal(qlinear.qconv_transpose(x, xs, xz, w, ones, None, **attrs),
                                  _conv_transpose_tiles_ref(x, 7, w, xs * ones, None))
    ref = _conv_transpose_tiles_ref(x, 7, w, scale, bias)
    np.testing.assert_array_equal(qlinear.qconv_transpose(x, xs, xz, w, w_scale, bias, **attrs), ref)
    relu = qlinear.qconv_transpose(x, xs, xz, w, w_scale, bias, activation="Relu", **attrs)
    np.testing.assert_array_equal(relu, np.maximum(ref, 0))
    sig = qlinear.qconv_transpose(x, xs, xz, w, w_scale, bias, activation="Sigmoid", **attrs)
    np.testing.assert_allclose(sig, 1 / (1 + np.exp(-ref.astype(np.float64))), rtol=1e-6, atol=1e-6)
    # uint8 output: the float result requantized (the chained form)
    q = qlinear.qconv_transpose(x, xs, xz, w, w_scale, bias, activation="Relu", output_scale=0.03,
                                output_zero_point=11, **attrs)
    assert q.dtype == np.uint8
    np.testing.assert_array_equal(q, qlinear.requantize_u8(np.maximum(ref, 0), 0.03, 11))
    # a float input is quantized with X_scale / X_zero_point first
    xf = (x.astype(np.float32) - 7) * xs + rng.uniform(-0.01, 0.01, x.shape).astype(np.float32)
    np.testing.assert_array_equal(qlinear.qconv_transpose(xf, xs, xz, w, w_scale, bias, **attrs),
                                  qlinear.qconv_transpose(qlinear.requantize_u8(xf, xs, 7), xs, xz, w, w_scale, bias,
                                                          **attrs))
    with numpy_path():
        np.testing.assert_array_equal(qlinear.qconv_transpose(x, xs, xz, w, w_scale, bias, **attrs), ref)
        np.testing.assert_array_equal(
            qlinear.qconv_transpose(x, xs, xz, w, w_scale, bias, activation="Relu", output_scale=0.03,
                                    output_zero_point=11, **attrs), q)


def test_qconv_transpose_writes_the_planned_buffer_and_rejects_other_geometries():
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (1, 4, 6, 6), dtype=np.uint8)
    w = rng.integers(-127, 128, (4, 3, 2, 2), dtype=np.int8)
    ws, xs, xz = np.full(3, 0.01, np.float32), np.float32(0.1), np.uint8(3)
    out = np.empty((1, 3, 12, 12), np.float32)
    assert qlinear.qconv_transpose(x, xs, xz, w, ws, None, strides=(2, 2), out=out) is out
    for bad in (dict(strides=(1, 1)), dict(strides=(2, 2), pads=(1, 1, 1, 1)), dict(strides=(2, 2), group=2),
                dict(strides=(2, 2), output_padding=(1, 1)), dict(strides=(2, 2), dilations=(2, 2))):
        with pytest.raises(ValueError, match="stride == kernel"):
            qlinear.qconv_transpose(x, xs, xz, w, ws, None, **bad)
    with pytest.raises(ValueError, match="X_zero_point"):
        qlinear.qconv_transpose(x, xs, None, w, ws, None, strides=(2, 2))
    with pytest.raises(ValueError, match="int8"):
        qlinear.qconv_transpose(x, xs, xz, w.astype(np.float32), ws, None, strides=(2, 2))
    with pytest.raises(ValueError, match="input shape"):
        qlinear.qconv_transpose(x[:, :3], xs, xz, w, ws, None, strides=(2, 2))


def _conv1d_ref(x, w, b, stride, pads, group, dil):
    """A float 1-D convolution in numpy (x (N, C, L), w (M, C/group, K)): the reference of the 1-D QConv."""
    n, c, _ = x.shape
    m, cg, k = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), pads))
    out = (xp.shape[2] - dil * (k - 1) - 1) // stride + 1
    y = np.zeros((n, m, out))
    mg = m // group
    for g in range(group):
        xs = xp[:, g * cg:(g + 1) * cg]
        for j in range(k):
            taps = xs[:, :, j * dil: j * dil + stride * (out - 1) + 1: stride]  # (N, C/group, out)
            y[:, g * mg:(g + 1) * mg] += np.einsum("ncl,mc->nml", taps, w[g * mg:(g + 1) * mg, :, j])
    return (y + b[None, :, None]).astype(np.float32)


@pytest.mark.parametrize("xs,ws,stride,pads,group,dil", [
    ((1, 129, 4), (128, 129, 3), 1, (1, 1), 1, 1),  # Silero VAD's encoder: 4 positions
    ((1, 1, 576), (258, 1, 256), 128, (0, 0), 1, 1),  # its STFT front end
    ((2, 16, 37), (24, 8, 5), 2, (2, 1), 2, 1),
    ((1, 8, 20), (8, 1, 3), 1, (2, 2), 8, 2),  # depthwise, dilated
])
@pytest.mark.parametrize("quant", ["u8", "dynamic"])
def test_qconv_1d_takes_the_native_path_and_matches_a_numpy_conv(xs, ws, stride, pads, group, dil, quant, every_isa):
    """A 1-D QConv runs as the 2-D one of (N, C, 1, L) (D95): against a numpy 1-D conv of the dequantized
    weights and the quantized-dequantized input (static uint8, or DynamicQuantizeLinear's parameters)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.integers(-127, 128, ws, dtype=np.int8)
    wsc = rng.random(ws[0], dtype=np.float32) * 0.01 + 0.001
    b = rng.standard_normal(ws[0], dtype=np.float32)
    if quant == "u8":
        xsc, xzp = np.float32(0.02), np.uint8(128)
        s, zp = 0.02, 128.0
    else:
        xsc = xzp = None
        lo, hi = min(0.0, float(x.min())), max(0.0, float(x.max()))
        s = np.float32((hi - lo) / 255.0)
        zp = float(np.clip(np.rint(-lo / s), 0, 255))
    xq = (np.clip(np.rint(x / np.float32(s)) + zp, 0, 255) - zp) * np.float32(s)
    if quant == "u8":
        xsc, xzp = np.array(xsc), np.array(xzp)
    for a in (w, wsc, b, xsc, xzp):  # (read-only, as a model's constants: the node keeps its prepared call)
        if a is not None:
            a.flags.writeable = False
    ref = _conv1d_ref(xq, w.astype(np.float32) * wsc[:, None, None], b, stride, pads, group, dil)
    ctx = type("Ctx", (), {"memo": {}})()
    for _ in range(2):  # (the second call runs the node's prepared call)
        y = qlinear.qconv(x, xsc, xzp, w, wsc, b, strides=(stride,), pads=pads, group=group, dilations=(dil,),
                          ctx=ctx)
        assert y.shape == ref.shape
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
    if group != xs[1]:  # (a depthwise one takes the int8 depthwise kernel, which keeps no prepared call)
        assert any(type(v).__name__ == "_PreparedQConv" for v in ctx.memo.values()), ctx.memo


@pytest.mark.parametrize("rows,k,n", [(64, 300, 70), (7, 33, 6), (128, 256, 40), (2, 4, 1)])
@pytest.mark.parametrize("pair_limited", [False, True])
def test_a_dynamic_qmatmul_quantizes_to_uint8_with_exact_sums(rows, k, n, pair_limited, every_isa):
    """A dynamic QMatMul (x_scale 0) quantizes its input to uint8 on every ISA (D172: AVX2's vpmaddubsw
    route comes from pair-limited weights, not from 7-bit inputs as D109 had it); its sums equal the
    exact route's (the same kernel given those parameters as a static input) bit for bit, and the result
    equals numpy's integer product, with full-range and with pair-limited weights."""
    from minirt.builder.quantize.weights import limit_pair_sums
    from minirt.kernels.qlinear import _dynamic_quant

    rng = np.random.default_rng(rows * 1000 + k)
    want_levels = 255
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)  # (-128 too: the widest pair vpmaddubsw can see)
    if pair_limited:
        w = limit_pair_sums(w, 1)
    ws = (rng.random(n) * 0.01 + 0.001).astype(np.float32)
    packed = native.qpack(w)
    a = (rng.standard_normal((rows, k)) * 3 + 1).astype(np.float32)
    dynamic, static = np.empty((rows, n), np.float32), np.empty((rows, n), np.float32)
    native.qmatmul_call(native.qmatmul_prepare(rows, k, 0.0, 0, packed, n, ws, None), a, dynamic)
    sc, zp, scale = _dynamic_quant(a, ws, want_levels)
    native.qmatmul_call(native.qmatmul_prepare(rows, k, sc, zp, packed, n, scale, None), a, static)
    np.testing.assert_array_equal(dynamic, static)
    q = np.clip(np.rint(a / np.float32(sc)) + zp, 0, want_levels).astype(np.int64)
    assert q.max() == 255 and q.min() == 0  # (the whole uint8 range is used)
    sums = (q - zp) @ w.T.astype(np.int64)
    np.testing.assert_allclose(dynamic, sums * scale[None, :], rtol=1e-5, atol=1e-6)


# The AMX tile microkernel (qgemm.h, q_ukr_amx) takes the groups of 32 (then 16) rows of 32-column panels of a
# GEMM whose K quads divide into steps of 6 to 16; the rows left (fewer than 16), the 16-column panel of a
# narrow tail and the K without such a step keep the VNNI microkernels.  Integer sums are exact on both, so
# the results are the same bits: against numpy's integer product and against the VNNI-only level.
@pytest.mark.parametrize("m,k,n", [(32, 64, 32), (64, 576, 300), (37, 32, 17), (80, 24, 33), (48, 160, 197),
                                   (96, 144, 64), (64, 20, 40), (33, 68, 50), (200, 768, 197), (16, 96, 40),
                                   (24, 64, 33)])
def test_qgemm_amx_groups_and_tails_are_exact(m, k, n, threads):
    if not native.features.get("amx"):
        pytest.skip("no AMX-INT8 on this CPU")
    before = native.isa
    rng = np.random.default_rng(m * 7919 + k * 31 + n)
    w = rng.integers(-128, 128, (m, k), dtype=np.int8)
    x = rng.integers(0, 256, (k, n), dtype=np.uint8)
    scale = (rng.random(m) * 0.01 + 0.001).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    got = {}
    try:
        for level in ("avx512-vnni", "avx512"):
            native.select_isa(level)
            c = np.empty((m, n), np.float32)
            native.qgemm(native.qpack(w), m, k, x, 9, np.ones(m, np.float32), c)
            y = np.empty((m, n), np.float32)
            native.qgemm(native.qpack(w), m, k, x, 9, scale, y, bias=bias)
            got[level] = (c, y, native.qgemm_isa)
    finally:
        native.select_isa(before)
    assert got["avx512"][2] in ("amx", "vnni") and got["avx512-vnni"][2] == "vnni"
    ref = w.astype(np.int64) @ (x.astype(np.int64) - 9)
    np.testing.assert_array_equal(got["avx512"][0], ref.astype(np.float32))
    np.testing.assert_array_equal(got["avx512"][0], got["avx512-vnni"][0])
    np.testing.assert_array_equal(got["avx512"][1], got["avx512-vnni"][1])


@pytest.mark.parametrize("rows,k,n", [(197, 192, 576), (197, 768, 192), (40, 96, 64), (5, 64, 33)])
def test_dynamic_qmatmul_on_amx_is_the_vnni_result(rows, k, n, threads):
    """A transformer's dynamic QMatMul (the shapes of DeiT-tiny's qkv and fc2, with a Gelu) gives the same
    bits with the AMX microkernel as with VNNI alone."""
    if not native.features.get("amx"):
        pytest.skip("no AMX-INT8 on this CPU")
    before = native.isa
    rng = np.random.default_rng(rows + k + n)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    ws = (rng.random(n) * 0.01 + 0.001).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    a = (rng.standard_normal((rows, k)) * 2).astype(np.float32)
    out = {}
    try:
        for level in ("avx512-vnni", "avx512"):
            native.select_isa(level)
            y = np.empty((rows, n), np.float32)
            prep = native.qmatmul_prepare(rows, k, 0.0, 0, native.qpack(w), n, ws, bias, act=native.ACTIVATION_CODES["Gelu"])
            native.qmatmul_call(prep, a, y)
            out[level] = y
    finally:
        native.select_isa(before)
    np.testing.assert_array_equal(out["avx512"], out["avx512-vnni"])


@pytest.mark.parametrize("xs,ws,strides,pads,act", [
    ((1, 64, 20, 20), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), "Relu"),      # implicit, 16 quads a step
    ((1, 96, 17, 23), (48, 96, 3, 3), (2, 2), (1, 0, 1, 2), "Clip"),      # stride 2, 12 a step, 16 rows left
    ((1, 24, 30, 30), (72, 24, 1, 1), (1, 1), (0, 0, 0, 0), "HardSwish"),  # 1x1 implicit, 6 a step
    ((1, 40, 16, 18), (40, 40, 5, 5), (1, 1), (2, 2, 2, 2), ""),          # 10 a step, 8 rows left
    ((1, 192, 14, 14), (64, 192, 1, 1), (1, 1), (0, 0, 0, 0), "Relu"),    # small plane: q_gemm_run_q
    ((3, 64, 7, 7), (96, 64, 3, 3), (1, 1), (1, 1, 1, 1), "Relu"),        # images side by side
    ((1, 32, 20, 20), (16, 32, 3, 3), (1, 1), (1, 1, 1, 1), "Relu"),      # one group of 16 rows
    ((1, 64, 24, 24), (24, 64, 1, 1), (1, 1), (0, 0, 0, 0), "Relu"),      # 16 rows, then 8 on VNNI
])
def test_qconv_on_amx_is_the_vnni_result(xs, ws, strides, pads, act, threads):
    """QConv's routes with the AMX tiles (32-row groups of the implicit route and of the GEMM) give the bits
    of the VNNI microkernels: float output, float output with a residual, uint8 output."""
    if not native.features.get("amx"):
        pytest.skip("no AMX-INT8 on this CPU")
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.integers(-127, 128, ws, dtype=np.int8)
    wsc = rng.random(ws[0], dtype=np.float32) * 0.01 + 0.001
    b = rng.standard_normal(ws[0], dtype=np.float32)
    kw = dict(strides=strides, pads=pads, activation=act, activation_params=(0.0, 6.0) if act == "Clip" else ())
    xsc, xzp = np.float32(0.02), np.uint8(120)
    before = native.isa
    out = {}
    try:
        for level in ("avx512-vnni", "avx512"):
            native.select_isa(level)
            y = qlinear.qconv(x, xsc, xzp, w, wsc, b, **kw)
            r = qlinear.qconv(x, xsc, xzp, w, wsc, b, y, **kw) if act == "" else None
            yq = qlinear.qconv(x, xsc, xzp, w, wsc, b, output_scale=float(np.abs(y).max()) / 200,
                               output_zero_point=37, **kw)
            out[level] = (y, r, yq)
    finally:
        native.select_isa(before)
    for a, v in zip(out["avx512"], out["avx512-vnni"]):
        if a is not None:
            np.testing.assert_array_equal(a, v)
