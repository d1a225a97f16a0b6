"""quant_fuse_flatten: Flatten -> QMatMul becomes the QMatMul's flatten_axis."""
import numpy as np
from onnx import helper as h

from minirt.builder.quantize.passes import testing as Q
from minirt.builder.quantize.passes.fuse_flatten import FuseFlatten

X = {"x": Q.R.standard_normal((2, 3, 2, 2)).astype(np.float32)}


def _model(second_reader=False):
    nodes = [h.make_node("Flatten", ["x"], ["f"], axis=1), h.make_node("MatMul", ["f", "w"], ["y"])]
    outputs = [Q.vinfo("y", ["n", "k"])]
    if second_reader:
        nodes.append(h.make_node("Relu", ["f"], ["r"]))
        outputs.append(Q.vinfo("r", ["n", "k"]))
    return Q.make_model(nodes, [Q.vinfo("x", [2, 3, 2, 2])], outputs, [Q.tensor("w", Q.weight(12, 5))])


def test_fuses_flatten():
    m, _ = Q.quantized(_model())
    before = m.clone()
    assert FuseFlatten()(m).modified
    assert Q.ops(m) == {"com.minirt::QMatMul": 1}
    assert next(iter(m.graph)).attributes["flatten_axis"].value == 1
    Q.parity(before, m, X)
    assert not FuseFlatten()(m).modified


def test_flatten_read_twice_stays():
    m, _ = Q.quantized(_model(second_reader=True))
    assert not FuseFlatten()(m).modified
    assert Q.ops(m) == {"Flatten": 1, "com.minirt::QMatMul": 1, "Relu": 1}


def test_empty_graph():
    assert not FuseFlatten()(Q.empty_model()).modified
