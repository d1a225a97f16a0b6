"""If / Loop bodies with memory plans and native programs of their own (minirt/plan.py SubgraphMemory,
D76): a Loop of fixed-shape iterations records its body once and replays it from C, with the same
results as running the nodes and as onnxruntime, for every new input."""
from __future__ import annotations

import re

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


# --------------------------------------------------------------------------- If inlined into a program (D94)


def _if_model(condition: str = "shape", nested: bool = False):
    """y = sigmoid(If(cond) { relu(x) + c } else { x * 3 }) + c, x of shape (N, 4) with N symbolic.  ``condition``:
    "shape" (N == 2: fixed within a program's input signature) or "data" (sum(x) > 0: changes run to
    run).  ``nested``: the then branch holds a second If, on x's second dimension == 4 (true), whose
    then branch adds c and else branch subtracts it."""
    c = numpy_helper.from_array(np.arange(4, dtype=np.float32), "c")
    three = numpy_helper.from_array(np.array(3.0, np.float32), "three")
    if nested:
        inner = h.make_node(
            "If", ["cond4"], ["t"],
            then_branch=h.make_graph([h.make_node("Add", ["r", "c"], ["ta"])], "inner_then", [],
                                     [h.make_tensor_value_info("ta", TP.FLOAT, None)]),
            else_branch=h.make_graph([h.make_node("Sub", ["r", "c"], ["tb"])], "inner_else", [],
                                     [h.make_tensor_value_info("tb", TP.FLOAT, None)]))
        then_nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Shape", ["x"], ["s2"]),
                      h.make_node("Gather", ["s2", "one"], ["d1"]), h.make_node("Equal", ["d1", "four"], ["cond4"]),
                      inner]
    else:
        then_nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Add", ["r", "c"], ["t"])]
    then_g = h.make_graph(then_nodes, "then", [], [h.make_tensor_value_info("t", TP.FLOAT, None)])
    else_g = h.make_graph([h.make_node("Mul", ["x", "three"], ["e"])], "else", [],
                          [h.make_tensor_value_info("e", TP.FLOAT, None)])
    if condition == "shape":
        cond_nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "zero"], ["n"]),
                      h.make_node("Equal", ["n", "two"], ["cond"])]
    else:
        cond_nodes = [h.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
                      h.make_node("Greater", ["total", "fzero"], ["cond"])]
    nodes = cond_nodes + [h.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g),
                          h.make_node("Sigmoid", ["z"], ["sz"]), h.make_node("Add", ["sz", "c"], ["y"])]
    inits = [c, three, numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array(2, np.int64), "two"),
             numpy_helper.from_array(np.array(4, np.int64), "four"),
             numpy_helper.from_array(np.array(0.0, np.float32), "fzero")]
    graph = h.make_graph(nodes, "if_model", [h.make_tensor_value_info("x", TP.FLOAT, ["N", 4])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["N", 4])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _program_of(sess: minirt.Session, rows: int):
    (plan,) = [p for p in sess.memory_plans() if p["inputs"]["x"] == (rows, 4)]
    return plan["native_program"]


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_an_if_on_shapes_records_its_branch_into_the_program(nested, threads):
    """The If's condition comes from x's shape: within one input signature it is fixed, so the program
    holds the calls of the branch taken (both branches, in the programs of two signatures; a nested If
    inside the branch too), and its replays equal the nodes run one by one and onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    model = _if_model("shape", nested)
    data = build(model, None).data
    sess = minirt.Session(data, threads=threads)
    plain = minirt.Session(data, threads=threads, native_program=False)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for rows in (2, 3, 2, 3, 2, 3, 2, 3):  # (then branch for 2 rows, else for 3; several runs each)
        feed = {"x": rng.standard_normal((rows, 4)).astype(np.float32)}
        (got,), (want,), (nodes,) = sess.run(None, feed), ref.run(None, feed), plain.run(None, feed)
        np.testing.assert_array_equal(got, nodes)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # the taken branch's calls and the two after the If: then = Relu, Add (in the nested If when nested);
    # else = Mul
    assert (_program_of(sess, 2), _program_of(sess, 3)) == ("4 native calls", "3 native calls")


def test_an_if_on_data_keeps_the_run_in_python():
    """sum(x) > 0 changes from run to run: the If is not recorded (the program is refused, naming the
    If), and every run takes the branch its own data chooses."""
    ort = pytest.importorskip("onnxruntime")
    model = _if_model("data")
    data = build(model, None).data
    sess = minirt.Session(data, threads=1)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for sign in (1, -1, 1, -1, 1, -1):
        feed = {"x": (sign * np.abs(rng.standard_normal((2, 4)))).astype(np.float32)}
        np.testing.assert_allclose(sess.run(None, feed)[0], ref.run(None, feed)[0], rtol=1e-6, atol=1e-6)
    program = _program_of(sess, 2)
    assert program is not None and "(If) has subgraphs" in program, program


def test_native_program_status_names_the_subgraphs_that_replay():
    """A model whose whole body sits in an If on an input's value (Silero VAD v5's shape: Equal -> If, no
    memory plan for the main graph): Session.native_program_status says "partly" and names the branch
    whose program replays (as for a main graph that is one Loop); an If on the input's shape is recorded into the
