"""Concat in place (minirt/arena.py): inputs that the memory plan puts inside a Concat's buffer.

Checked against the same model run without a memory plan (bit-identical) and onnxruntime, with every
plan verified and every arena buffer checked against the live values (the ``checked`` fixture)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from minirt import builder
import minirt
from minirt import arena, native
from minirt import plan as plan_mod
from minirt.kernels import tensor

ort = pytest.importorskip("onnxruntime")


@pytest.fixture
def checked(monkeypatch):
    monkeypatch.setattr(plan_mod, "MEMPLAN_CHECK", True)


def _model(batch: int, axis: int = 1):
    """A C2f-like block (YOLOv8): a = Conv(x); y1, y2 = Split(a); two residual convs on y2; Concat of
    y1, y2 and both sums; then a neck-like Concat of an upsampled map and an earlier one; cur1 is also
    read after the Concat (a second output)."""
    rng = np.random.default_rng(0)
    inits = []

    def w(name, shape):
        inits.append(nh.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name))
        return name

    nodes = [
        h.make_node("Conv", ["x", w("w0", (8, 4, 1, 1))], ["a"]),
        h.make_node("Split", ["a", "parts"], ["y1", "y2"], axis=axis),
        h.make_node("Conv", ["y2", w("w1", (4, 4, 3, 3))], ["b1"], pads=[1, 1, 1, 1]),
        h.make_node("Add", ["y2", "b1"], ["cur1"]),
        h.make_node("Conv", ["cur1", w("w2", (4, 4, 3, 3))], ["b2"], pads=[1, 1, 1, 1]),
        h.make_node("Add", ["cur1", "b2"], ["cur2"]),
        h.make_node("Concat", ["y1", "y2", "cur1", "cur2"], ["cat"], axis=axis),
        h.make_node("Conv", ["cat", w("w3", (6, 16, 1, 1))], ["m"]),
        h.make_node("MaxPool", ["m"], ["small"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["small", w("w4", (6, 6, 3, 3))], ["deep"], pads=[1, 1, 1, 1]),
        h.make_node("Resize", ["deep", "", "scales"], ["up"], mode="nearest"),
        h.make_node("Concat", ["up", "m"], ["neck"], axis=axis),
        h.make_node("Conv", ["neck", w("w5", (5, 12, 1, 1))], ["y"]),
        h.make_node("Conv", ["cur1", w("w6", (4, 4, 1, 1))], ["side"]),
    ]
    inits.append(nh.from_array(np.array([4, 4], np.int64), "parts"))
    inits.append(nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [batch, 4, 12, 12])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [batch, 5, 12, 12]),
                          h.make_tensor_value_info("side", TP.FLOAT, [batch, 4, 12, 12])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _sessions(model, monkeypatch):
    data = builder.build_bytes(model)
    planned = minirt.Session(data)
    with monkeypatch.context() as m:
        m.setattr(arena, "_concat_inner_buffers", lambda *args: {})  # the same plan with every Concat copying
        copying = minirt.Session(data)
        feed = {"x": np.random.default_rng(1).standard_normal((model.graph.input[0].type.tensor_type.shape.dim[0]
                                                               .dim_value, 4, 12, 12)).astype(np.float32)}
        for _ in range(3):
            copying.run(None, feed)
    return data, planned, copying, feed


@pytest.mark.parametrize("axis", [1, -3])
def test_concat_inputs_are_written_in_place(checked, monkeypatch, axis):
    model = _model(1, axis)
    data, planned, copying, feed = _sessions(model, monkeypatch)
    plain = minirt.Session(data, memory_plan=False).run(None, feed)
    for _ in range(4):  # recorded run, planned runs, then the native program's replays
        got = planned.run(None, feed)
        assert all(np.array_equal(a, b) for a, b in zip(got, plain))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    aplan = next(iter(planned._mplans.values()))
    # inside the C2f Concat: a (whose Split parts are y1, y2), cur1 and cur2 (the optimizer fuses each Add
    # into its Conv); inside the neck one: up and m
    assert len(aplan.inner) == 5


@pytest.mark.skipif(not native.available, reason="native kernels not available")
def test_native_program_makes_no_copy_for_inputs_in_place(monkeypatch):
    """Replayed as a native program (not under the run-time checks, which record none): one row copy
    fewer per input placed (y1, y2, cur1, cur2, up, m), and the same results."""
    _, planned, copying, feed = _sessions(_model(1), monkeypatch)
    for _ in range(3):
        got = planned.run(None, feed)
    assert all(np.array_equal(a, b) for a, b in zip(got, copying.run(None, feed)))
    ours = next(iter(planned._mplans.values())).program_summary()
    theirs = next(iter(copying._mplans.values())).program_summary()
    assert ours.endswith("native calls") and theirs.endswith("native calls"), (ours, theirs)
    assert int(theirs.split()[0]) - int(ours.split()[0]) == 6


def test_batches_of_several_images_keep_copying(checked, monkeypatch):
    """With 2 images, an input is not one contiguous piece of the Concat's result: nothing goes inside."""
    data, planned, _, feed = _sessions(_model(2), monkeypatch)
    plain = minirt.Session(data, memory_plan=False).run(None, feed)
    for _ in range(3):
        assert all(np.array_equal(a, b) for a, b in zip(planned.run(None, feed), plain))
    assert not next(iter(planned._mplans.values())).inner


