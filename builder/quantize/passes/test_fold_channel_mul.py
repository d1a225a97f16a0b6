"""quant_fold_channel_mul: QConv(Mul(x, s)) with s of shape (N, C, 1, 1) becomes QConv(x, X_mul=s); a Mul by a
full tensor is refused."""
import numpy as np
from onnx import helper as h

from minirt.builder.quantize.passes import testing as Q
from minirt.builder.quantize.passes.fold_channel_mul import FoldChannelMul

X = {"x": Q.R.standard_normal((1, 4, 8, 8)).astype(np.float32)}


def _model(scale_shape=(1, 4, 1, 1)):
    nodes = [h.make_node("Sigmoid", ["x"], ["g"]), h.make_node("ReduceMean", ["g"], ["s"], axes=[2, 3], keepdims=1)
             if scale_shape == (1, 4, 1, 1) else h.make_node("Identity", ["g"], ["s"]),
             h.make_node("Mul", ["x", "s"], ["m"]), h.make_node("Conv", ["m", "w"], ["y"])]
    return Q.make_model(nodes, [Q.vinfo("x", [1, 4, 8, 8])], [Q.vinfo("y", [1, 3, 6, 6])],
                        [Q.tensor("w", Q.weight(3, 4, 3, 3))])


def test_folds_the_channel_scale():
    m, _ = Q.quantized(_model())
    before = m.clone()
    assert FoldChannelMul()(m).modified
    assert Q.ops(m) == {"Sigmoid": 1, "ReduceMean": 1, "com.minirt::QConv": 1}
    qconv = [n for n in m.graph if n.op_type == "QConv"][0]
    assert qconv.inputs[0].name == "x" and qconv.inputs[8].name == "s"
    Q.parity(before, m, X, atol=1e-4)
    assert not FoldChannelMul()(m).modified


def test_full_tensor_mul_is_refused():
    m, _ = Q.quantized(_model(scale_shape=(1, 4, 8, 8)))
    p = FoldChannelMul()
    assert not p(m).modified and Q.ops(m)["Mul"] == 1
    assert "(N, C, 1, 1)" in p.refusals[0].reason


def test_dynamic_and_empty_graph():
    m, _ = Q.quantized(_model(), static=False)
    assert not FoldChannelMul()(m).modified
    assert not FoldChannelMul()(Q.empty_model()).modified
