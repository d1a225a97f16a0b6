"""quant_fold_affine: a scalar Mul / Add after a QConv becomes its post_scale / post_shift."""
import numpy as np
from onnx import helper as h

from minirt.builder.quantize.passes import testing as Q
from minirt.builder.quantize.passes.fold_scalar_affine import FoldScalarAffine

X = {"x": Q.R.standard_normal((1, 2, 6, 6)).astype(np.float32)}


def _model(scale):
    nodes = [h.make_node("Conv", ["x", "w"], ["c"]), h.make_node("Mul", ["c", "a"], ["m"]),
             h.make_node("Add", ["m", "b"], ["y"])]
    inits = [Q.tensor("w", Q.weight(3, 2, 3, 3)), Q.tensor("a", scale), Q.tensor("b", np.float32(0.25))]
    return Q.make_model(nodes, [Q.vinfo("x", [1, 2, 6, 6])], [Q.vinfo("y", ["n", "c", "h", "w"])], inits)


def test_folds_mul_and_add():
    m, _ = Q.quantized(_model(np.float32(1.5)))
    before = m.clone()
    assert FoldScalarAffine()(m).modified
    assert Q.ops(m) == {"com.minirt::QConv": 1}
    qconv = next(iter(m.graph))
    assert qconv.attributes["post_scale"].value == 1.5 and qconv.attributes["post_shift"].value == 0.25
    Q.parity(before, m, X, atol=1e-4)
    assert not FoldScalarAffine()(m).modified


def test_wide_constant_is_refused_and_add_alone_is_not_reached():
    m, _ = Q.quantized(_model(np.full((3, 1, 1), 1.5, np.float32)))
    p = FoldScalarAffine()
    assert not p(m).modified
    assert Q.ops(m) == {"com.minirt::QConv": 1, "Mul": 1, "Add": 1}
    assert "scalar" in p.refusals[0].reason


def test_float_graph_and_empty_graph():
    m = Q.T.load(_model(np.float32(2.0)))
    assert not FoldScalarAffine()(m).modified
    assert not FoldScalarAffine()(Q.empty_model()).modified
