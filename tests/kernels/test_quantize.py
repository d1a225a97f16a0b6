"""Quantization kernels through builder -> Session, compared with onnxruntime."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from tests.kernels.model_run import compare_node

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_per_tensor(dtype):
    x = (RNG.standard_normal((3, 4)) * 50).astype(np.float32)
    zp = np.array(3 if dtype in (np.uint8, np.uint16) else -2, dtype)
    compare_node("QuantizeLinear", [x, np.array(0.37, np.float32), zp], opset=21, rtol=0, atol=0)


def test_quantize_per_axis_and_dequantize():
    x = (RNG.standard_normal((2, 3, 4)) * 10).astype(np.float32)
    scale = np.array([0.1, 0.2, 0.05], np.float32)
    zp = np.array([0, 10, 250], np.uint8)
    compare_node("QuantizeLinear", [x, scale, zp], {"axis": 1}, opset=13, rtol=0, atol=0)
    q = RNG.integers(0, 255, (2, 3, 4)).astype(np.uint8)
    compare_node("DequantizeLinear", [q, scale, zp], {"axis": 1}, opset=13)


def test_blocked_quantize_dequantize():
    x = (RNG.standard_normal((3, 4)) * 10).astype(np.float32)
    scale = np.array([[0.5, 0.25], [0.1, 0.2], [1.0, 0.3]], np.float32)
    zp = np.array([[1, 2], [3, 4], [0, 128]], np.uint8)
    compare_node("QuantizeLinear", [x, scale, zp], {"axis": 1, "block_size": 2}, opset=21, rtol=0, atol=0,
                 engine="onnx-reference")
    q = RNG.integers(0, 255, (3, 4)).astype(np.uint8)
    compare_node("DequantizeLinear", [q, scale, zp], {"axis": 1, "block_size": 2}, opset=21, engine="onnx-reference")


def test_dequantize_int32_no_zero_point():
    q = RNG.integers(-1000, 1000, (5,)).astype(np.int32)
    compare_node("DequantizeLinear", [q, np.array(0.01, np.float32)], opset=13)


def test_dynamic_quantize_linear():
    x = (RNG.standard_normal((4, 5)) * 3).astype(np.float32)
    compare_node("DynamicQuantizeLinear", [x], n_outputs=3, opset=11, atol=1)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_matmul(dtype):
    lo, hi = (0, 255) if dtype == np.uint8 else (-128, 127)
    a = RNG.integers(lo, hi, (2, 3, 4)).astype(dtype)
    b = RNG.integers(lo, hi, (4, 5)).astype(dtype)
    inputs = [a, np.array(0.02, np.float32), np.array(3, dtype), b, np.array(0.03, np.float32), np.array(5, dtype),
              np.array(0.5, np.float32), np.array(7, dtype)]
    compare_node("QLinearMatMul", inputs, opset=10, rtol=0, atol=1)


def test_qlinear_conv_per_channel_with_bias():
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    inputs = [x, np.array(0.02, np.float32), np.array(100, np.uint8), w, np.array([0.01, 0.02, 0.03], np.float32),
              np.array([128, 128, 128], np.uint8), np.array(0.1, np.float32), np.array(10, np.uint8),
              RNG.integers(-100, 100, (3,)).astype(np.int32)]
    compare_node("QLinearConv", inputs, {"pads": [1, 1, 1, 1]}, opset=10, rtol=0, atol=1)


def test_conv_integer():
    x = RNG.integers(0, 255, (1, 2, 4, 4)).astype(np.uint8)
    w = RNG.integers(0, 255, (2, 2, 2, 2)).astype(np.uint8)
    compare_node("ConvInteger", [x, w, np.array(12, np.uint8), np.array(100, np.uint8)], {"strides": [2, 2]}, opset=10,
                 rtol=0, atol=0)


def _saturating_u8_s8(k):
    """u8 activations at 255 times s8 weights at 127 / -128: adjacent pairs of products sum past the int16 range
    (255*127*2 = 64770, 255*-128*2 = -65280), where onnxruntime's unoptimized kernels on x86-64 without VNNI
    saturate (tests/kernels/reference.py), so the reference is the onnx evaluator."""
    a = np.full((3, k), 255, np.uint8)
    a[1, ::3] = 0  # not every pair saturates: the exact sums are not all multiples of one product
    b = np.stack([np.full(k, 127), np.full(k, -128), np.where(np.arange(k) % 2, 127, -128), np.ones(k)], 1)
    return a, b.astype(np.int8)


@pytest.mark.parametrize("native_on", [True, False])
def test_integer_products_do_not_saturate(native_on):
    """MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv with u8 x s8 pair sums past int16 are exact
    (int32 accumulation, as the ONNX spec says) on the native kernels and on the numpy path."""
    from tests.native.conftest import numpy_path

    a, b = _saturating_u8_s8(8)
    x = np.full((1, 2, 3, 3), 255, np.uint8)
    x[0, 1, 1, :] = 7
    w = np.stack([np.full((2, 2, 2), 127, np.int8), np.full((2, 2, 2), -128, np.int8)])
    u8_0, s8_0 = np.array(0, np.uint8), np.array(0, np.int8)
    with contextlib.nullcontext() if native_on else numpy_path():
        compare_node("MatMulInteger", [a, b, u8_0, s8_0], opset=10, rtol=0, atol=0, engine="onnx-reference")
        # rint(exact * 0.5 * 0.0009) + 128 stays inside uint8 (|exact| <= 261120); saturated sums land ~half as far
        compare_node("QLinearMatMul", [a, np.array(0.5, np.float32), u8_0, b, np.array(0.0009, np.float32), s8_0,
                                       np.array(1.0, np.float32), np.array(128, np.uint8)],
                     opset=10, rtol=0, atol=0, engine="onnx-reference")
        compare_node("ConvInteger", [x, w, u8_0, s8_0], opset=10, rtol=0, atol=0, engine="onnx-reference")
        # the 3x3 image, 2x2x2 kernels: |sums| <= 8*255*128 = 261120, * 0.5 * 0.0009 inside uint8 around 128
        compare_node("QLinearConv", [x, np.array(0.5, np.float32), u8_0, w, np.array([0.0009, 0.0009], np.float32),
                                     np.array([0, 0], np.int8), np.array(1.0, np.float32), np.array(128, np.uint8)],
                     opset=10, rtol=0, atol=0, engine="onnx-reference")
