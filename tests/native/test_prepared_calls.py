"""Native calls prepared per node and input shape (D49): FusedConv / Conv, MaxPool, QConv,
QMatMul, Gemm / FusedGemm keep their validated arguments in the node's memo.  The prepared path must
give what the first (validating) call gives, and a new input shape, dtype or weight object must be
validated again: results equal a fresh call without a memo, bad input still raises."""
from __future__ import annotations

import numpy as np
import pytest

from minirt.kernels import fused, linalg, nn, qlinear
from minirt.kernels.registry import NodeContext

from .conftest import numpy_path, requires_native

pytestmark = requires_native


def _ctx(op: str) -> NodeContext:
    return NodeContext("node", op, 1, (np.dtype(np.float32),), 17)


def _const(a: np.ndarray) -> np.ndarray:
    """``a`` read-only, as the model's constants are: only those are kept prepared (a writeable weight is
    a computed value, refilled in place between runs)."""
    a.flags.writeable = False
    return a


def _conv_ref(x, w, b, pads, group=1):
    return nn.conv(x, w, b, pads=pads, group=group)  # no context: validated and computed afresh


@pytest.mark.parametrize("group", [1, 4])
def test_fused_conv_prepared_call_revalidates_shape_dtype_and_weights(group, threads):
    rng = np.random.default_rng(0)
    w = _const(rng.standard_normal((4, 4 // group, 3, 3), dtype=np.float32))
    b = _const(rng.standard_normal(4, dtype=np.float32))
    attrs = dict(pads=(1, 1, 1, 1), group=group, activation="Relu")
    ctx = _ctx("FusedConv")
    x1 = rng.standard_normal((1, 4, 8, 8), dtype=np.float32)
    first = fused.fused_conv(x1, w, b, **attrs, ctx=ctx)
    assert ctx.memo, "the native call was not kept"
    again = fused.fused_conv(x1, w, b, **attrs, ctx=ctx)
    np.testing.assert_array_equal(again, first)
    assert again is not first  # a new result per call (no out= given)
    np.testing.assert_allclose(first, np.maximum(_conv_ref(x1, w, b, attrs["pads"], group), 0), rtol=1e-5, atol=1e-5)
    # the memory plan's buffer is used when it fits, and not when it is an input
    out = np.empty_like(first)
    assert fused.fused_conv(x1, w, b, **attrs, out=out, ctx=ctx) is out
    np.testing.assert_array_equal(out, first)
    assert fused.fused_conv(x1, w, b, **attrs, out=x1[:, :, :, :], ctx=ctx) is not x1
    # another input shape
    x2 = rng.standard_normal((3, 4, 5, 7), dtype=np.float32)
    got = fused.fused_conv(x2, w, b, **attrs, ctx=ctx)
    np.testing.assert_allclose(got, np.maximum(_conv_ref(x2, w, b, attrs["pads"], group), 0), rtol=1e-5, atol=1e-5)
    # another dtype with the first shape: the numpy path, not the float32 call prepared for it
    got64 = fused.fused_conv(x1.astype(np.float64), w.astype(np.float64), b.astype(np.float64), **attrs, ctx=ctx)
    assert got64.dtype == np.float64
    np.testing.assert_allclose(got64, first, rtol=1e-5, atol=1e-5)
    # new weights (another object) with the first shape
    w2 = w * 2
    np.testing.assert_allclose(fused.fused_conv(x1, w2, b, **attrs, ctx=ctx),
                               np.maximum(_conv_ref(x1, w2, b, attrs["pads"], group), 0), rtol=1e-5, atol=1e-5)
    # a residual now: its own call
    z = rng.standard_normal(first.shape, dtype=np.float32)
    np.testing.assert_allclose(fused.fused_conv(x1, w, b, z, **attrs, ctx=ctx),
                               np.maximum(_conv_ref(x1, w, b, attrs["pads"], group) + z, 0), rtol=1e-5, atol=1e-5)
    # bad input after the cache is warm still raises
    with pytest.raises(ValueError):
        fused.fused_conv(rng.standard_normal((1, 3, 8, 8), dtype=np.float32), w, b, **attrs, ctx=ctx)
    # the numpy path when the native kernels are turned off, even for a prepared shape
    with numpy_path():
        np.testing.assert_allclose(fused.fused_conv(x1, w, b, **attrs, ctx=ctx), first, rtol=1e-5, atol=1e-5)


def test_conv_prepared_call_depthwise_and_dense():
    rng = np.random.default_rng(1)
    for w_shape, group in (((6, 1, 3, 3), 6), ((5, 6, 1, 1), 1)):
        w = _const(rng.standard_normal(w_shape, dtype=np.float32))
        b = _const(rng.standard_normal(w_shape[0], dtype=np.float32))
        ctx = _ctx("Conv")
        for shape in ((1, 6, 9, 9), (1, 6, 9, 9), (2, 6, 4, 11), (1, 6, 9, 9)):
            x = rng.standard_normal(shape, dtype=np.float32)
            got = nn.conv(x, w, b, pads=(1, 0, 1, 0), strides=(2, 1), group=group, ctx=ctx)
            want = nn.conv(x, w, b, pads=(1, 0, 1, 0), strides=(2, 1), group=group)
            np.testing.assert_array_equal(got, want)
        with pytest.raises(ValueError):
            nn.conv(x, w[:, :, 0], b, group=group, ctx=ctx)  # weight rank no longer matches


def test_max_pool_prepared_geometry_and_out(threads):
    rng = np.random.default_rng(2)
    ctx = _ctx("MaxPool")
    for shape in ((1, 3, 8, 8), (1, 3, 8, 8), (2, 5, 7, 9)):
        x = rng.standard_normal(shape, dtype=np.float32)
        for k, s in (((2, 2), (2, 2)), ((3, 3), (1, 1))):
            ctx.memo.clear()  # one geometry per node: each window is its own node here
            got = nn.max_pool_10(x, kernel_shape=k, strides=s, ctx=ctx)
            again = nn.max_pool_10(x, kernel_shape=k, strides=s, ctx=ctx)
            with numpy_path():
                want = nn.max_pool_10(x, kernel_shape=k, strides=s)
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(again, want)
            out = np.empty_like(want)
            assert nn.max_pool_10(x, kernel_shape=k, strides=s, out=out, ctx=ctx) is out
            np.testing.assert_array_equal(out, want)
            assert nn.max_pool_10(x, kernel_shape=k, strides=s, out=np.empty((1,), np.float32), ctx=ctx).shape == \
                want.shape  # a buffer that does not fit is not used
    x64 = rng.standard_normal((1, 3, 8, 8))
    np.testing.assert_array_equal(nn.max_pool_10(x64, kernel_shape=(2, 2), strides=(2, 2), ctx=ctx),
                                  nn.max_pool_10(x64, kernel_shape=(2, 2), strides=(2, 2)))


@pytest.mark.parametrize("pool", [None, ((2, 2), (2, 2))])
def test_qconv_prepared_call_revalidates(pool, threads):
    rng = np.random.default_rng(3)
    w = _const(rng.integers(-127, 128, (8, 4, 3, 3), dtype=np.int8))
    wsc = _const(rng.random(8, dtype=np.float32) * 0.01 + 0.001)
    b = _const(rng.standard_normal(8, dtype=np.float32))
    xsc, xzp = np.float32(0.02), np.uint8(128)
    kw = dict(pads=(1, 1, 1, 1), activation="Relu")
    if pool is not None:
        kw.update(pool_kernel_shape=pool[0], pool_strides=pool[1])
    ctx = _ctx("QConv")
    x1 = rng.standard_normal((1, 4, 8, 8), dtype=np.float32)
    first = qlinear.qconv(x1, xsc, xzp, w, wsc, b, **kw, ctx=ctx)
    np.testing.assert_array_equal(first, qlinear.qconv(x1, xsc, xzp, w, wsc, b, **kw))
    np.testing.assert_array_equal(qlinear.qconv(x1, xsc, xzp, w, wsc, b, **kw, ctx=ctx), first)
    out = np.empty_like(first)
    assert qlinear.qconv(x1, xsc, xzp, w, wsc, b, **kw, out=out, ctx=ctx) is out
    np.testing.assert_array_equal(out, first)
    # another shape, a uint8 (already quantized) input, new weights, a new input scale
    x2 = rng.standard_normal((2, 4, 6, 10), dtype=np.float32)
    np.testing.assert_array_equal(qlinear.qconv(x2, xsc, xzp, w, wsc, b, **kw, ctx=ctx),
                                  qlinear.qconv(x2, xsc, xzp, w, wsc, b, **kw))
    xq = np.clip(np.rint(x1 / xsc) + 128, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(qlinear.qconv(xq, xsc, xzp, w, wsc, b, **kw, ctx=ctx),
                                  qlinear.qconv(xq, xsc, xzp, w, wsc, b, **kw))
    w2 = -w
    np.testing.assert_array_equal(qlinear.qconv(x1, xsc, xzp, w2, wsc, b, **kw, ctx=ctx),
                                  qlinear.qconv(x1, xsc, xzp, w2, wsc, b, **kw))
    xsc2 = np.float32(0.05)
    np.testing.assert_array_equal(qlinear.qconv(x1, xsc2, xzp, w, wsc, b, **kw, ctx=ctx),
                                  qlinear.qconv(x1, xsc2, xzp, w, wsc, b, **kw))
    with pytest.raises(ValueError, match="W must be int8"):
        qlinear.qconv(x1, xsc, xzp, w.astype(np.int16), wsc, b, **kw, ctx=ctx)


def test_qmatmul_prepared_call_with_flatten_revalidates():
    rng = np.random.default_rng(4)
    b = _const(rng.integers(-127, 128, (5, 24), dtype=np.int8))
    bs = _const(rng.random(5, dtype=np.float32) * 0.01 + 0.001)
    bias = _const(rng.standard_normal(5, dtype=np.float32))
    args = (np.float32(0.02), np.uint8(128), b, bs, bias)
    kw = dict(transB=1, activation="Relu", flatten_axis=1)
    ctx = _ctx("QMatMul")
    for shape in ((1, 4, 2, 3), (1, 4, 2, 3), (3, 6, 4), (1, 4, 2, 3)):
        a = rng.standard_normal(shape, dtype=np.float32)
        got = qlinear.qmatmul(a, *args, **kw, ctx=ctx)
        np.testing.assert_array_equal(got, qlinear.qmatmul(a, *args, **kw))
        assert got.shape == (shape[0], 5)
    z = rng.standard_normal((1, 5), dtype=np.float32)
    a = rng.standard_normal((1, 4, 2, 3), dtype=np.float32)
    np.testing.assert_array_equal(qlinear.qmatmul(a, *args[:5], z, **kw, ctx=ctx),
                                  qlinear.qmatmul(a, *args[:5], z, **kw))
    with pytest.raises(ValueError, match="2-D int8"):
        qlinear.qmatmul(a, args[0], args[1], b.astype(np.float32), bs, bias, **kw, ctx=ctx)


@pytest.mark.parametrize("rows", [1, 3, 4, 9])
@pytest.mark.parametrize("activation", ["", "Relu", "Sigmoid"])
def test_gemm_prepared_product_small_and_large_rows(rows, activation, threads):
    """Fewer than 4 rows: BLAS's product plus the native epilogue; more: the native GEMM.  Both
    against numpy, with the prepared product on later calls and its inputs checked by identity."""
    rng = np.random.default_rng(5)
    b = _const(rng.standard_normal((7, 33), dtype=np.float32))  # transB: (N, K)
    c = _const(rng.standard_normal((1, 7), dtype=np.float32))
    ctx = _ctx("FusedGemm")
    ref_act = {"": lambda v: v, "Relu": lambda v: np.maximum(v, 0), "Sigmoid": lambda v: 1 / (1 + np.exp(-v))}
    for i in range(3):
        a = rng.standard_normal((rows, 33), dtype=np.float32)
        got = fused.fused_gemm(a, b, c, transB=1, activation=activation, ctx=ctx)
        want = ref_act[activation](a.astype(np.float64) @ b.T.astype(np.float64) + c)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        if i == 0:
            assert ctx.memo, "the product was not kept"
    b2 = b[::-1].copy()  # new weights: not the prepared product's
    got = fused.fused_gemm(a, b2, c, transB=1, activation=activation, ctx=ctx)
    np.testing.assert_allclose(got, ref_act[activation](a.astype(np.float64) @ b2.T + c), rtol=1e-5, atol=1e-5)
    # transA: not kept, still right
    at = np.ascontiguousarray(a.T)
    np.testing.assert_allclose(fused.fused_gemm(at, b, c, transA=1, transB=1, activation=activation, ctx=_ctx("G")),
                               ref_act[activation](a.astype(np.float64) @ b.T + c), rtol=1e-5, atol=1e-5)
    # the standard Gemm, with C as a row of biases and without C; a wrong inner size still raises
    gctx = _ctx("Gemm")
    for cc in (c, None):
        for _ in range(2):
            got = linalg.gemm_7(a, b, cc, transB=1, ctx=gctx)
            np.testing.assert_allclose(got, a.astype(np.float64) @ b.T + (0 if cc is None else cc), rtol=1e-5,
                                       atol=1e-5)
    with pytest.raises(ValueError, match="inner dimensions"):
        linalg.gemm_7(a[:, :5], b, c, transB=1, ctx=gctx)
    out = np.empty((rows, 7), np.float32)
    assert linalg.gemm_7(a, b, c, transB=1, out=out, ctx=gctx) is out
    with numpy_path():
        np.testing.assert_allclose(linalg.gemm_7(a, b, c, transB=1, ctx=gctx), out, rtol=1e-5, atol=1e-5)


def test_matmul_prepared_product_and_batched_operands():
    rng = np.random.default_rng(6)
    b = _const(rng.standard_normal((12, 5), dtype=np.float32))
    ctx = _ctx("MatMul")
    for shape in ((2, 12), (2, 12), (3, 6, 12), (2, 12)):
        a = rng.standard_normal(shape, dtype=np.float32)
        np.testing.assert_allclose(linalg.matmul(a, b, ctx=ctx), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    b3 = rng.standard_normal((3, 12, 5), dtype=np.float32)  # batched: not prepared, still right
    np.testing.assert_allclose(linalg.matmul(a, b3, ctx=ctx), a.astype(np.float64) @ b3, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(linalg.matmul(a, b.T.copy().T, ctx=ctx), a.astype(np.float64) @ b, rtol=1e-5,
                               atol=1e-5)  # an F-ordered B: another object, read transposed
