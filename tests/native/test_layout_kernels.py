"""The data-movement kernels of layout_impl.h (nearest upsampling, plane means, ConvTranspose
with stride == kernel) against independent numpy references, on every ISA and with 1-3 threads."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import fused, nn, tensor
from tests.native.conftest import numpy_path

pytestmark = pytest.mark.skipif(not native.available,
                                reason="native layout kernels not available")


def _rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- Resize nearest, integer factors


@pytest.mark.parametrize("shape,fh,fw", [((1, 96, 10, 10), 2, 2), ((2, 3, 5, 7), 2, 2), ((1, 2, 3, 3), 8, 8),
                                         ((1, 4, 5, 3), 3, 1), ((1, 4, 3, 5), 1, 3), ((2, 1, 1, 1), 4, 2),
                                         ((3, 7), 2, 5), ((2, 2, 2, 3, 4), 2, 3)])
def test_resize_nearest_upsample(every_isa, threads, shape, fh, fw):
    x = _rand(shape)
    scales = np.array([1.0] * (len(shape) - 2) + [fh, fw], dtype=np.float32)
    y = tensor.resize_11(x, None, scales, coordinate_transformation_mode="asymmetric", mode="nearest",
                         nearest_mode="floor")
    ref = np.repeat(np.repeat(x, fh, axis=-2), fw, axis=-1)
    assert y.dtype == np.float32 and y.flags.c_contiguous and np.array_equal(y, ref)


def test_resize_nearest_upsample_strided_input(every_isa):
    x = _rand((1, 4, 6, 10))[:, ::2, :, 1::2]  # a non-contiguous view
    y = tensor.resize_11(x, None, np.array([1, 1, 2, 2], np.float32), coordinate_transformation_mode="asymmetric",
                         mode="nearest", nearest_mode="floor")
    assert np.array_equal(y, np.repeat(np.repeat(x, 2, axis=-2), 2, axis=-1))


@pytest.mark.parametrize("coord,nearest", [("asymmetric", "round_prefer_ceil"), ("half_pixel", "round_prefer_floor"),
                                           ("align_corners", "floor"), ("pytorch_half_pixel", "ceil")])
def test_resize_nearest_other_modes_match_numpy_path(every_isa, coord, nearest):
    # whichever of these reduce to repetition take the native pass; the others fall back to the general
    # code: both must agree with the numpy implementation bit for bit
    x = _rand((1, 3, 5, 6))
    for scales in ([1, 1, 2, 2], [1, 1, 3, 2], [1, 1, 2.5, 2], [1, 1, 1, 4]):
        s = np.array(scales, np.float32)
        kw = dict(coordinate_transformation_mode=coord, mode="nearest", nearest_mode=nearest)
        y = tensor.resize_11(x, None, s, **kw)
        with numpy_path():
            ref = tensor.resize_11(x, None, s, **kw)
        assert y.shape == ref.shape and np.array_equal(y, ref)


def test_resize_nearest_asymmetric_floor_general_reference(every_isa):
    # independent reference: out[i] = in[floor(i / scale)] (asymmetric, floor)
    x = _rand((1, 2, 4, 7))
    y = tensor.resize_11(x, None, np.array([1, 1, 2, 3], np.float32), coordinate_transformation_mode="asymmetric",
                         mode="nearest", nearest_mode="floor")
    ri = np.floor(np.arange(8) / 2.0).astype(int)
    ci = np.floor(np.arange(21) / 3.0).astype(int)
    assert np.array_equal(y, x[:, :, ri][:, :, :, ci])


# --------------------------------------------------------------------------- GlobalAveragePool


@pytest.mark.parametrize("shape", [(1, 96, 80, 80), (2, 5, 3, 3), (1, 7, 1, 1), (1, 3, 4, 4), (3, 2, 17),
                                   (1, 2, 3, 5, 7), (1, 384, 10, 10)])
def test_global_average_pool(every_isa, threads, shape):
    x = _rand(shape) * 100 + 1000  # a large common offset: float32 sums must still be accurate
    y = nn.global_average_pool(x)
    ref = x.astype(np.float64).mean(axis=tuple(range(2, x.ndim)), keepdims=True)
    assert y.shape == ref.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=2e-7 * np.sqrt(max(1, x[0, 0].size)), atol=0)


def test_global_average_pool_non_float32_and_views():
    x = _rand((1, 4, 6, 6))
    np.testing.assert_allclose(nn.global_average_pool(x[:, :, ::2, ::2]),
                               x[:, :, ::2, ::2].astype(np.float64).mean(axis=(2, 3), keepdims=True), rtol=1e-6)
    x16 = x.astype(np.float16)
    assert nn.global_average_pool(x16).dtype == np.float16
    assert nn.global_average_pool(x.astype(np.float64)).dtype == np.float64


# --------------------------------------------------------------------------- ConvTranspose, stride == kernel


def _conv_transpose_tiles_reference(x, w, b):
    """Each input pixel's kh x kw tile: out[n, m, i*kh + u, j*kw + v] = sum_c x[n, c, i, j] w[c, m, u, v] + b[m]."""
    n, c, h, wd = x.shape
    m, kh, kw = w.shape[1:]
    t = np.einsum("nchw,cmuv->nmhuwv", x.astype(np.float64), w.astype(np.float64))
    y = t.reshape(n, m, h * kh, wd * kw)
    return y if b is None else y + b.astype(np.float64).reshape(1, m, 1, 1)