main graph's program: "yes"; an If on computed data says "no" and why."""
    c = numpy_helper.from_array(np.full(4, 0.25, np.float32), "c")
    three = numpy_helper.from_array(np.array(3.0, np.float32), "three")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    then_g = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("Add", ["r", "c"], ["t"])], "then_body",
                          [], [h.make_tensor_value_info("t", TP.FLOAT, None)])
    else_g = h.make_graph([h.make_node("Mul", ["x", "three"], ["e"])], "else_body", [],
                          [h.make_tensor_value_info("e", TP.FLOAT, None)])
    graph = h.make_graph(
        [h.make_node("Equal", ["flag", "one"], ["cond"]),
         h.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
        "whole_body_in_if", [h.make_tensor_value_info("x", TP.FLOAT, ["N", 4]),
                             h.make_tensor_value_info("flag", TP.INT64, [])],
        [h.make_tensor_value_info("y", TP.FLOAT, ["N", 4])], [c, three, one])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    sess = minirt.Session(build(model, None).data, threads=1)
    assert sess.native_program_status() == "no: no memory plan (shapes not fixed)"  # (nothing ran yet)
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    for _ in range(3):
        (y,) = sess.run(None, {"x": x, "flag": np.array(1, np.int64)})
        np.testing.assert_allclose(y, np.maximum(x, 0) + 0.25, rtol=1e-6)
    status = sess.native_program_status()
    assert status.startswith("partly: 1 subgraph(s)") and "'then_body': 2 native calls" in status, status
    assert "(Equal, If)" in status, status

    loop = minirt.Session(build(_loop_model(), None).data, threads=1)
    feed = {"x": np.ones((4, 16), np.float32), "h0": np.zeros((4, 16), np.float32)}
    for _ in range(3):
        loop.run(None, feed)
    assert re.fullmatch(r"partly: 1 subgraph\(s\) replay .*'body': 5 native calls.*1 node\(s\) \(Loop\).*",
                        loop.native_program_status()), loop.native_program_status()

    on_shape = minirt.Session(build(_if_model("shape"), None).data, threads=1)
    for _ in range(3):
        on_shape.run(None, {"x": np.ones((2, 4), np.float32)})
    assert on_shape.native_program_status() == "yes (4 native calls)"

    on_data = minirt.Session(build(_if_model("data"), None).data, threads=1)
    for _ in range(3):
        on_data.run(None, {"x": np.ones((2, 4), np.float32)})
    status = on_data.native_program_status()
    assert status.startswith("no: ") and "(If) has subgraphs" in status, status
