"""The dense convolution path of mrt_conv2d_f32: one output pixel whose window is the whole unpadded
input (the squeeze-excite convs of MobileNetV3 / EfficientNet / RegNet on a 1 x 1 input, a classifier
written as a k x k conv over a k x k input) runs as the weight matrix times each image's input vector:
sgemv for a few images, the GEMM with transposed weights for more or with a residual.  Checked against
numpy written independently (a float64 product), and against the sgemv call it must be (bit-identical),
on every ISA this CPU has."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.format import packed_weights
from minirt.kernels import nn
from tests.native.conftest import numpy_path
from tests.native.test_native_kernels import _np_act

pytestmark = pytest.mark.skipif(not native.available, reason="native conv not available")

# (C, M, kernel = input size, dilation): 1 x 1 squeeze / excite shapes of the real models, a deep one,
# a K not a multiple of the vector width, M not a multiple of the 8 dot products per work item, and a
# 3 x 3 / 7 x 7 window over the whole input
DENSE = [
    (440, 110, 1, 1),  # RegNetY-400MF se fc1
    (110, 440, 1, 1),  # RegNetY-400MF se fc2
    (960, 240, 1, 1),  # MobileNetV3-Large se fc1
    (13, 5, 1, 1),
    (7, 19, 3, 1),
    (64, 100, 7, 1),
]
ACTS = [("", ()), ("Relu", ()), ("HardSigmoid", (0.2, 0.5)), ("Sigmoid", ()), ("SiLU", ())]


def _case(c, m, k, batch, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, c, k, k), dtype=np.float32)
    w = rng.standard_normal((m, c, k, k), dtype=np.float32) / np.float32(np.sqrt(c * k * k))
    b = rng.standard_normal(m, dtype=np.float32)
    return x, w, b


def _expected(x, w, b, z, act, params):
    n, m = x.shape[0], w.shape[0]
    y = x.reshape(n, -1).astype(np.float64) @ w.reshape(m, -1).astype(np.float64).T + b
    if z is not None:
        y += z.reshape(n, m)
    return _np_act(y, act, params).reshape(n, m, 1, 1)


@pytest.mark.parametrize("geom", DENSE, ids=lambda g: "c{}m{}k{}".format(*g[:3]))
@pytest.mark.parametrize("batch", [1, 3, 8, 9, 20])  # sgemv up to 8 images, the GEMM beyond
@pytest.mark.parametrize("residual", [False, True])  # a residual always takes the GEMM
def test_dense_conv_matches_numpy(geom, batch, residual, every_isa, threads):
    c, m, k, _ = geom
    x, w, b = _case(c, m, k, batch, seed=c + m + batch)
    act, params = ACTS[(DENSE.index(geom) + batch) % len(ACTS)]
    z = np.random.default_rng(1).standard_normal((batch, m, 1, 1), dtype=np.float32) if residual else None
    got = nn.conv_fused_native(x, w, b, z, activation=act, activation_params=params)
    assert got is not None and got.shape == (batch, m, 1, 1) and got.dtype == np.float32
    np.testing.assert_allclose(got, _expected(x, w, b, z, act, params), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("batch", [1, 8])
def test_dense_conv_is_the_sgemv_of_the_weights(batch, every_isa):
    """Up to 8 images and no residual, the conv is exactly mrt_sgemv_f32 of the images with the weight rows
    (transb): same sums in the same order, so bit-identical, whatever the thread count."""
    c, m = 440, 110
    x, w, b = _case(c, m, 1, batch, seed=5)
    relu = native.ACTIVATION_CODES["Relu"]
    expected = np.empty((batch, m), np.float32)
    native.sgemv(x.reshape(batch, c), batch, m, c, w.reshape(m, c), c, 1, expected, b, relu)
    for nthreads in (1, 2, 3):
        before = native.threads()
        native.set_threads(nthreads)
        try:
            got = nn.conv_fused_native(x, w, b, activation="Relu")
        finally:
            native.set_threads(before)
        np.testing.assert_array_equal(got.reshape(batch, m), expected)


def test_windows_that_are_not_the_whole_input_keep_the_conv_path():
    """Padding, a stride over a larger input, or a window smaller than the input: not dense (each of these
    also has one output pixel); the results still match numpy's Conv."""
    rng = np.random.default_rng(3)
    cases = [  # (input size, kernel, pads, stride)
        (1, 3, (1, 1, 1, 1), 1),  # a 3 x 3 kernel over a padded 1 x 1 input
        (2, 1, (0, 0, 0, 0), 2),  # a strided 1 x 1 kernel over 2 x 2
        (4, 3, (0, 0, 0, 0), 2),  # a 3 x 3 window over 4 x 4, stride 2: one output of a larger input
    ]
    for size, k, pads, s in cases:
        x = rng.standard_normal((1, 6, size, size), dtype=np.float32)
        w = rng.standard_normal((5, 6, k, k), dtype=np.float32)
        b = rng.standard_normal(5, dtype=np.float32)
        attrs = dict(pads=pads, strides=(s, s))
        got = nn.conv_fused_native(x, w, b, **attrs)
        with numpy_path():
            expected = nn.conv(x, w, b, **attrs)
        assert got.shape == (1, 5, 1, 1)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)


def test_a_1x1_conv_onto_one_pixel_gets_no_packed_weights():
    """The dense path reads the weights as stored: neither the native rule nor the builder's copy of it
    packs them (packed_weights.conv_uses_packed_w), on panels of 16 (AVX2) or 32 (AVX-512)."""
    for nr in (16, 32):
        for c, m in [(1152, 48), (960, 256), (512, 1024)]:
            assert not packed_weights.conv_uses_packed_w(c, m, 1, 1, 1, 1, 1, 1, 1, nr)
    geometry = native._geometry(1, 1152, 0, 0, (1, 1), (1, 1), out=(1, 1), m=48, group=1)
    assert not native._lib.mrt_conv2d_uses_packed_w(geometry)
