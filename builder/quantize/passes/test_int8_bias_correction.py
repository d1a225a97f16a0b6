"""int8_bias_correction: a layer's bias absorbs what its int8 weight loses times its mean input, once, with
the weight rounded exactly as quant_layers will round it (pair-limited too)."""
import numpy as np
import onnx_ir as ir
import pytest
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.quantize import qir
from minirt.builder.quantize.bias_correction import mean_inputs
from minirt.builder.quantize.candidates import find_candidates
from minirt.builder.quantize.passes import testing as Q
from minirt.builder.quantize.passes.int8_bias_correction import Int8BiasCorrection
from minirt.builder.quantize.qir import QuantContext

FEEDS = [{"x": np.maximum(Q.R.standard_normal((2, 8, 10, 10)), 0).astype(np.float32) + 0.5}]  # a large mean


def _model(group: int = 1):
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=group)]
    return Q.make_model(nodes, [Q.vinfo("x", [2, 8, 10, 10])], [Q.vinfo("y", [2, 16, 10, 10])],
                        [Q.tensor("w", Q.weight(16, 8 // group, 3, 3)),
                         Q.tensor("b", np.linspace(-1, 1, 16).astype(np.float32))])


@pytest.mark.parametrize("pair_limited", [False, True])
@pytest.mark.parametrize("group", [1, 2])
def test_the_mean_output_over_the_data_is_the_float_layers(pair_limited, group):
    onnx_model = _model(group)
    m = T.load(onnx_model)
    candidates, _ = find_candidates(m)
    means = mean_inputs(m, ["w"], FEEDS)
    ctx = QuantContext(selected=candidates, ranges={}, pair_limited=pair_limited, int8_means=means)
    w = m.graph.initializers["w"].const_value.numpy().copy()
    p = Int8BiasCorrection(ctx)
    assert p(m).modified and p.corrected == 1
    node = next(iter(m.graph))
    b = node.inputs[2].const_value.numpy()
    # independently: the weight quant_layers stores (same layout), its dequantized error times the mean patch
    axis, pairs = qir.weight_layout(node, "conv")
    q, s = qir.quantize_weight(w, axis, True, False, pairs if pair_limited else None)
    dw = q.astype(np.float64) * s[:, None, None, None] - w
    mean = means[node.outputs[0].name].reshape(group, 8 // group, 3, 3)
    expected = np.linspace(-1, 1, 16) - np.einsum("ocij,ocij->o", dw, np.repeat(mean, 16 // group, axis=0))
    np.testing.assert_allclose(b, expected.astype(np.float32), rtol=1e-5, atol=1e-6)
    # the mean output of the int8-weight layer over the data is the float layer's
    x = FEEDS[0]["x"]
    float_y = T.run(T.load(onnx_model), FEEDS[0])[0]
    m.graph.initializers["w"].const_value = ir.tensor((q.astype(np.float32) * s[:, None, None, None]), name="w")
    int8_y = T.run(m, FEEDS[0])[0]
    np.testing.assert_allclose(int8_y.mean(axis=(0, 2, 3)), float_y.mean(axis=(0, 2, 3)), atol=1e-4)
    assert np.abs(int8_y - float_y).mean() > 1e-5  # (the weights did change: the test has something to correct)
    assert x.mean() > 0.5
    assert not p(m).modified  # a second run would correct twice


def test_no_means_no_candidates_and_empty_graph():
    m = T.load(_model())
    candidates, _ = find_candidates(m)
    assert not Int8BiasCorrection(QuantContext(selected=candidates))(m).modified  # nothing measured
    means = mean_inputs(m, ["w"], FEEDS)
    assert not Int8BiasCorrection(QuantContext(selected=[], int8_means=means))(m).modified
    assert not Int8BiasCorrection()(Q.empty_model()).modified
