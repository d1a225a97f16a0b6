"""The repetition/tile fast paths of Resize (nearest, integer factors), ConvTranspose
(stride == kernel) and the stride-2 depthwise kernel agree with plain references."""
import numpy as np
import pytest

from minirt import native
from minirt.kernels import nn, tensor


@pytest.mark.parametrize("shape,fh,fw", [((1, 3, 5, 4), 2, 2), ((2, 2, 3, 3), 8, 8), ((1, 1, 2, 5), 1, 3),
                                         ((1, 2, 4, 3), 3, 1), ((3, 4), 2, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
@pytest.mark.parametrize("coord,nearest", [("asymmetric", "floor"), ("asymmetric", "round_prefer_floor"),
                                           ("half_pixel", "round_prefer_floor"), ("align_corners", "floor")])
def test_resize_nearest_repeat_matches_general(shape, fh, fw, dtype, coord, nearest):
    x = (np.random.default_rng(0).standard_normal(shape) * 10).astype(dtype)
    out = list(shape[:-2]) + [shape[-2] * fh, shape[-1] * fw]
    scales = [1.0] * (len(shape) - 2) + [float(fh), float(fw)]
    kw = dict(mode="nearest", coord_mode=coord, nearest_mode=nearest)
    fast = tensor._resize(x, out, scales, **kw)
    saved = tensor._repeat_factors
    try:
        tensor._repeat_factors = lambda *a: None
        ref = tensor._resize(x, out, scales, **kw)
    finally:
        tensor._repeat_factors = saved
    assert fast.dtype == ref.dtype and np.array_equal(fast, ref)
    assert not np.shares_memory(fast, x)


@pytest.mark.parametrize("xs,ws,bias", [((1, 6, 5, 4), (6, 3, 2, 2), True), ((2, 4, 3, 5), (4, 2, 3, 3), False),
                                        ((1, 3, 4, 4), (3, 1, 1, 2), True), ((1, 5, 2, 3), (5, 4, 2, 3), True)])
def test_conv_transpose_tiles_matches_reference(xs, ws, bias):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[1]).astype(np.float32) if bias else None
    kh, kw = ws[2:]
    y = nn.conv_transpose(x, w, b, strides=(kh, kw))
    n, c, h, wd = xs
    ref = np.zeros((n, ws[1], h * kh, wd * kw))
    for i in range(kh):
        for j in range(kw):
            ref[:, :, i::kh, j::kw] += np.einsum("nchw,cm->nmhw", x.astype(np.float64), w[:, :, i, j])
    if b is not None:
        ref += b.reshape(-1, 1, 1)
    assert y.shape == ref.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not native.available, reason="native kernels not built")
@pytest.mark.parametrize("c,h,w,k,p", [(3, 20, 20, 5, 2), (2, 9, 6, 5, 2), (4, 11, 8, 5, 0), (2, 7, 7, 7, 3),
                                       (3, 10, 9, 4, 1)])
def test_depthwise_stride2_large_kernel(c, h, w, k, p):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    y = nn.conv_fused_native(x, wt, b, activation="Relu", group=c, strides=(2, 2), pads=(p,) * 4)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    oh, ow = (h + 2 * p - k) // 2 + 1, (w + 2 * p - k) // 2 + 1
    ref = np.zeros((1, c, oh, ow))
    for i in range(k):
        for j in range(k):
            ref += xp[:, :, i:i + 2 * oh - 1:2, j:j + 2 * ow - 1:2] * wt[:, 0, i, j].reshape(1, c, 1, 1)
    ref = np.maximum(ref + b.reshape(1, c, 1, 1), 0)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_resize_repeat_plans_are_keyed_by_everything_that_decides_them():
    # a Resize node that is plain repetition remembers its plan; calls with other scales, sizes, modes
    # or shapes must not reuse it
    x = np.random.default_rng(3).standard_normal((1, 2, 3, 4)).astype(np.float32)
    kw = dict(coordinate_transformation_mode="asymmetric", mode="nearest", nearest_mode="floor")
    for _ in range(2):  # the second round runs from the remembered plans
        for s in ([1, 1, 2, 2], [1, 1, 3, 1], [1, 1, 2, 3]):
            y = tensor.resize_11(x, None, np.array(s, np.float32), **kw)
            assert np.array_equal(y, np.repeat(np.repeat(x, s[2], axis=2), s[3], axis=3))
        y = tensor.resize_11(x, None, None, np.array([1, 2, 6, 8], np.int64), **kw)
        assert np.array_equal(y, np.repeat(np.repeat(x, 2, axis=2), 2, axis=3))
        y = tensor.resize_11(x[:, :, :2], None, np.array([1, 1, 2, 2], np.float32), **kw)
        assert np.array_equal(y, np.repeat(np.repeat(x[:, :, :2], 2, axis=2), 2, axis=3))
        # 1.5x is not repetition: index floor(i / 1.5)
        y = tensor.resize_11(x, None, np.array([1, 1, 1.5, 1], np.float32), **kw)
        assert np.array_equal(y, x[:, :, np.floor(np.arange(4) / 1.5).astype(int)])
        # the same geometry in half_pixel/round_prefer_floor is repetition too; linear never is
        y = tensor.resize_11(x, None, np.array([1, 1, 2, 2], np.float32), mode="nearest")
        assert np.array_equal(y, np.repeat(np.repeat(x, 2, axis=2), 2, axis=3))
        y = tensor.resize_11(x, None, np.array([1, 1, 2, 2], np.float32), mode="linear",
                             coordinate_transformation_mode="asymmetric")
        assert not np.array_equal(y, np.repeat(np.repeat(x, 2, axis=2), 2, axis=3))


def test_resize_18_axes_list_repeats():
    x = np.random.default_rng(4).standard_normal((1, 2, 3, 4)).astype(np.float32)
    for axes in ([2, 3], (2, 3), [-2, -1]):
        for _ in range(2):
            y = tensor.resize_18(x, None, np.array([2, 3], np.float32), axes=axes,
                                 coordinate_transformation_mode="asymmetric", nearest_mode="floor")
            assert np.array_equal(y, np.repeat(np.repeat(x, 2, axis=2), 3, axis=3))
