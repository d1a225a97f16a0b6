"""Kernels of the smaller families (transformer, training losses, utility, spectral),
compared with onnxruntime or, for ops it lacks, the onnx reference evaluator."""
from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.model_run import compare_node

RNG = np.random.default_rng(11)


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("attrs", [{}, {"is_causal": 1}, {"is_causal": 1, "softcap": 2.0}])
def test_attention_4d(attrs):
    compare_node("Attention", [_f(2, 3, 4, 8), _f(2, 3, 6, 8), _f(2, 3, 6, 8)], attrs, opset=23, rtol=1e-5,
                 engine="onnx-reference")


def test_attention_3d_gqa_with_bool_mask():
    mask = RNG.random((4, 6)) > 0.3
    mask[:, 0] = True
    compare_node("Attention", [_f(2, 4, 32), _f(2, 6, 16), _f(2, 6, 16), mask],
                 {"q_num_heads": 4, "kv_num_heads": 2}, opset=23, rtol=1e-5, engine="onnx-reference")


def test_rms_normalization_and_rotary_embedding():
    compare_node("RMSNormalization", [_f(2, 3, 8), _f(8)], {"epsilon": 1e-5}, opset=23, engine="onnx-reference")
    pos = np.array([[0, 1, 2], [3, 4, 5]], np.int64)
    compare_node("RotaryEmbedding", [_f(2, 3, 3, 8), _f(6, 4), _f(6, 4), pos], {"interleaved": 1}, opset=23,
                 engine="onnx-reference")


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_losses(reduction):
    scores = _f(3, 5, 2)
    labels = RNG.integers(0, 5, (3, 2)).astype(np.int64)
    labels[0, 0] = -1
    weights = RNG.random(5).astype(np.float32)
    compare_node("SoftmaxCrossEntropyLoss", [scores, labels, weights], {"reduction": reduction, "ignore_index": -1},
                 n_outputs=2, opset=13, rtol=1e-5)
    compare_node("NegativeLogLikelihoodLoss", [scores, labels, weights], {"reduction": reduction, "ignore_index": -1},
                 opset=13, rtol=1e-5)


@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("axis", [None, 0])
def test_unique(sorted_, axis):
    x = np.array([[2, 1, 1], [3, 4, 3], [2, 1, 1]], np.float32)
    attrs = {"sorted": sorted_}
    if axis is not None:
        attrs["axis"] = axis
    compare_node("Unique", [x], attrs, n_outputs=4, opset=11)


def test_compress_reverse_sequence_det_center_crop_pad():
    compare_node("Compress", [_f(3, 4), np.array([True, False, True])], {"axis": 0}, opset=11)
    compare_node("Compress", [_f(3, 4), np.array([False, True, True, False, True])], opset=11)
    compare_node("ReverseSequence", [_f(4, 3, 2), np.array([4, 2, 1], np.int64)], {"batch_axis": 1, "time_axis": 0},
                 opset=10)
    compare_node("Det", [_f(2, 3, 3)], opset=11, rtol=1e-4)
    compare_node("CenterCropPad", [_f(5, 4, 3), np.array([3, 7], np.int64)], {"axes": [0, 1]}, opset=18)


def test_col2im():
    x = _f(1, 2 * 4, 9)  # C=2, block 2x2, 3x3 blocks over a 4x4 image
    compare_node("Col2Im", [x, np.array([4, 4], np.int64), np.array([2, 2], np.int64)], opset=18,
                 constant_inputs=(1, 2), rtol=1e-5)


def test_group_normalization_and_mvn():
    compare_node("GroupNormalization", [_f(2, 4, 3, 3), _f(4), _f(4)], {"num_groups": 2}, opset=21, rtol=1e-4,
                 atol=1e-5, engine="onnx-reference")
    compare_node("MeanVarianceNormalization", [_f(2, 3, 4, 4)], opset=13, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [{}, {"inverse": 1}, {"onesided": 1}])
def test_dft(attrs):
    x = _f(2, 8, 1) if attrs != {"inverse": 1} else _f(2, 8, 2)
    compare_node("DFT", [x], dict(attrs, axis=1), opset=17, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op, periodic):
    compare_node(op, [np.array(10, np.int64)], {"periodic": periodic}, opset=17, atol=1e-6)


def test_stft():
    signal = _f(1, 64, 1)
    compare_node("STFT", [signal, np.array(8, np.int64), np.hanning(16).astype(np.float32)], opset=17, rtol=1e-4,
                 atol=1e-5)
