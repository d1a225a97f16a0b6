"""Tests for constant_folding: folds with minirt's kernels, respects the size cap, folds static shapes."""
import numpy as np
import onnx
from onnx import helper as h

from minirt.builder.passes import optimize, testing as T
from minirt.builder.passes.constant_folding import ConstantFolding
from minirt.builder.passes.manager import OptimizeContext


def test_folds_constant_subgraph_and_lifts_constants():
    c = h.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.full((3,), 2, np.float32)))
    nodes = [c, h.make_node("Mul", ["c", "c"], ["c2"]), h.make_node("Add", ["x", "c2"], ["y"])]
    model = T.make_model(nodes, [T.vinfo("x", [2, 3])], [T.vinfo("y", [2, 3])])
    m = T.load(model)
    assert ConstantFolding()(m).modified
    assert T.ops(m) == {"Add": 1}
    np.testing.assert_array_equal(m.graph.node(0).inputs[1].const_value.numpy(), np.full(3, 4, np.float32))
    T.run_both(model, {"x": np.ones((2, 3), np.float32)}, opt_level=1)


def test_size_cap_refuses_huge_constant_of_shape():
    s = T.tensor("s", np.array([1024, 1024], np.int64))
    nodes = [h.make_node("ConstantOfShape", ["s"], ["big"], value=onnx.numpy_helper.from_array(np.ones(1, np.float32))),
             h.make_node("Add", ["x", "big"], ["y"])]
    m = T.load(T.make_model(nodes, [T.vinfo("x", [1024, 1024])], [T.vinfo("y", [1024, 1024])], [s]))
    p = ConstantFolding(OptimizeContext(fold_size_limit=1 << 16))
    p(m)
    assert T.ops(m)["ConstantOfShape"] == 1
    assert p.refusals and "fold cap" in p.refusals[0].reason


def test_graph_input_initializer_is_not_folded():
    # An initializer that is also a graph input (IR >= 4) can be overridden at run time.
    nodes = [h.make_node("Neg", ["w"], ["y"])]
    model = T.make_model(nodes, [T.vinfo("w", [3])], [T.vinfo("y", [3])], [T.tensor("w", np.ones(3, np.float32))])
    m = T.load(model)
    assert not ConstantFolding()(m).modified
    assert T.ops(m) == {"Neg": 1}


def test_shape_folding_static_and_partial():
    idx = T.tensor("i", np.array(1, np.int64))
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "i"], ["d"], axis=0),
             h.make_node("Cast", ["d"], ["df"], to=onnx.TensorProto.FLOAT), h.make_node("Mul", ["x", "df"], ["y"])]
    model = T.make_model(nodes, [T.vinfo("x", ["batch", 3])], [T.vinfo("y", ["batch", 3])], [idx])
    m, report, _ = T.run_both(model, {"x": np.ones((5, 3), np.float32)}, opt_level=1)
    assert T.ops(m) == {"Mul": 1}  # Shape[1] == 3 is static even with a symbolic batch
    idx0 = T.tensor("i", np.array(0, np.int64))
    model = T.make_model(nodes, [T.vinfo("x", ["batch", 3])], [T.vinfo("y", ["batch", 3])], [idx0])
    m, _, _ = T.run_both(model, {"x": np.ones((5, 3), np.float32)}, opt_level=1)
    assert T.ops(m)["Shape"] == 1  # the batch is not known: nothing to fold


def test_input_shapes_make_shape_static():
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Shape", ["r"], ["s"]), h.make_node("Reshape", ["r", "s"], ["y"])]
    model = T.make_model(nodes, [T.vinfo("x", ["n", 3])], [T.vinfo("y", ["n", 3])])
    m, _, _ = T.run_both(model, {"x": np.ones((4, 3), np.float32)}, opt_level=1)
    assert T.ops(m)["Shape"] == 1  # n is symbolic: Shape stays
    m, report, _ = T.run_both(model, {"x": np.ones((4, 3), np.float32)}, opt_level=1, input_shapes={"x": (4, 3)})
    assert T.ops(m) == {"Relu": 1}  # Shape folds, then Reshape(x, shape(x)) is x; y stays the output name
    assert [v.name for v in m.graph.outputs] == ["y"]


def test_twice_changes_nothing():
    c = h.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.ones(3, np.float32)))
    model = T.make_model([c, h.make_node("Add", ["x", "c"], ["y"])], [T.vinfo("x", [3])], [T.vinfo("y", [3])])
    m = T.load(model)
    optimize(m, 1)
    assert not ConstantFolding()(m).modified
