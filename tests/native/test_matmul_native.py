"""Native float GEMM for MatMul/Gemm/FusedMatMul/FusedGemm (batched, transposed B, Gelu
epilogues) and the one-call int8 QConv/QMatMul paths, against the numpy kernels."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import fused, linalg, qlinear
from tests.native.conftest import numpy_path


def _close(got, ref, tol=1e-4):
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * max(1.0, float(np.abs(ref).max())))


@pytest.mark.parametrize("shape_a,shape_b", [
    ((64, 128), (128, 96)), ((5, 7), (7, 9)), ((1, 64, 33), (33, 20)), ((2, 4, 64, 32), (2, 4, 32, 64)),
    ((4, 6, 5), (5, 7)), ((1, 6, 5), (3, 5, 7)), ((3, 6, 5), (1, 5, 7)), ((6, 5), (3, 5, 7)), ((2, 8), (8, 3)),
])
@pytest.mark.parametrize("transposed", [False, True])
def test_matmul(shape_a, shape_b, transposed, isa, threads):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape_a, dtype=np.float32)
    b = rng.standard_normal(shape_b, dtype=np.float32)
    if transposed:  # a transposed view, read as stored (transB packing)
        b = np.swapaxes(np.ascontiguousarray(np.swapaxes(b, -1, -2)), -1, -2)
    got = linalg.matmul(a, b)
    with numpy_path():
        ref = linalg.matmul(a, b)
    _close(got, ref)


@pytest.mark.parametrize("activation", ["", "Relu", "Gelu", "GeluTanh", "HardSwish", "LeakyRelu", "Tanh", "Sigmoid"])
@pytest.mark.parametrize("residual", ["none", "full", "row"])
def test_fused_matmul(activation, residual, isa, threads):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 40, 24), dtype=np.float32) * 2
    b = rng.standard_normal((24, 50), dtype=np.float32)
    bias = rng.standard_normal(50, dtype=np.float32)
    z = {"none": None, "full": rng.standard_normal((1, 40, 50), dtype=np.float32),
         "row": rng.standard_normal(50, dtype=np.float32)}[residual]
    params = (0.1,) if activation == "LeakyRelu" else ()
    got = fused.fused_matmul(a, b, bias, z, activation=activation, activation_params=params)
    with numpy_path():
        ref = fused.fused_matmul(a, b, bias, z, activation=activation, activation_params=params)
    _close(got, ref)


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (30,), (1, 30), (20, 30)])
def test_gemm(trans_b, c_shape, isa, threads):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((20, 16), dtype=np.float32)
    b = rng.standard_normal((30, 16) if trans_b else (16, 30), dtype=np.float32)
    c = None if c_shape is None else rng.standard_normal(c_shape, dtype=np.float32)
    for fn, kw in ((linalg.gemm_7, {}), (fused.fused_gemm, {"activation": "Relu"})):
        got = fn(a, b, c, transB=trans_b, **kw)
        with numpy_path():
            ref = fn(a, b, c, transB=trans_b, **kw)
        _close(got, ref)


def test_gelu_epilogue_accuracy(isa):
    x = np.linspace(-12, 12, 20001, dtype=np.float32).reshape(1, 1, -1)
    for act, name in ((native.ACTIVATION_CODES["Gelu"], "Gelu"), (native.ACTIVATION_CODES["GeluTanh"], "GeluTanh")):
        y = x.copy()
        native.bias_act(y, None, None, act)
        ref = fused.apply_activation(x.astype(np.float64), name, ())
        assert np.max(np.abs(y - ref)) < 2e-6


def test_gelu_tanh_far_left_gives_no_subnormals(isa):
    """Below x = -10 exp(-2u) reaches its clamp (exp(88)): Gelu (tanh) is x / (1 + e) there, about
    -6e-38 and normal, never x times a subnormal 1 / (1 + e) (each such product cost a microcode assist:
    magika's Gelu after its conv 3.3x slower).  Standalone (mrt_activation_f32) and as an epilogue."""
    x = np.linspace(-200, -9, 4001, dtype=np.float32)
    ref = fused.apply_activation(x.astype(np.float64), "GeluTanh", ())
    tiny = np.finfo(np.float32).tiny
    code = native.ACTIVATION_CODES["GeluTanh"]
    standalone = np.empty_like(x)
    native.activation(code, 0.0, 0.0, x, standalone)
    epilogue = x.reshape(1, 1, -1).copy()
    native.bias_act(epilogue, None, None, code)
    for y in (standalone, epilogue.reshape(-1)):
        assert not np.any((y != 0) & (np.abs(y) < tiny)), "subnormal results"
        # (the float64 reference's 1 + tanh(u) rounds to 0 from x = -9.2: atol covers its zeros)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-26)


@pytest.mark.parametrize("rows", [(1,), (3,), (2, 70), (360,)])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("quant", ["u8", "s8", "dynamic"])
def test_qmatmul_one_call(rows, trans_b, quant, isa, threads):
    rng = np.random.default_rng(3)
    k, n = 37, 29
    a = rng.standard_normal(rows + (k,), dtype=np.float32)
    b = rng.integers(-127, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    bs = rng.uniform(0.001, 0.01, n).astype(np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    xs, xz = {"u8": (np.float32(0.02), np.uint8(128)), "s8": (np.float32(0.03), np.int8(3)),
              "dynamic": (None, None)}[quant]
    for z in (None, rng.standard_normal(rows + (n,), dtype=np.float32)):
        for act in ("", "Relu", "HardSwish", "Tanh"):
            got = qlinear.qmatmul(a, xs, xz, b, bs, bias, z, transB=trans_b, activation=act)
            with numpy_path():
                ref = qlinear.qmatmul(a, xs, xz, b, bs, bias, z, transB=trans_b, activation=act)
            _close(got, ref)


@pytest.mark.parametrize("geom", [(2, 8, 9, 9, 16, 3, 1, 1, 1), (1, 1, 8, 8, 16, 3, 1, 1, 1),
                                  (1, 8, 10, 10, 8, 1, 1, 0, 1), (1, 8, 10, 10, 12, 3, 2, 1, 2),
                                  (3, 4, 7, 7, 6, 1, 2, 0, 1)])
@pytest.mark.parametrize("quant", ["u8", "s8", "dynamic"])
def test_qconv_one_call(geom, quant, isa, threads):
    n, c, h, w, m, k, s, p, g = geom
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wq = rng.integers(-127, 128, (m, c // g, k, k)).astype(np.int8)
    ws = rng.uniform(0.001, 0.01, m).astype(np.float32)
    bias = rng.standard_normal(m, dtype=np.float32)
    xs, xz = {"u8": (np.float32(0.02), np.uint8(100)), "s8": (np.float32(0.03), np.int8(-3)),
              "dynamic": (None, None)}[quant]
    kw = dict(group=g, pads=(p, p, p, p), strides=(s, s))
    for act in ("", "Relu", "HardSwish", "Gelu"):
        got = qlinear.qconv(x, xs, xz, wq, ws, bias, None, activation=act, **kw)
        with numpy_path():
            ref = qlinear.qconv(x, xs, xz, wq, ws, bias, None, activation=act, **kw)
        _close(got, ref)
        z = rng.standard_normal(got.shape, dtype=np.float32)
        got = qlinear.qconv(x, xs, xz, wq, ws, bias, z, activation=act, **kw)
        with numpy_path():
            ref = qlinear.qconv(x, xs, xz, wq, ws, bias, z, activation=act, **kw)
        _close(got, ref)


@pytest.mark.parametrize("shape", [(1, 30), (3, 30), (1, 2, 30), (2, 1, 30)])
def test_few_rows_with_bias_residual_and_activation(shape, isa):
    """Products of 1-3 rows (BLAS's product, then bias per column, residual of the product's shape
    and activation over the whole array) against numpy, with a 3-D ``a`` too."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal(shape, dtype=np.float32)
    b = rng.standard_normal((30, 1000), dtype=np.float32)  # one row of a large B stays on BLAS
    bias = rng.standard_normal(1000, dtype=np.float32)
    z = rng.standard_normal(shape[:-1] + (1000,), dtype=np.float32)
    for act, ref_act in (("", lambda v: v), ("Relu", lambda v: np.maximum(v, 0))):
        got = fused.fused_matmul(a, b, bias, z, activation=act)
        want = ref_act(a.astype(np.float64) @ b + bias + z)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


# Geometries whose split over threads is uneven unless chosen with care (sgemm_run's blocking
# search, mrt_parallel_for's chunks): 392 panels of 32 columns, 25 panels (784 columns), 7
# panels with 32 rows, a tall thin product, a one-row product streaming a 512 x 1000 B.
@pytest.mark.parametrize("m,k,n", [(32, 16, 12544), (128, 64, 784), (256, 128, 196), (1000, 24, 40), (1, 512, 1000)])
def test_sgemm_result_does_not_depend_on_threads(m, k, n, isa):
    """Every thread count (and a repeated call, which reuses the remembered blocking) gives the
    same bits, and they match numpy's product (float64 reference, float32 tolerance)."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64) + bias
    packed = native.sgemm_pack_b(b, 0, n, k, n, b)
    before = native.threads()
    results = {}
    try:
        for t in (1, 2, 3, 4, 2):
            native.set_threads(t)
            c = np.empty((m, n), np.float32)
            native.sgemm(a, b, c, bias=bias, bias_mode=2)
            c_pb = np.empty((m, n), np.float32)
            native.sgemm_pb(a, m, n, k, packed, c_pb, bias=bias)
            results.setdefault("sgemm", []).append(c)
            results.setdefault("sgemm_pb", []).append(c_pb)
    finally:
        native.set_threads(before)
    for name, outs in results.items():
        np.testing.assert_allclose(outs[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(), err_msg=name)
        for t, c in zip((2, 3, 4, 2), outs[1:]):
            assert np.array_equal(c, outs[0]), f"{name} with {t} threads differs from 1 thread"
