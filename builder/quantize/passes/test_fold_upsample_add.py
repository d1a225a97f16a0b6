"""quant_fold_upsample_add: QConv(Add(a, Resize(b))) becomes QConv(a, X_up=b); other Resizes are refused."""
import numpy as np
from onnx import helper as h

from minirt.builder.quantize.passes import testing as Q
from minirt.builder.quantize.passes.fold_upsample_add import FoldUpsampleAdd

X = {"a": Q.R.standard_normal((1, 4, 8, 8)).astype(np.float32), "b": Q.R.standard_normal((1, 4, 4, 4)).astype(np.float32)}


def _model(mode="nearest"):
    nodes = [h.make_node("Resize", ["b", "", "sc"], ["r"], mode=mode, coordinate_transformation_mode="asymmetric",
                         nearest_mode="floor"),
             h.make_node("Add", ["a", "r"], ["s"]), h.make_node("Conv", ["s", "w"], ["y"])]
    inits = [Q.tensor("sc", np.array([1, 1, 2, 2], np.float32)), Q.tensor("w", Q.weight(3, 4, 3, 3))]
    return Q.make_model(nodes, [Q.vinfo("a", [1, 4, 8, 8]), Q.vinfo("b", [1, 4, 4, 4])],
                        [Q.vinfo("y", [1, 3, 6, 6])], inits)


def test_folds_the_upsampled_add():
    m, _ = Q.quantized(_model())
    before = m.clone()
    assert FoldUpsampleAdd()(m).modified
    assert Q.ops(m) == {"com.minirt::QConv": 1}
    qconv = next(iter(m.graph))
    assert qconv.attributes["x_up_factor"].value == 2 and qconv.inputs[7].name == "b"
    Q.parity(before, m, X, atol=1e-4)
    assert not FoldUpsampleAdd()(m).modified


def test_linear_resize_is_refused():
    m, _ = Q.quantized(_model(mode="linear"))
    p = FoldUpsampleAdd()
    assert not p(m).modified
    assert Q.ops(m) == {"Resize": 1, "Add": 1, "com.minirt::QConv": 1}
    assert "nearest integer-factor" in p.refusals[0].reason


def test_dynamic_and_empty_graph():
    m, _ = Q.quantized(_model(), static=False)  # no static input scale: nothing to fold into
    assert not FoldUpsampleAdd()(m).modified
    assert not FoldUpsampleAdd()(Q.empty_model()).modified
