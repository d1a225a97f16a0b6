"""If / Loop bodies with memory plans and native programs of their own (minirt/plan.py SubgraphMemory,
D76): a Loop of fixed-shape iterations records its body once and replays it from C, with the same
results as running the nodes and as onnxruntime, for every new input."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import minirt
from minirt.builder.build import build

from tests.native.conftest import requires_native

pytestmark = requires_native


def _loop_model(trips: int = 6):
    """y = Loop(trips) { h = tanh(h @ W + b) * 0.5 + x }: a recurrence whose body is a MatMul, an Add, a
    Tanh, a Mul and an Add on fixed shapes; W, b from the main graph (captures), x the loop's input."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 16)) / 4).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    body = h.make_graph(
        [h.make_node("MatMul", ["h_in", "W"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
         h.make_node("Tanh", ["a"], ["t"]), h.make_node("Mul", ["t", "half"], ["s"]),
         h.make_node("Add", ["s", "x"], ["h_out"]), h.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("cond_in", TP.BOOL, []),
         h.make_tensor_value_info("h_in", TP.FLOAT, [4, 16])],
        [h.make_tensor_value_info("cond_out", TP.BOOL, []), h.make_tensor_value_info("h_out", TP.FLOAT, [4, 16])])
    nodes = [h.make_node("Loop", ["trips", "cond", "h0"], ["y"], body=body)]
    inits = [w, b, half, numpy_helper.from_array(np.array(trips, np.int64), "trips"),
             numpy_helper.from_array(np.array(True), "cond")]
    graph = h.make_graph(nodes, "loop", [h.make_tensor_value_info("x", TP.FLOAT, [4, 16]),
                                         h.make_tensor_value_info("h0", TP.FLOAT, [4, 16])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [4, 16])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("threads", [1, 2])
def test_a_loop_body_replays_as_a_native_program(threads):
    ort = pytest.importorskip("onnxruntime")
    model = _loop_model()
    data = build(model, None).data
    sess = minirt.Session(data, threads=threads)
    plain = minirt.Session(data, threads=threads, memory_plan=False)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for _ in range(4):
        feed = {"x": rng.standard_normal((4, 16)).astype(np.float32),
                "h0": rng.standard_normal((4, 16)).astype(np.float32)}
        (got,), (want,), (nodes,) = sess.run(None, feed), ref.run(None, feed), plain.run(None, feed)
        np.testing.assert_array_equal(got, nodes)  # (the replay is the nodes' own computation)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    (programs,) = sess.subgraph_programs().values()
    assert programs and programs[0].endswith("native calls"), programs
    assert plain.subgraph_programs() == {}


def test_loop_outputs_do_not_alias_the_body_arena():
    """Each iteration's result is fed to the next one and the last one is returned: none of them may
    be a buffer the next replay overwrites."""
    data = build(_loop_model(3), None).data
    sess = minirt.Session(data, threads=1)
    feed = {"x": np.ones((4, 16), np.float32), "h0": np.zeros((4, 16), np.float32)}
    first = [sess.run(None, feed)[0] for _ in range(4)]
    other = sess.run(None, {"x": np.full((4, 16), 3, np.float32), "h0": np.zeros((4, 16), np.float32)})[0]
    for y in first[1:]:
        np.testing.assert_array_equal(y, first[0])  # (earlier results unchanged by later runs)
    assert not np.array_equal(other, first[0])