# (x shape, weight shape): det's two heads, several bands with a partial last one
# (8*2*2*64 floats per input row -> 32-row bands over 70 rows), odd kernels, batch 2
TILE_CASES = [((1, 24, 20, 20), (24, 24, 2, 2)), ((1, 24, 40, 40), (24, 1, 2, 2)), ((1, 3, 70, 64), (3, 8, 2, 2)),
              ((2, 5, 7, 9), (5, 3, 3, 3)), ((1, 4, 6, 5), (4, 6, 1, 3)), ((2, 3, 5, 4), (3, 2, 2, 1)),
              ((1, 2, 1, 1), (2, 5, 4, 4))]


@pytest.mark.parametrize("xs,ws", TILE_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose_tiles(every_isa, threads, xs, ws, bias):
    x, w = _rand(xs, 1), _rand(ws, 2)
    b = _rand(ws[1], 3) if bias else None
    y = nn.conv_transpose(x, w, b, strides=ws[2:])
    ref = _conv_transpose_tiles_reference(x, w, b)
    assert y.shape == ref.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation,params,fn", [
    ("Relu", (), lambda v: np.maximum(v, 0)),
    ("Sigmoid", (), lambda v: 1 / (1 + np.exp(-v))),
    ("Clip", (-0.5, 0.5), lambda v: np.clip(v, -0.5, 0.5)),
    ("LeakyRelu", (0.1,), lambda v: np.where(v < 0, 0.1 * v, v)),
    ("Tanh", (), np.tanh),  # (the tiles kernel's epilogue: MRT_ACT_TANH)
])
@pytest.mark.parametrize("xs,ws", TILE_CASES[:3])
def test_fused_conv_transpose_activation(every_isa, threads, activation, params, fn, xs, ws):
    x, w, b = _rand(xs, 4), _rand(ws, 5), _rand(ws[1], 6)
    y = fused.fused_conv_transpose(x, w, b, strides=ws[2:], activation=activation, activation_params=params)
    np.testing.assert_allclose(y, fn(_conv_transpose_tiles_reference(x, w, b)), rtol=1e-5, atol=1e-5)


def test_fused_conv_transpose_general_path_activation():
    # pads: not the tile path; the activation is applied after the general col2im
    x, w, b = _rand((1, 3, 5, 5), 7), _rand((3, 2, 3, 3), 8), _rand(2, 9)
    y = fused.fused_conv_transpose(x, w, b, strides=(2, 2), pads=(1, 1, 1, 1), activation="Relu")
    ref = np.maximum(nn.conv_transpose(x, w, b, strides=(2, 2), pads=(1, 1, 1, 1)), 0)
    np.testing.assert_array_equal(y, ref)


def test_conv_transpose_tiles_numpy_fallback_matches():
    x, w, b = _rand((2, 6, 5, 7), 10), _rand((6, 4, 2, 2), 11), _rand(4, 12)
    y = nn.conv_transpose(x, w, b, strides=(2, 2))
    with numpy_path():
        ref = nn.conv_transpose(x, w, b, strides=(2, 2))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- MaxPool, stride 1


def _max_pool_s1_reference(x, k, pads):
    """Sliding-window maximum over a -inf padded copy (pads: top, left, bottom, right)."""
    pt, pl, pb, pr = pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=-np.inf)
    oh, ow = xp.shape[2] - k[0] + 1, xp.shape[3] - k[1] + 1
    y = np.full(x.shape[:2] + (oh, ow), -np.inf, dtype=x.dtype)
    for i in range(k[0]):
        for j in range(k[1]):
            y = np.maximum(y, xp[:, :, i:i + oh, j:j + ow])
    return y


@pytest.mark.parametrize("shape,k,pads", [((1, 128, 10, 10), (5, 5), (2, 2, 2, 2)), ((2, 3, 7, 9), (3, 3), (1, 1, 1, 1)),
                                          ((1, 2, 5, 6), (3, 2), (0, 1, 2, 0)), ((1, 3, 4, 4), (1, 1), (0, 0, 0, 0)),
                                          ((1, 2, 3, 17), (5, 5), (2, 2, 2, 2)), ((1, 4, 6, 5), (2, 4), (1, 3, 0, 0)),
                                          ((1, 2, 12, 11), (5, 5), (0, 0, 0, 0))])