def test_an_input_twice_is_copied_twice(checked):
    a = h.make_node("Relu", ["x"], ["r"])
    cat = h.make_node("Concat", ["r", "r"], ["c"], axis=1)
    out = h.make_node("Sigmoid", ["c"], ["y"])
    model = h.make_model(h.make_graph([a, cat, out], "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 5, 5])],
                                      [h.make_tensor_value_info("y", TP.FLOAT, [1, 6, 5, 5])]),
                         opset_imports=[h.make_opsetid("", 17)])
    sess = minirt.Session(builder.build_bytes(model))
    x = np.random.default_rng(2).standard_normal((1, 3, 5, 5)).astype(np.float32)
    r = np.maximum(x, 0)
    want = 1 / (1 + np.exp(-np.concatenate([r, r], axis=1)))
    for _ in range(3):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-6, atol=1e-6)
    assert not next(iter(sess._mplans.values())).inner


@pytest.mark.parametrize("use_native", [False, True])
def test_concat_kernel_skips_inputs_already_at_their_piece(monkeypatch, use_native):
    """The kernel alone: an input that is the very piece of ``out`` it fills is left as is, the others are
    copied, on the numpy path and the native one."""
    if use_native and not native.available:
        pytest.skip("native kernels not available")
    monkeypatch.setattr(native, "available", use_native)
    rng = np.random.default_rng(3)
    out = np.full((1, 7, 4, 5), np.nan, np.float32)
    first = out[:, 0:2]
    first[...] = rng.standard_normal(first.shape)
    last = out[:, 5:7]
    last[...] = rng.standard_normal(last.shape)
    middle = rng.standard_normal((1, 3, 4, 5)).astype(np.float32)
    want = np.concatenate([first.copy(), middle, last.copy()], axis=1)
    y = tensor.concat(first, middle, last, axis=1, out=out)
    assert y is out
    np.testing.assert_array_equal(out, want)


def _many_inputs_model(n: int):
    """n Relu branches of x, concatenated along channels, then a Sigmoid (all recordable)."""
    nodes = [h.make_node("Relu", ["x"], [f"r{i}"]) if i % 2 else h.make_node("Sigmoid", ["x"], [f"r{i}"])
             for i in range(n)]
    nodes += [h.make_node("Concat", [f"r{i}" for i in range(n)], ["c"], axis=1), h.make_node("Sigmoid", ["c"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 2, 4, 4])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 2 * n, 4, 4])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_many_small_inputs_concatenate_at_once_outside_a_recording(checked):
    """Past tensor._MANY_INPUTS inputs and below _MANY_SMALL_BYTES, a Concat ignores the plan's buffer
    (one np.concatenate) unless a native program records, which still gets its row copies."""
    n = tensor._MANY_INPUTS + 4
    model = _many_inputs_model(n)
    data = builder.build_bytes(model)
    feed = {"x": np.random.default_rng(4).standard_normal((1, 2, 4, 4)).astype(np.float32)}
    plain = minirt.Session(data, memory_plan=False).run(None, feed)
    planned = minirt.Session(data)
    for _ in range(4):
        assert all(np.array_equal(a, b) for a, b in zip(planned.run(None, feed), plain))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    np.testing.assert_allclose(plain[0], want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not native.available, reason="native kernels not available")
def test_many_small_inputs_are_still_recorded():
    data = builder.build_bytes(_many_inputs_model(tensor._MANY_INPUTS + 4))
    sess = minirt.Session(data)
    feed = {"x": np.random.default_rng(5).standard_normal((1, 2, 4, 4)).astype(np.float32)}
    for _ in range(3):
        sess.run(None, feed)
    summary = next(iter(sess._mplans.values())).program_summary()
    assert summary.endswith("native calls"), summary


def test_many_small_inputs_kernel_alone():
    rng = np.random.default_rng(6)
    parts = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(tensor._MANY_INPUTS + 1)]
    out = np.full((3 * len(parts), 2), np.nan, np.float32)
    y = tensor.concat(*parts, axis=0, out=out)
    np.testing.assert_array_equal(y, np.concatenate(parts))
