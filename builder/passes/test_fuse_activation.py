"""Tests for fuse_activation: Conv/Gemm/MatMul + residual Add + activation become one fused op."""
import numpy as np
import pytest
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.fuse_activation import FuseActivation

R = np.random.default_rng(3)
X = {"x": R.standard_normal((1, 4, 5, 5)).astype(np.float32), "z": R.standard_normal((1, 4, 5, 5)).astype(np.float32)}
INITS = [T.tensor("w", R.standard_normal((4, 4, 3, 3)).astype(np.float32)), T.tensor("b", R.standard_normal(4).astype(np.float32)),
         T.tensor("lo", np.float32(0)), T.tensor("hi", np.float32(6))]

ACTS = [
    h.make_node("Relu", ["s"], ["y"]),
    h.make_node("LeakyRelu", ["s"], ["y"], alpha=0.3),
    h.make_node("Clip", ["s", "lo", "hi"], ["y"]),
    h.make_node("Sigmoid", ["s"], ["y"]),
    h.make_node("Tanh", ["s"], ["y"]),
    h.make_node("HardSigmoid", ["s"], ["y"], alpha=0.3, beta=0.4),
    h.make_node("HardSwish", ["s"], ["y"]),
    h.make_node("Gelu", ["s"], ["y"]),
    h.make_node("Gelu", ["s"], ["y"], approximate="tanh"),
]


def _conv_model(act, residual=True):
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])]
    nodes.append(h.make_node("Add", ["z", "c"], ["s"]) if residual else h.make_node("Identity", ["c"], ["s"]))
    nodes.append(act)
    return T.make_model(nodes, [T.vinfo("x", [1, 4, 5, 5]), T.vinfo("z", [1, 4, 5, 5])], [T.vinfo("y", [1, 4, 5, 5])], INITS, opset=20)


@pytest.mark.parametrize("act", ACTS, ids=lambda n: n.op_type + str(len(n.attribute)))
@pytest.mark.parametrize("residual", [True, False])
def test_conv_residual_activation(act, residual):
    m, _, _ = T.run_both(_conv_model(act, residual), X)
    assert T.ops(m) == {"com.minirt::FusedConv": 1}


def test_gemm_and_matmul():
    nodes = [h.make_node("Gemm", ["a", "w2"], ["g"]), h.make_node("Relu", ["g"], ["y1"]),
             h.make_node("MatMul", ["a3", "w2"], ["mm"]), h.make_node("Add", ["mm", "r"], ["s"]), h.make_node("Sigmoid", ["s"], ["y2"])]
    inits = [T.tensor("w2", R.standard_normal((5, 6)).astype(np.float32))]
    model = T.make_model(nodes, [T.vinfo("a", [3, 5]), T.vinfo("a3", [2, 3, 5]), T.vinfo("r", [2, 3, 6])],
                         [T.vinfo("y1", [3, 6]), T.vinfo("y2", [2, 3, 6])], inits)
    feeds = {"a": R.standard_normal((3, 5)).astype(np.float32), "a3": R.standard_normal((2, 3, 5)).astype(np.float32),
             "r": R.standard_normal((2, 3, 6)).astype(np.float32)}
    m, _, _ = T.run_both(model, feeds)
    assert T.ops(m) == {"com.minirt::FusedGemm": 1, "com.minirt::FusedMatMul": 1}


def test_near_misses():
    # conv output also read elsewhere: activation refused with a reason
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["y"]), h.make_node("Neg", ["c"], ["n"])]
    model = T.make_model(nodes, [T.vinfo("x", [1, 4, 5, 5])], [T.vinfo("y", [1, 4, 5, 5]), T.vinfo("n", [1, 4, 5, 5])], INITS)
    m = T.load(model)
    p = FuseActivation()
    assert not p(m).modified and "readers" in p.refusals[0].reason
    T.run_both(model, {"x": X["x"]})
    # Clip with a computed bound: refused
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Clip", ["c", "lo", "z"], ["y"])]
    model = T.make_model(nodes, [T.vinfo("x", [1, 4, 5, 5]), T.vinfo("z", [])], [T.vinfo("y", [1, 4, 5, 5])], INITS)
    m = T.load(model)
    p = FuseActivation()
    assert not p(m).modified and "constants" in p.refusals[0].reason
    # an activation not in the table (Softplus) is left alone
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Softplus", ["c"], ["y"])]
    model = T.make_model(nodes, [T.vinfo("x", [1, 4, 5, 5])], [T.vinfo("y", [1, 4, 5, 5])], INITS)
    m = T.load(model)
    assert not FuseActivation()(m).modified


@pytest.mark.parametrize("act", ACTS, ids=lambda n: n.op_type + str(len(n.attribute)))
@pytest.mark.parametrize("attrs", [{"strides": [2, 2]}, {"strides": [1, 1], "pads": [1, 1, 1, 1]}],
                         ids=["tiles", "general"])
def test_conv_transpose_activation(act, attrs):
    # stride == kernel takes the native path (activation in the GEMM epilogue); the other the general one
    nodes = [h.make_node("ConvTranspose", ["x", "wt", "b"], ["s"], **attrs), act]
    out = 10 if attrs["strides"] == [2, 2] else 4
    model = T.make_model(nodes, [T.vinfo("x", [1, 4, 5, 5])], [T.vinfo("y", [1, 4, out, out])],
                         INITS[1:] + [T.tensor("wt", R.standard_normal((4, 4, 2, 2)).astype(np.float32))], opset=20)
    m, _, _ = T.run_both(model, {"x": X["x"]})
    assert T.ops(m) == {"com.minirt::FusedConvTranspose": 1}


def test_conv_transpose_keeps_residual_add():
    # FusedConvTranspose has no residual input: an Add after a ConvTranspose stays, the activation still fuses
    nodes = [h.make_node("ConvTranspose", ["x", "wt"], ["c"], strides=[1, 1], pads=[1, 1, 1, 1]),
             h.make_node("Add", ["c", "z"], ["s"]), h.make_node("Relu", ["s"], ["y"]),
             h.make_node("ConvTranspose", ["y", "wt"], ["c2"], strides=[2, 2]), h.make_node("Relu", ["c2"], ["y2"])]
    model = T.make_model(nodes, [T.vinfo("x", [1, 4, 5, 5]), T.vinfo("z", [1, 4, 4, 4])], [T.vinfo("y2", [1, 4, 8, 8])],
                         [T.tensor("wt", R.standard_normal((4, 4, 2, 2)).astype(np.float32))], opset=20)
    m, _, _ = T.run_both(model, {"x": X["x"], "z": R.standard_normal((1, 4, 4, 4)).astype(np.float32)})
    assert T.ops(m) == {"ConvTranspose": 1, "Add": 1, "Relu": 1, "com.minirt::FusedConvTranspose": 1}
