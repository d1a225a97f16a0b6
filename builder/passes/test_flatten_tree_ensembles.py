"""flatten_tree_ensembles: tree-ensemble nodes become com.minirt::FlatTreeEnsemble holding their layout,
results unchanged; nodes it cannot lay out, and graphs without trees, are left as they are."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper

from minirt.builder.passes.flatten_tree_ensembles import FlattenTreeEnsembles
from minirt.kernels import lookup

ML = "ai.onnx.ml"


def _regressor_model(**overrides):
    # one tree: node 0 tests x[1] <= 0.5, leaves 1 (weight 1.5) and 2 (weight -2)
    attrs = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[1, 0, 0],
                 nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0, 0], nodes_truenodeids=[1, 0, 0],
                 nodes_falsenodeids=[2, 0, 0], target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0],
                 target_weights=[1.5, -2.0], n_targets=1, base_values=[0.25])
    attrs.update(overrides)
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain=ML, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)])
    return ir.from_proto(proto)


def _run(node: ir.Node, x: np.ndarray, opset: int):
    attrs = {}
    for name, a in node.attributes.items():
        v = a.value
        attrs[name] = v.numpy() if a.type == ir.AttributeType.TENSOR else (list(v) if isinstance(v, (list, tuple)) or
                                                                          a.type in (ir.AttributeType.INTS,
                                                                                     ir.AttributeType.FLOATS,
                                                                                     ir.AttributeType.STRINGS) else v)
    entry = lookup(node.domain, node.op_type, opset)
    return entry.fn(x, **attrs)


def test_regressor_becomes_flat_and_computes_the_same():
    model = _regressor_model()
    before = next(iter(model.graph))
    x = np.array([[0.0, 0.2], [0.0, 0.9], [1.0, np.nan]], np.float32)
    want = _run(before, x, 3)
    assert FlattenTreeEnsembles().run(model) is True
    nodes = list(model.graph)
    assert [(n.domain, n.op_type) for n in nodes] == [("com.minirt", "FlatTreeEnsemble")]
    flat = nodes[0]
    assert flat.outputs[0].name == "y"
    assert "weight_leaf" not in flat.attributes and "weight_target" not in flat.attributes  # (implied)
    np.testing.assert_array_equal(_run(flat, x, 1), want)
    np.testing.assert_array_equal(want[:, 0], np.array([1.75, -1.75, -1.75], np.float32))


def test_no_trees_is_a_no_op():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert FlattenTreeEnsembles().run(model) is False
    assert [n.op_type for n in model.graph] == ["Relu"]


def test_a_node_it_cannot_lay_out_is_kept():
    model = _regressor_model(nodes_truenodeids=[7, 0, 0])  # a child that is not a node of the tree
    assert FlattenTreeEnsembles().run(model) is False
    assert [n.op_type for n in model.graph] == ["TreeEnsembleRegressor"]
