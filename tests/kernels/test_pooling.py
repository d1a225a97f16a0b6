"""LpPool / GlobalLpPool / MaxUnpool / DeformConv kernels compared against onnxruntime
(the onnx reference evaluator where onnxruntime lacks the op)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_elementwise import check, rand, reference, run_kernel

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 1, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]},
])
def test_lp_pool_2d(p, attrs):
    check("LpPool", [rand((2, 3, 7, 8))], dict(attrs, p=p), opset=11, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2], "dilations": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
])
def test_lp_pool_18(attrs):
    check("LpPool", [rand((1, 2, 8, 9))], attrs, opset=18, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(2, 3, 9), (1, 2, 4, 5, 6)])
def test_lp_pool_nd(shape):
    k = [3] * (len(shape) - 2)
    check("LpPool", [rand(shape)], {"kernel_shape": k}, opset=11, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_lp_pool(p, dtype):
    # Neither onnxruntime nor the onnx reference implements GlobalLpPool: compare
    # with onnxruntime's LpPool over a window covering the whole spatial extent.
    x = rand((2, 3, 4, 5), dtype)
    (expected,) = reference("LpPool", [x], {"p": p, "kernel_shape": [4, 5]}, opset=11)
    (actual,) = run_kernel("GlobalLpPool", [x], {"p": p}, opset=2)
    assert actual.dtype == expected.dtype and actual.shape == (2, 3, 1, 1)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def _pooled(shape, k, s):
    x = rand(shape)
    y, idx = run_kernel("MaxPool", [x], {"kernel_shape": k, "strides": s}, opset=12, n_outputs=2)
    return y, idx


def test_max_unpool_inverts_max_pool():
    y, idx = _pooled((2, 3, 6, 8), [2, 2], [2, 2])
    check("MaxUnpool", [y, idx], {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=11)


def test_max_unpool_output_shape():
    y, idx = _pooled((1, 2, 4, 4), [2, 2], [2, 2])
    out_shape = np.array([1, 2, 5, 5], np.int64)
    # onnxruntime scatters flat indices into the larger output; the ONNX
    # conformance data keep each value at its (n, c, h, w): compare with the spec's evaluator.
    check("MaxUnpool", [y, idx, out_shape], {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=11,
          engine="onnx-reference")


@pytest.mark.parametrize("case", [
    dict(x=(1, 2, 5, 6), w=(4, 2, 3, 3), attrs={}),
    dict(x=(2, 4, 6, 6), w=(6, 2, 3, 3), attrs={"group": 2, "offset_group": 2, "pads": [1, 1, 1, 1]}),
    dict(x=(1, 3, 7, 5), w=(2, 3, 2, 3), attrs={"strides": [2, 1], "dilations": [1, 2], "pads": [0, 1, 1, 0]}),
])
@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_conv(case, with_mask):
    x = rand(case["x"])
    w = rand(case["w"], low=-1, high=1)
    attrs = case["attrs"]
    # the output spatial size, taken from a plain Conv of the same geometry
    conv_attrs = {k: v for k, v in attrs.items() if k != "offset_group"}
    (conv,) = run_kernel("Conv", [x, w], conv_attrs, opset=11)
    out = conv.shape[2:]
    g = attrs.get("offset_group", 1)
    kp = case["w"][2] * case["w"][3]
    offset = RNG.uniform(-2, 2, size=(x.shape[0], g * kp * 2) + out).astype(np.float32)
    b = rand((case["w"][0],))
    inputs = [x, w, offset, b]
    if with_mask:
        inputs.append(RNG.uniform(0, 1, size=(x.shape[0], g * kp) + out).astype(np.float32))
    check("DeformConv", inputs, attrs, opset=19, rtol=1e-4, atol=1e-4)


def test_deform_conv_zero_offset_is_conv():
    x = rand((1, 2, 6, 6))
    w = rand((3, 2, 3, 3))
    offset = np.zeros((1, 18, 4, 4), np.float32)
    (y,) = run_kernel("DeformConv", [x, w, offset], {}, opset=19)
    (conv,) = run_kernel("Conv", [x, w], {}, opset=11)
    np.testing.assert_allclose(y, conv, rtol=1e-5, atol=1e-5)
