"""Warm-up at load (D90): a small model of fixed input shapes runs once on zeros while its session is
created, so that the caller's first run replays the native program that run recorded; and the run
that records a declared memory plan's results records the program in the same pass."""
from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import minirt
from minirt import plan as plan_mod
from minirt.builder.build import build
from minirt.targets.flops import node_flops

from tests.native.conftest import requires_native


def _conv_model() -> onnx.ModelProto:
    """Conv -> Relu -> Sigmoid -> Add over a fixed 1x3x8x8 image (all native, recordable)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [
        h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["r"]),
        h.make_node("Sigmoid", ["r"], ["s"]),
        h.make_node("Add", ["s", "c"], ["y"]),
    ]
    graph = h.make_graph(nodes, "conv", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, 8])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 8, 8])], [w, b])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _program_of(sess) -> str | None:
    (plan,) = sess.memory_plans()
    return plan["native_program"]


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def conv_model():
    model = _conv_model()
    return model, build(model, None).data


@requires_native
def test_a_small_fixed_shape_model_warms_up_and_its_first_run_replays(conv_model):
    model, data = conv_model
    sess = minirt.Session(data, threads=1)
    assert sess.warmed_up
    assert re.fullmatch(r"\d+ native calls", _program_of(sess)), _program_of(sess)
    ref = ReferenceEvaluator(model)
    for seed in range(3):  # the program recorded on zeros gives each new input's result
        x = _image(seed)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


@requires_native
@pytest.mark.parametrize("how", ["argument", "environment"])
def test_without_warm_up_the_first_run_records_the_program_with_the_plan(conv_model, monkeypatch, how):
    model, data = conv_model
    if how == "environment":
        monkeypatch.setenv("MINIRT_WARM_UP", "0")
        sess = minirt.Session(data, threads=1)
    else:
        sess = minirt.Session(data, threads=1, warm_up=False)
    assert not sess.warmed_up and sess.memory_plans() == []
    x = _image(1)
    first = sess.run(None, {"x": x})[0]
    # the run that recorded the declared plan's results recorded the program too: the next one replays
    assert re.fullmatch(r"\d+ native calls", _program_of(sess)), _program_of(sess)
    np.testing.assert_allclose(first, ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], first)


@requires_native
def test_warm_up_that_fails_leaves_the_session_as_without_it(conv_model, monkeypatch):
    model, data = conv_model

    def refuse(*args, **kwargs):
        raise ValueError("a shape read from zeros")

    with monkeypatch.context() as m:
        m.setattr(plan_mod.Plan, "record_program", refuse)
        sess = minirt.Session(data, threads=1)
    assert not sess.warmed_up and sess.memory_plans() == []
    x = _image(2)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ReferenceEvaluator(model).run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_no_warm_up_above_the_flops_limit_or_with_random_ops(conv_model, monkeypatch):
    _, data = conv_model
    monkeypatch.setattr(minirt.Session, "WARM_UP_MAX_FLOPS", 0)
    assert not minirt.Session(data).warmed_up
    monkeypatch.undo()
    graph = h.make_graph([h.make_node("RandomNormalLike", ["x"], ["n"]), h.make_node("Add", ["x", "n"], ["y"])],
                         "noise", [h.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [2, 3])])
    noisy = build(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), None).data
    assert not minirt.Session(noisy).warmed_up  # (a warm-up would draw from the generator)


@requires_native
def test_warm_up_feeds_pinned_inputs_their_values_and_shows_no_warning():
    # y = Log(Relu(Conv(x))) + Cast(k): on zeros Relu gives zeros where a bias is negative and Log warns;
    # k is pinned to 3, and a run that fed it 0 would be refused
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.array([-1, 1, -1, 1], np.float32), "b")
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("Log", ["r"], ["l"]), h.make_node("Cast", ["k"], ["kf"], to=TP.FLOAT),
             h.make_node("Add", ["l", "kf"], ["y"])]
    graph = h.make_graph(nodes, "logk", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, 8]),
                                         h.make_tensor_value_info("k", TP.INT64, [])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 4, 8, 8])], [w, b])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    data = build(model, None, input_values={"k": 3}).data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sess = minirt.Session(data, threads=1)
    assert sess.warmed_up
    x, k = _image(5), np.array(3, np.int64)
    with np.errstate(divide="ignore"):
        want = ReferenceEvaluator(model).run(None, {"x": x, "k": k})[0]
        got = sess.run(None, {"x": x, "k": k})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # (Log near 1 magnifies the conv's rounding)


def test_build_records_the_flops_of_one_run(conv_model):
    _, data = conv_model
    flops = minirt.Session(data, warm_up=False).metadata["build.flops"]
    # the 3x3 conv: 256 outputs x 2 x 27 products, plus its fused bias / activation epilogue per output
    assert 2 * 27 * 256 <= flops <= 2 * 27 * 256 + 8 * 256


def test_recurrent_flops_count_the_input_projection_and_the_recurrence():
    x = ir.Value(name="x", shape=ir.Shape([5, 2, 3]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape([2, 16, 3]), type=ir.TensorType(ir.DataType.FLOAT))
    r = ir.Value(name="r", shape=ir.Shape([2, 16, 4]), type=ir.TensorType(ir.DataType.FLOAT))
    lstm = ir.Node("", "LSTM", [x, w, r], attributes=[ir.AttrInt64("hidden_size", 4)])
    gate_values = 5 * 2 * 2 * 16  # steps x batch x directions x (4 gates x hidden 4)
    assert node_flops(lstm) == 2 * gate_values * (3 + 4) + 4 * gate_values
    # layout 1: (batch, steps, input)
    xb = ir.Value(name="xb", shape=ir.Shape([2, 5, 3]), type=ir.TensorType(ir.DataType.FLOAT))
    gru = ir.Node("", "GRU", [xb, ir.Value(name="wg", shape=ir.Shape([1, 12, 3]))],
                  attributes=[ir.AttrInt64("hidden_size", 4), ir.AttrInt64("layout", 1)])
    gate_values = 5 * 2 * 1 * 12
    assert node_flops(gru) == 2 * gate_values * (3 + 4) + 4 * gate_values


def test_asking_for_a_warm_up_of_a_model_without_fixed_shapes_is_harmless():
    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "dyn",
                         [h.make_tensor_value_info("x", TP.FLOAT, ["n", 3])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["n", 3])])
    data = build(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), None).data
    sess = minirt.Session(data, warm_up=True)
    assert not sess.warmed_up  # (no one feed stands for every run)
    x = np.array([[-1, 2, -3]], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
