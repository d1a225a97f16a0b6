"""fp16_bias_correction: a layer's bias absorbs its fp16 weight's rounding error times its mean input, once."""
import numpy as np
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.quantize.bias_correction import mean_inputs
from minirt.builder.quantize.passes import testing as Q
from minirt.builder.quantize.passes.fp16_bias_correction import FP16BiasCorrection
from minirt.builder.quantize.qir import QuantContext

FEEDS = [{"x": (Q.R.standard_normal((4, 64)) + 3.0).astype(np.float32)}]


def _model():
    nodes = [h.make_node("Gemm", ["x", "w", "b"], ["y"])]
    return Q.make_model(nodes, [Q.vinfo("x", [4, 64])], [Q.vinfo("y", [4, 32])],
                        [Q.tensor("w", Q.weight(64, 32)), Q.tensor("b", np.zeros(32, np.float32))])


def test_corrects_the_bias_once():
    m = T.load(_model())
    means = mean_inputs(m, ["w"], FEEDS)
    p = FP16BiasCorrection(QuantContext(fp16_only={"w"}, fp16_means=means))
    assert p(m).modified and p.corrected == 1
    b = [v for v in m.graph.initializers.values() if v.uses() and v.name != "w"][0].const_value.numpy()
    assert np.abs(b).max() > 0
    assert not p(m).modified  # a second run would correct twice


def test_no_means_no_weights_and_empty_graph():
    m = T.load(_model())
    assert not FP16BiasCorrection(QuantContext(fp16_only={"w"}))(m).modified  # nothing measured
    means = mean_inputs(m, ["w"], FEEDS)
    assert not FP16BiasCorrection(QuantContext(fp16_only=set(), fp16_means=means))(m).modified
    assert not FP16BiasCorrection()(Q.empty_model()).modified