def test_max_pool_stride1(every_isa, threads, shape, k, pads):
    x = _rand(shape)
    # ONNX pads are (top, left, bottom, right) for 2-D
    y = nn.max_pool_10(x, kernel_shape=k, pads=pads, strides=(1, 1))
    ref = _max_pool_s1_reference(x, k, pads)
    assert y.shape == ref.shape and np.array_equal(y, ref)


def test_max_pool_stride1_nan_and_auto_pad(every_isa):
    x = _rand((1, 3, 8, 8))
    x[0, 1, 3, 4] = np.nan
    y = nn.max_pool_10(x, kernel_shape=(3, 3), auto_pad="SAME_UPPER", strides=(1, 1))
    with numpy_path():
        ref = nn.max_pool_10(x, kernel_shape=(3, 3), auto_pad="SAME_UPPER", strides=(1, 1))
    assert np.array_equal(y, ref, equal_nan=True) and np.isnan(y[0, 1, 2:5, 3:6]).all()
    # ceil_mode is the identity at stride 1; dilation takes the general kernel
    for kw in (dict(ceil_mode=1), dict(dilations=(2, 2))):
        y = nn.max_pool_10(x, kernel_shape=(3, 3), pads=(1, 1, 1, 1), strides=(1, 1), **kw)
        with numpy_path():
            ref = nn.max_pool_10(x, kernel_shape=(3, 3), pads=(1, 1, 1, 1), strides=(1, 1), **kw)
        assert np.array_equal(y, ref, equal_nan=True)


# --------------------------------------------------------------------------- Concat and same-shape binary ops
# (mrt_copy_rows_f32 and mrt_binary_f32: the native passes of Concat / Add / Sub / Mul / Div into the memory
# plan's buffer, D32), against numpy


@pytest.mark.parametrize("shapes,axis", [([(1, 2, 3, 4), (1, 5, 3, 4), (1, 1, 3, 4)], 1),
                                         ([(3, 2, 5), (3, 2, 1), (3, 2, 7)], -1),
                                         ([(2, 3), (4, 3)], 0),
                                         ([(2, 4, 3, 3), (2, 4, 3, 3)], 1),  # batch 2: rows per image
                                         ([(1, 8, 2, 9), (1, 8, 5, 9)], 2),
                                         ([(2, 0, 3), (2, 4, 3)], 1)])  # an empty input
def test_concat_native_rows(every_isa, threads, shapes, axis):
    xs = [_rand(s, seed=i) for i, s in enumerate(shapes)]
    ref = np.concatenate(xs, axis=axis)
    out = np.full(ref.shape, np.nan, np.float32)
    y = tensor.concat(*xs, axis=axis, out=out)
    assert y is out and np.array_equal(y, ref)
    # not taken (the numpy path, same result): a non-contiguous input, no out buffer, float64
    xs2 = [np.asfortranarray(xs[0])] + xs[1:]
    assert np.array_equal(tensor.concat(*xs2, axis=axis, out=np.empty_like(ref)), ref)
    assert np.array_equal(tensor.concat(*xs, axis=axis), ref)
    x64 = [x.astype(np.float64) for x in xs]
    assert np.array_equal(tensor.concat(*x64, axis=axis, out=np.empty(ref.shape)), ref.astype(np.float64))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shape", [(1, 7), (2, 3, 33, 65), (3 * 4096 + 5,)])  # several 4096-value chunks
def test_binary_native_same_shape(every_isa, threads, op, shape):
    from minirt.kernels.registry import lookup

    fn = lookup("", op, 17).fn
    ufunc = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op]
    a, b = _rand(shape, 1), _rand(shape, 2)
    a.flat[:4] = [np.nan, np.inf, -np.inf, 0.0]
    b.flat[:4] = [1.0, np.inf, 2.0, 0.0]
    with np.errstate(all="ignore"):
        ref = ufunc(a, b)
        out = np.full(shape, 7.0, np.float32)
        y = fn(a, b, out=out)
        assert y is out
        np.testing.assert_array_equal(y, ref)  # (the same IEEE operation: equal bits, NaN where numpy's)
        inplace = a.copy()
        np.testing.assert_array_equal(fn(inplace, b, out=inplace), ref)  # out may be an input
        # broadcasting: the numpy ufunc, as before
        np.testing.assert_array_equal(fn(a, b.reshape(-1)[:1].reshape((1,) * len(shape)), out=np.empty_like(a)),
                                      ufunc(a, b.reshape(-1)[0]))
