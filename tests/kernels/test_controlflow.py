"""If / Loop / Scan end to end: ONNX with subgraphs -> builder.build_bytes -> minirt.Session,
compared with onnxruntime on the same model."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.kernels.model_run import minirt_run, reference_run

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(graph, opset=17):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _same(model, feeds, rtol=1e-6, atol=1e-6):
    expected = reference_run(model, feeds)
    actual = minirt_run(model, feeds)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, a.shape, e.dtype, e.shape)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)
    return actual


def _if_model(outer_used_before: bool):
    """y = If(cond) then x * scale else x - scale; ``scale`` is an outer value read by the branches."""
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["t_out"])], "then", [], [helper.make_tensor_value_info("t_out", F, [3])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Sub", ["x", "scale"], ["e_out"])], "else", [], [helper.make_tensor_value_info("e_out", F, [3])]
    )
    nodes = [helper.make_node("Add", ["s_in", "one"], ["scale"])]
    outputs = [helper.make_tensor_value_info("y", F, [3])]
    if outer_used_before:
        # ``scale`` also feeds a node before the If: its last direct reader comes first.
        nodes.append(helper.make_node("Neg", ["scale"], ["neg_scale"]))
        outputs.append(helper.make_tensor_value_info("neg_scale", F, [3]))
    nodes.append(helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g))
    graph = helper.make_graph(
        nodes,
        "if_outer",
        [helper.make_tensor_value_info("cond", B, []), helper.make_tensor_value_info("x", F, [3]),
         helper.make_tensor_value_info("s_in", F, [3])],
        outputs,
        initializer=[helper.make_tensor("one", F, [], [1.0])],
    )
    return _model(graph)


@pytest.mark.parametrize("cond", [True, False])
def test_if_chooses_branch_reading_outer_value(cond):
    x = np.array([1.0, 2.0, 3.0], np.float32)
    s = np.array([0.5, -1.0, 2.0], np.float32)
    (y,) = _same(_if_model(False), {"cond": np.array(cond), "x": x, "s_in": s})
    np.testing.assert_allclose(y, x * (s + 1) if cond else x - (s + 1))


def test_if_outer_value_also_read_before_the_if():
    """The outer value's last direct reader precedes the If: the plan must keep it alive for the branch."""
    x = np.array([1.0, 2.0, 3.0], np.float32)
    s = np.array([0.5, -1.0, 2.0], np.float32)
    _same(_if_model(True), {"cond": np.array(True), "x": x, "s_in": s})


def _loop_model():
    """Loop accumulating: acc += x * i, stops when acc's sum exceeds a limit or after M trips;
    scan output collects acc each iteration.  ``x`` and ``limit`` are outer values."""
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["i_f"], to=F),
            helper.make_node("Mul", ["x", "i_f"], ["step"]),
            helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
            helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["cond_out"]),
            helper.make_node("Identity", ["acc_out"], ["scan_out"]),
        ],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("acc_in", F, [2])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("acc_out", F, [2]),
         helper.make_tensor_value_info("scan_out", F, [2])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "acc0"], ["acc", "history"], body=body)],
        "loop_acc",
        [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("cond", B, []),
         helper.make_tensor_value_info("acc0", F, [2]), helper.make_tensor_value_info("x", F, [2]),
         helper.make_tensor_value_info("limit", F, [])],
        [helper.make_tensor_value_info("acc", F, [2]), helper.make_tensor_value_info("history", F, [None, 2])],
    )
    return _model(graph)


@pytest.mark.parametrize("trips, limit", [(5, 1000.0), (10, 12.0), (0, 1000.0)])
def test_loop_accumulates_with_scan_output(trips, limit):
    feeds = {
        "M": np.array(trips, np.int64),
        "cond": np.array(True),
        "acc0": np.array([0.0, 1.0], np.float32),
        "x": np.array([1.0, 2.0], np.float32),
        "limit": np.array(limit, np.float32),
    }
    acc, history = _same(_loop_model(), feeds)
    assert history.shape[0] == (4 if limit == 12.0 else trips)  # sums 1, 4, 10, 19: stops after 4


def _scan_model(directions, out_axes):
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])],
        "scan_body",
        [helper.make_tensor_value_info("s_in", F, [2]), helper.make_tensor_value_info("x_t", F, [2])],
        [helper.make_tensor_value_info("s_out", F, [2]), helper.make_tensor_value_info("y_t", F, [2])],
    )
    graph = helper.make_graph(
        [helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                          scan_input_axes=[1], scan_input_directions=directions, scan_output_axes=out_axes)],
        "scan",
        [helper.make_tensor_value_info("s0", F, [2]), helper.make_tensor_value_info("xs", F, [2, 4])],
        [helper.make_tensor_value_info("s", F, [2]), helper.make_tensor_value_info("ys", F, [None, None])],
    )
    return _model(graph)


@pytest.mark.parametrize("directions, out_axes", [([0], [0]), ([1], [1]), ([1], [-1])])
def test_scan_axes_and_directions(directions, out_axes):
    rng = np.random.default_rng(1)
    feeds = {"s0": rng.standard_normal(2).astype(np.float32), "xs": rng.standard_normal((2, 4)).astype(np.float32)}
    _same(_scan_model(directions, out_axes), feeds, rtol=1e-5)
