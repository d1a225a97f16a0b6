"""Stopping a run (issue 22): ``RunOptions.terminate`` set from another thread and ``RunOptions.timeout``
(a minirt extension) stop a run before its next node and before every If / Loop / Scan body run, so an
endless Loop stops within one iteration; the session runs normally afterwards."""
from __future__ import annotations

import threading
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import minirt


def _endless_loop_model(inside_if: bool = False) -> bytes:
    """v = v0 + 1 + 1 + ...: a Loop whose trip count is 2^62 and whose condition stays true (optionally
    inside an If's branch, so the Loop runs in a body)."""
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"]), h.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
                 h.make_tensor_value_info("v_in", T.FLOAT, [1])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("v_out", T.FLOAT, [1])],
        [h.make_tensor("one", T.FLOAT, [1], [1.0])])
    loop = h.make_node("Loop", ["M", "c", "v0"], ["v"], body=body)
    consts = [h.make_tensor("M", T.INT64, [], [1 << 62]), h.make_tensor("c", T.BOOL, [], [True])]
    if inside_if:
        branch = h.make_graph([loop], "then", [], [h.make_tensor_value_info("v", T.FLOAT, [1])])
        other = h.make_graph([h.make_node("Identity", ["v0"], ["w"])], "else", [],
                             [h.make_tensor_value_info("w", T.FLOAT, [1])])
        nodes = [h.make_node("ReduceSum", ["v0"], ["s"], keepdims=0),
                 h.make_node("Greater", ["s", "minus"], ["p"]),
                 h.make_node("If", ["p"], ["out"], then_branch=branch, else_branch=other)]
        consts.append(h.make_tensor("minus", T.FLOAT, [], [-1.0]))
        out = "out"
    else:
        nodes, out = [loop], "v"
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("v0", T.FLOAT, [1])],
                     [h.make_tensor_value_info(out, T.FLOAT, [1])], consts)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture(scope="module", params=[False, True], ids=["loop", "loop_in_if"])
def endless(request, tmp_path_factory):
    from minirt import builder

    folder = tmp_path_factory.mktemp("endless")
    (folder / "m.onnx").write_bytes(_endless_loop_model(request.param))
    builder.build(str(folder / "m.onnx"), str(folder / "m.mrt"))
    return minirt.Session(str(folder / "m.mrt"))


FEED = {"v0": np.zeros(1, np.float32)}


def test_terminate_stops_an_endless_loop_within_100_ms(endless):
    options = minirt.RunOptions()
    set_at = []

    def stop():
        set_at.append(time.perf_counter())
        options.terminate = True

    timer = threading.Timer(0.2, stop)
    timer.start()
    with pytest.raises(minirt.RunTerminated, match="terminate flag"):
        endless.run(None, FEED, options)
    stopped = time.perf_counter() - set_at[0]
    timer.join()
    assert stopped < 0.1, f"stopped {stopped * 1e3:.1f} ms after terminate"


def test_a_timeout_stops_an_endless_loop(endless):
    options = minirt.RunOptions()
    options.timeout = 0.25
    t0 = time.perf_counter()
    with pytest.raises(minirt.RunTerminated, match="timeout of 0.25 s"):
        endless.run(None, FEED, options)
    assert 0.25 <= time.perf_counter() - t0 < 0.35


def test_a_finite_run_under_a_timeout():
    from tests.test_ort_compat import DIGITS  # the demo model: a run well under the timeout

    sess = minirt.InferenceSession(str(DIGITS))
    x = np.zeros((1, 1, 8, 8), np.float32)
    expected = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    options = minirt.RunOptions()
    options.timeout = 30
    np.testing.assert_array_equal(sess.run(None, {sess.get_inputs()[0].name: x}, options)[0], expected)


@pytest.mark.parametrize("bad", [0, -1.0, "1s", True, float("nan")])
def test_a_bad_timeout_is_refused(endless, bad):
    options = minirt.RunOptions()
    options.timeout = bad
    with pytest.raises(minirt.InvalidArgument, match="RunOptions.timeout must be a positive number"):
        endless.run(None, FEED, options)


def test_run_options_of_another_kind_need_only_terminate(endless):
    """onnxruntime's own RunOptions (no timeout attribute) work as they are."""

    class ForeignOptions:
        terminate = False

    options = ForeignOptions()
    threading.Timer(0.1, lambda: setattr(options, "terminate", True)).start()
    with pytest.raises(minirt.RunTerminated):
        endless.run(None, FEED, options)


def test_onnx_checker_accepts_the_endless_model():
    onnx.checker.check_model(onnx.load_from_string(_endless_loop_model(True)))
