"""Tests for cse: identical nodes merge; different attributes, inputs or random ops do not."""
import numpy as np
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.cse import CommonSubexpressionElimination
from minirt.builder.passes.dce import DeadCodeElimination

X = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)


def _m(nodes):
    return T.make_model(nodes, [T.vinfo("x", [2, 3])], [T.vinfo("y", [2, 3])])


def test_merges_duplicates():
    nodes = [h.make_node("Relu", ["x"], ["a"]), h.make_node("Relu", ["x"], ["b"]), h.make_node("Add", ["a", "b"], ["y"])]
    m = T.load(_m(nodes))
    assert CommonSubexpressionElimination()(m).modified
    assert T.ops(m) == {"Relu": 1, "Add": 1}
    T.run_both(_m(nodes), {"x": X}, opt_level=1)


def test_different_attributes_not_merged():
    nodes = [h.make_node("LeakyRelu", ["x"], ["a"], alpha=0.1), h.make_node("LeakyRelu", ["x"], ["b"], alpha=0.2),
             h.make_node("Add", ["a", "b"], ["y"])]
    m = T.load(_m(nodes))
    assert not CommonSubexpressionElimination()(m).modified
    T.run_both(_m(nodes), {"x": X}, opt_level=1)


def test_random_ops_not_merged():
    nodes = [h.make_node("RandomUniformLike", ["x"], ["a"]), h.make_node("RandomUniformLike", ["x"], ["b"]),
             h.make_node("Sub", ["a", "b"], ["y"])]
    m = T.load(_m(nodes))
    assert not CommonSubexpressionElimination()(m).modified


def test_graph_output_duplicate_keeps_names():
    nodes = [h.make_node("Relu", ["x"], ["y"]), h.make_node("Relu", ["x"], ["z"])]
    model = T.make_model(nodes, [T.vinfo("x", [2, 3])], [T.vinfo("y", [2, 3]), T.vinfo("z", [2, 3])])
    m = T.load(model)
    CommonSubexpressionElimination()(m)
    DeadCodeElimination()(m)
    assert [v.name for v in m.graph.outputs] == ["y", "z"]
    T.run_both(model, {"x": X}, opt_level=1)
