"""builder/weight_shapes.py: a wrong --input-shape (or a model whose declared shapes contradict its
weights) fails the build with a message naming the node, the input, the weight and what it takes."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import minirt
from minirt.builder import build
from minirt.builder.errors import BuildError


def _save(tmp_path, nodes, x_shape, y_shape, inits):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return str(path)


def _conv(tmp_path, channels="C", group=1):
    w = np.ones((8, 4 // group, 3, 3), np.float32)
    return _save(tmp_path, [helper.make_node("Conv", ["x", "w"], ["y"], name="stem", pads=[1] * 4, group=group)],
                 ["N", channels, "H", "W"], ["N", 8, "H", "W"], {"w": w})


def test_conv_channels_from_input_shape(tmp_path):
    path = _conv(tmp_path)
    with pytest.raises(BuildError) as e:
        build(path, str(tmp_path / "m.mrt"), input_shapes={"x": [1, 5, 16, 16]})
    msg = str(e.value)
    for part in ("'stem'", "input 'x' has 5 channels", "[1, 5, 16, 16]", "'w' [8, 4, 3, 3]", "takes 4",
                 "check --input-shape (x=[1, 5, 16, 16])"):
        assert part in msg, msg
    assert not (tmp_path / "m.mrt").exists()
    build(path, str(tmp_path / "ok.mrt"), input_shapes={"x": [1, 4, 16, 16]})  # the right shape builds and runs
    y = minirt.Session(str(tmp_path / "ok.mrt")).run(None, {"x": np.ones((1, 4, 16, 16), np.float32)})[0]
    assert y.shape == (1, 8, 16, 16) and y[0, 0, 8, 8] == 36.0


def test_grouped_conv_counts_every_group(tmp_path):
    path = _conv(tmp_path, group=2)  # W (8, 2, 3, 3) in 2 groups takes 4 channels
    build(path, str(tmp_path / "ok.mrt"), input_shapes={"x": [1, 4, 8, 8]})
    with pytest.raises(BuildError, match="with group=2 takes 4"):
        build(path, str(tmp_path / "m.mrt"), input_shapes={"x": [1, 2, 8, 8]})


def test_declared_shape_contradicting_the_weights(tmp_path):
    path = _conv(tmp_path, channels=5)  # the model itself says 5 channels
    with pytest.raises(BuildError, match="the model's declared shapes contradict its weights"):
        build(path, str(tmp_path / "m.mrt"))


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_features(tmp_path, trans_b):
    w = np.ones((6, 10) if trans_b else (10, 6), np.float32)
    path = _save(tmp_path, [helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", transB=trans_b)],
                 ["N", "K"], ["N", 6], {"w": w})
    with pytest.raises(BuildError, match=r"'fc' .*has 12 features, but the weight 'w' .* takes 10"):
        build(path, str(tmp_path / "m.mrt"), input_shapes={"x": [2, 12]})
    build(path, str(tmp_path / "ok.mrt"), input_shapes={"x": [2, 10]})


def test_matmul_features(tmp_path):
    path = _save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")],
                 ["B", "T", "D"], ["B", "T", 3], {"w": np.ones((7, 3), np.float32)})
    with pytest.raises(BuildError, match=r"'proj' .*has 9 features in its last dimension.* takes 7"):
        build(path, str(tmp_path / "m.mrt"), input_shapes={"x": [1, 4, 9]})
    build(path, str(tmp_path / "ok.mrt"), input_shapes={"x": [1, 4, 7]})


def test_conv_transpose_channels(tmp_path):
    w = np.ones((4, 2, 2, 2), np.float32)  # (C_in, C_out, kh, kw)
    path = _save(tmp_path, [helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", strides=[2, 2])],
                 ["N", "C", "H", "W"], ["N", 2, "H2", "W2"], {"w": w})
    with pytest.raises(BuildError, match="'up' .*has 3 channels.*takes 4"):
        build(path, str(tmp_path / "m.mrt"), input_shapes={"x": [1, 3, 5, 5]})
    build(path, str(tmp_path / "ok.mrt"), input_shapes={"x": [1, 4, 5, 5]})
