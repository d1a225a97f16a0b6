"""Quantization kernels through builder -> Session, compared with onnxruntime."""
from __future__ import annotations

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
