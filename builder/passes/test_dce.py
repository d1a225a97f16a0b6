"""Tests for dce: dead nodes and unused initializers go, outputs and inputs stay."""
import numpy as np
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.dce import DeadCodeElimination


def _model():
    nodes = [h.make_node("Relu", ["x"], ["y"]), h.make_node("Sigmoid", ["x"], ["dead"]), h.make_node("Neg", ["dead"], ["dead2"])]
    return T.make_model(nodes, [T.vinfo("x", [2, 3])], [T.vinfo("y", [2, 3])], [T.tensor("unused", np.ones(3, np.float32))])


def test_removes_dead_chain_and_unused_initializer():
    m = T.load(_model())
    assert DeadCodeElimination()(m).modified
    assert T.ops(m) == {"Relu": 1}
    assert "unused" not in m.graph.initializers
    assert [v.name for v in m.graph.inputs] == ["x"]


def test_no_change_when_nothing_is_dead():
    m = T.load(T.make_model([h.make_node("Relu", ["x"], ["y"])], [T.vinfo("x", [2])], [T.vinfo("y", [2])]))
    assert not DeadCodeElimination()(m).modified
    assert T.ops(m) == {"Relu": 1}


def test_parity():
    T.run_both(_model(), {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}, opt_level=1)
