"""quant_fold_upsample_concat: a channel Concat of an upsampled tensor read by a QConv becomes one
QuantizeUpsampleConcat writing the QConv's uint8 input; a Concat over another axis is refused."""
import numpy as np
from onnx import helper as h

from minirt.builder.quantize.passes import testing as Q
from minirt.builder.quantize.passes.fold_upsample_concat import FoldUpsampleConcat

X = {"a": Q.R.standard_normal((1, 3, 8, 8)).astype(np.float32), "b": Q.R.standard_normal((1, 2, 4, 4)).astype(np.float32)}


def _model():
    nodes = [h.make_node("Resize", ["b", "", "sc"], ["r"], mode="nearest", coordinate_transformation_mode="asymmetric",
                         nearest_mode="floor"),
             h.make_node("Concat", ["r", "a"], ["s"], axis=1), h.make_node("Conv", ["s", "w"], ["y"])]
    inits = [Q.tensor("sc", np.array([1, 1, 2, 2], np.float32)), Q.tensor("w", Q.weight(4, 5, 3, 3))]
    return Q.make_model(nodes, [Q.vinfo("a", [1, 3, 8, 8]), Q.vinfo("b", [1, 2, 4, 4])],
                        [Q.vinfo("y", [1, 4, 6, 6])], inits)


def _height_concat():
    nodes = [h.make_node("Concat", ["a", "a2"], ["s"], axis=2), h.make_node("Conv", ["s", "w"], ["y"])]
    return Q.make_model(nodes, [Q.vinfo("a", [1, 3, 8, 8]), Q.vinfo("a2", [1, 3, 8, 8])],
                        [Q.vinfo("y", [1, 4, 14, 6])], [Q.tensor("w", Q.weight(4, 3, 3, 3))])


def test_folds_the_concat():
    m, _ = Q.quantized(_model())
    before = m.clone()
    assert FoldUpsampleConcat()(m).modified
    assert Q.ops(m) == {"com.minirt::QuantizeUpsampleConcat": 1, "com.minirt::QConv": 1}
    q = next(iter(m.graph))
    assert list(q.attributes["factors"].value) == [2, 1]
    Q.parity(before, m, X, atol=1e-4)
    assert not FoldUpsampleConcat()(m).modified


def test_concat_over_height_is_refused():
    m, _ = Q.quantized(_height_concat())
    p = FoldUpsampleConcat()
    assert not p(m).modified and Q.ops(m) == {"Concat": 1, "com.minirt::QConv": 1}
    assert "axis 2" in p.refusals[0].reason


def test_dynamic_and_empty_graph():
    m, _ = Q.quantized(_model(), static=False)
    assert not FoldUpsampleConcat()(m).modified
    assert not FoldUpsampleConcat()(Q.empty_model()).modified
