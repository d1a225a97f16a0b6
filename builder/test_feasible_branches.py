"""An If that only one branch can take with the fixed input shapes pins its scalar input
(builder/feasible_branches.py): the If folds, the runtime refuses other values with the reason."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import minirt
from minirt.builder.build import build
from minirt.format import reader

ort = pytest.importorskip("onnxruntime")


def _branchy(cond_nodes, mode_type=TP.INT64):
    """y = Relu(x) in the then-branch, Unsqueeze(Squeeze(x, axis 1), axis 1) in the else-branch (only runs
    when x's second dimension is 1); x is (1, n) with n free; ``cond_nodes`` compute "cond" from the
    scalar "mode"."""
    then_b = h.make_graph([h.make_node("Relu", ["x"], ["t"])], "then_b", [],
                          [h.make_tensor_value_info("t", TP.FLOAT, ["a", "b"])])
    axes = h.make_tensor("axes", TP.INT64, [1], [1])
    else_b = h.make_graph([h.make_node("Constant", [], ["ax"], value=axes),
                           h.make_node("Squeeze", ["x", "ax"], ["s"]), h.make_node("Unsqueeze", ["s", "ax"], ["e"])],
                          "else_b", [], [h.make_tensor_value_info("e", TP.FLOAT, ["c", "d"])])
    nodes = [*cond_nodes, h.make_node("If", ["cond"], ["y"], then_branch=then_b, else_branch=else_b, name="the_if")]
    graph = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", TP.FLOAT, [1, "n"]),
                                      h.make_tensor_value_info("mode", mode_type, [])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["p", "q"])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _equal(value: int = 1):
    return [h.make_node("Constant", [], ["one"], value=h.make_tensor("one", TP.INT64, [], [value])),
            h.make_node("Equal", ["mode", "one"], ["cond"])]


def _ops(data: bytes) -> collections.Counter:
    art = reader.load(data)
    return collections.Counter(art.operators[n.op_index].op_type for n in art.main_graph.nodes)


def _pins(data: bytes) -> dict:
    return reader.load(data).metadata.get("pinned_inputs") or {}


def test_the_input_is_pinned_to_the_value_of_the_only_branch_that_runs():
    model = _branchy(_equal(1))
    data = build(model, None, input_shapes={"x": [1, 4]}).data
    assert _ops(data)["If"] == 0, _ops(data)
    pin = _pins(data)["mode"]
    assert pin["values"] == [1] and "then_branch of If 'the_if'" in pin["reason"], pin
    assert "else_branch" in pin["reason"] and "Squeeze" in pin["reason"], pin["reason"]
    sess = minirt.Session(data)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"x": np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32), "mode": np.array(1, np.int64)}
    np.testing.assert_array_equal(sess.run(None, feed)[0], ref.run(None, feed)[0])
    with pytest.raises(minirt.InvalidArgument, match=r"'mode'.*built for mode = \[1\], got \[0\]: the builder "
                                                     r"pinned it \(with the input shapes given, only the then_branch"):
        sess.run(None, dict(feed, mode=np.array(0, np.int64)))


def test_shapes_under_which_both_branches_run_pin_nothing():
    data = build(_branchy(_equal(1)), None, input_shapes={"x": [1, 1]}).data
    assert "mode" not in _pins(data) and _ops(data)["If"] == 1


def test_without_input_shapes_nothing_is_tried():
    data = build(_branchy(_equal(1)), None).data
    assert not _pins(data) and _ops(data)["If"] == 1


def test_the_users_own_pin_is_kept_without_a_reason():
    data = build(_branchy(_equal(1)), None, input_shapes={"x": [1, 1]}, input_values={"mode": 0}).data
    assert _pins(data)["mode"] == {"dtype": "int64", "shape": [], "values": [0]}


def test_a_branch_taken_by_many_values_pins_nothing():
    # cond = not (mode == 1): the then-branch (the one that runs) is taken by every mode but 1
    cond = [*_equal(1)[:1], h.make_node("Equal", ["mode", "one"], ["eq"]), h.make_node("Not", ["eq"], ["cond"])]
    data = build(_branchy(cond), None, input_shapes={"x": [1, 4]}).data
    assert not _pins(data) and _ops(data)["If"] == 1


def test_the_negated_condition_pins_the_value_of_its_else_branch():
    # cond = not (mode != 1) through a Cast: the runnable then-branch needs mode == 1 again
    cond = [*_equal(1)[:1], h.make_node("Equal", ["mode", "one"], ["eq"]), h.make_node("Not", ["eq"], ["ne"]),
            h.make_node("Cast", ["ne"], ["nei"], to=TP.INT32), h.make_node("Cast", ["nei"], ["neb"], to=TP.BOOL),
            h.make_node("Not", ["neb"], ["cond"])]
    data = build(_branchy(cond), None, input_shapes={"x": [1, 4]}).data
    assert _pins(data)["mode"]["values"] == [1] and _ops(data)["If"] == 0


def test_a_bool_input_as_the_condition_is_pinned_to_true():
    model = _branchy([h.make_node("Identity", ["mode"], ["cond"])], mode_type=TP.BOOL)
    data = build(model, None, input_shapes={"x": [1, 3]}).data
    assert _pins(data)["mode"]["values"] == [True] and _ops(data)["If"] == 0
    sess = minirt.Session(data)
    x = np.array([[-1.0, 0.5, 2.0]], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "mode": np.array(True)})[0], np.maximum(x, 0))
