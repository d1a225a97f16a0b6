"""Tests for factor_residual_scale: x + x * s becomes x * (1 + s); near misses do not."""
import numpy as np
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.factor_residual_scale import FactorResidualScale

R = np.random.default_rng(11)
X = {"x": R.standard_normal((2, 4, 5, 5)).astype(np.float32), "g": R.uniform(0, 1, (2, 4, 1, 1)).astype(np.float32)}


def _model(mul_inputs=("x", "g"), add_inputs=("x", "m"), extra_reader=False, g_shape=(2, 4, 1, 1)):
    nodes = [h.make_node("Mul", list(mul_inputs), ["m"]), h.make_node("Add", list(add_inputs), ["y"])]
    outs = [T.vinfo("y", [2, 4, 5, 5])]
    if extra_reader:
        outs.append(T.vinfo("m", [2, 4, 5, 5]))
    return T.make_model(nodes, [T.vinfo("x", [2, 4, 5, 5]), T.vinfo("g", list(g_shape))], outs)


def test_every_operand_order_factors():
    for mul_inputs in (("x", "g"), ("g", "x")):
        for add_inputs in (("x", "m"), ("m", "x")):
            m, _, _ = T.run_both(_model(mul_inputs, add_inputs), X)
            assert T.ops(m) == {"Mul": 1, "Add": 1}
            mul = next(n for n in m.graph if n.op_type == "Mul")
            add = next(n for n in m.graph if n.op_type == "Add")
            assert mul.inputs[0].name == "x" and mul.inputs[1] is add.outputs[0]  # the Add is over the gate
            assert add.inputs[0].name == "g"


def test_full_size_gate_and_graph_output_name_kept():
    feeds = {"x": X["x"], "g": R.standard_normal((2, 4, 5, 5)).astype(np.float32)}
    m, _, _ = T.run_both(_model(g_shape=(2, 4, 5, 5)), feeds)
    assert [v.name for v in m.graph.outputs] == ["y"]


def test_near_misses_stay():
    # the product is read elsewhere (a graph output): the Add stays
    model = _model(extra_reader=True)
    assert not FactorResidualScale()(T.load(model)).modified
    T.run_both(model, X)
    # x + y * g with y another tensor: not this pattern
    nodes = [h.make_node("Mul", ["z", "g"], ["m"]), h.make_node("Add", ["x", "m"], ["y"])]
    model = T.make_model(nodes, [T.vinfo("x", [2, 4, 5, 5]), T.vinfo("z", [2, 4, 5, 5]), T.vinfo("g", [2, 4, 1, 1])],
                         [T.vinfo("y", [2, 4, 5, 5])])
    assert not FactorResidualScale()(T.load(model)).modified
    # x + x * x: no separate gate
    model = _model(mul_inputs=("x", "x"))
    assert not FactorResidualScale()(T.load(model)).modified
    T.run_both(model, X)
