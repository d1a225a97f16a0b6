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


def _seconds_from_terminate_to_stop(sess, feed, after: float) -> float:
    """Run ``sess`` with run options whose terminate flag another thread sets ``after`` seconds in; the run
    must end in RunTerminated.  Returns how long after the flag it stopped."""
    options = minirt.RunOptions()
    set_at = []

    def stop():
        set_at.append(time.perf_counter())
        options.terminate = True

    timer = threading.Timer(after, stop)
    timer.start()
    with pytest.raises(minirt.RunTerminated, match="terminate flag"):
        sess.run(None, feed, options)
    stopped = time.perf_counter() - set_at[0]
    timer.join()
    return stopped


def test_terminate_stops_an_endless_loop_within_100_ms(endless):
    stopped = _seconds_from_terminate_to_stop(endless, FEED, 0.2)
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


# --- inside a native kernel: a convolution of 43 GFLOPs (and a small one after it) (0.3 s or more on any host of the 2020s), which
# the kernels stop between their work items (one thread's pieces, or the pool's chunks and each
# worker's own pieces); an unwatched run is not affected.

@pytest.fixture(scope="module")
def long_conv():
    from minirt import builder

    rng = np.random.default_rng(0)
    c = 768
    w = (rng.standard_normal((c, c, 3, 3)) * 0.01).astype(np.float32)
    w2 = (rng.standard_normal((8, c, 1, 1)) * 0.01).astype(np.float32)
    # (then a small 1x1 conv: the big conv's result is an arena buffer, so the session records a program)
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["t"], pads=[1, 1, 1, 1]), h.make_node("Conv", ["t", "w2"], ["y"])],
                     "g", [h.make_tensor_value_info("x", T.FLOAT, [1, c, 64, 64])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 64, 64])],
                     [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(w2, "w2")])
    data = builder.build_bytes(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]))
    return data, {"x": rng.standard_normal((1, c, 64, 64)).astype(np.float32)}


@pytest.mark.skipif(not minirt.native.available, reason="stopping inside a kernel is the native kernels' doing")
@pytest.mark.parametrize("threads", [1, 2])
def test_terminate_stops_a_long_native_kernel_within_100_ms(long_conv, threads):
    data, feed = long_conv
    stopped = _seconds_from_terminate_to_stop(minirt.Session(data, threads=threads), feed, 0.05)
    assert stopped < 0.1, f"stopped {stopped * 1e3:.1f} ms after terminate"


@pytest.mark.skipif(not minirt.native.available, reason="stopping inside a kernel is the native kernels' doing")
def test_a_timeout_stops_a_long_native_kernel_and_the_session_runs_on(long_conv):
    data, feed = long_conv
    sess = minirt.Session(data, threads=2, native_program=False)  # (the plain node loop this time)
    options = minirt.RunOptions()
    options.timeout = 0.02
    t0 = time.perf_counter()
    with pytest.raises(minirt.RunTerminated, match="timeout of 0.02 s"):
        sess.run(None, feed, options)
    assert time.perf_counter() - t0 < 0.1
    # the next run, watched with room, computes what a fresh session computes
    options.timeout = 600
    np.testing.assert_array_equal(sess.run(None, feed, options)[0], minirt.Session(data, threads=2).run(None, feed)[0])


@pytest.mark.skipif(not minirt.native.available, reason="native programs need the native kernels")
def test_a_run_stopped_while_it_records_its_program_keeps_no_program(long_conv):
    """The run that records the native program (the session's second) is stopped inside its kernel: the
    program, whose fixed results may be incomplete, is not kept; the next run records it again."""
    data, feed = long_conv
    sess = minirt.Session(data, threads=2, warm_up=False)
    expected = sess.run(None, feed)[0]  # (the first run records the memory plan; the second, the program)
    options = minirt.RunOptions()
    options.timeout = 0.02
    with pytest.raises(minirt.RunTerminated):
        sess.run(None, feed, options)
    assert sess.memory_plans()[0]["native_program"] is None
    np.testing.assert_array_equal(sess.run(None, feed)[0], expected)
    assert sess.memory_plans()[0]["native_program"].endswith("native calls")


@pytest.mark.skipif(not minirt.native.available, reason="stopping inside a kernel is the native kernels' doing")
@pytest.mark.parametrize("threads", [1, 2])
def test_a_watched_kernel_does_no_work_once_cancelled(threads):
    """Deterministically, without timing: a GEMM called on a thread that watches a cancellation already
    set leaves its output untouched (every piece of its work is behind a check), and runs whole when
    the flag is clear."""
    from minirt import native

    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((256, 300)).astype(np.float32), rng.standard_normal((300, 200)).astype(np.float32)
    c = native.new_cancel(None)
    native.set_threads(threads)
    try:
        y = np.full((256, 200), np.nan, np.float32)
        c.terminate = 1
        with native.watching(c):
            native.sgemm(a, b, y)
        assert np.isnan(y).all()
        c.terminate = 0
        with native.watching(c):
            native.sgemm(a, b, y)
        np.testing.assert_allclose(y, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    finally:
        native.set_threads(None)


@pytest.mark.skipif(not minirt.native.available, reason="native programs need the native kernels")
def test_a_replayed_program_stops_between_its_calls():
    from minirt import native
    from tests.test_ort_compat import DIGITS

    sess = minirt.Session(str(DIGITS))
    feed = {sess.get_inputs()[0].name: np.zeros((1, 1, 8, 8), np.float32)}
    expected = sess.run(None, feed)[0]
    sess.run(None, feed)
    aplan = next(p for p in sess._mplans.values() if p is not None)
    program = aplan._free[-1].program
    assert program.n > 1
    env = sess._plan.new_env()
    sess._bind_inputs(env, feed)
    c = native.new_cancel(None)
    c.terminate = 1
    with native.watching(c), pytest.raises(minirt.RunTerminated, match="native program"):
        program.run(env)
    assert program.run(env) == -1  # (unwatched: every call)
    np.testing.assert_array_equal(program.results(sess._plan.graph.outputs, env)[0], expected)


@pytest.mark.skipif(not minirt.native.available, reason="native programs need the native kernels")
def test_the_cancelled_code_is_the_headers():
    from minirt import native

    assert native.CANCELLED == native._lib.MRT_CANCELLED != -100  # (-100: a call of an unknown entry)
