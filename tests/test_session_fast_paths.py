"""The session's steady-state shortcuts (D49): a feed with the layout of the last accepted one
is bound without repeating the checks, kernels run prepared native calls.  Every check must still
happen when anything changes, results must equal those of the first (validating) run, and outputs
must never alias the caller's arrays or the memory plan."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from minirt import builder
import minirt
from minirt.builder.build import build
from minirt.errors import InvalidArgument

DIGITS = Path(__file__).resolve().parent.parent / "examples" / "digits"


@pytest.fixture(scope="module")
def digits_artifacts(tmp_path_factory):
    d = tmp_path_factory.mktemp("digits")
    build(str(DIGITS / "digits_cnn.onnx"), str(d / "f.mrt"))
    build(str(DIGITS / "digits_cnn.onnx"), str(d / "q.mrt"), quantize="int8",
          calibration=str(DIGITS / "calibration.npz"))
    return {"float": str(d / "f.mrt"), "int8": str(d / "q.mrt")}


@pytest.fixture(scope="module")
def images():
    return np.load(DIGITS / "calibration.npz")["image"]


@pytest.mark.parametrize("build_kind", ["float", "int8"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("memory_plan", [True, False])
def test_repeated_runs_equal_first_runs_across_shape_changes(digits_artifacts, images, build_kind, threads,
                                                             memory_plan):
    """Batch 1, 1, 5, 1, 5 on one session equal each shape's first run on a fresh session, exactly."""
    path = digits_artifacts[build_kind]
    sess = minirt.InferenceSession(path, threads=threads, memory_plan=memory_plan)
    batches = [images[:1], images[1:2], images[2:7], images[:1], images[2:7]]
    got = [sess.run(None, {"image": np.ascontiguousarray(x)})[0] for x in batches]
    for x, y in zip(batches, got):
        want = minirt.InferenceSession(path, threads=threads, memory_plan=memory_plan).run(None, {"image": x})[0]
        np.testing.assert_array_equal(y, want)
    assert got[0] is not got[3] and not np.shares_memory(got[0], got[3])
    got[3][...] = 0  # the caller owns its outputs: later runs are unaffected
    np.testing.assert_array_equal(sess.run(None, {"image": images[:1]})[0], got[0])


def test_changed_feed_is_checked_again(digits_artifacts, images):
    sess = minirt.InferenceSession(digits_artifacts["float"], threads=1)
    x = np.ascontiguousarray(images[:1])
    ref = sess.run(None, {"image": x})[0]
    np.testing.assert_array_equal(sess.run(None, {"image": x})[0], ref)
    with pytest.raises(InvalidArgument, match="dtype"):
        sess.run(None, {"image": x.astype(np.float64)})
    with pytest.raises(InvalidArgument, match="rank"):
        sess.run(None, {"image": x[0]})
    with pytest.raises(InvalidArgument, match="dimension 2"):
        sess.run(None, {"image": np.zeros((1, 1, 9, 8), np.float32)})
    with pytest.raises(InvalidArgument, match="unknown input name"):
        sess.run(None, {"image": x, "other": x})
    with pytest.raises(InvalidArgument, match="missing input"):
        sess.run(None, {})
    # a nested list is converted (to the declared float32, as onnxruntime: docs/ort_compat.md; an
    # int list for it too, a string list refused) and a subclass of ndarray checked on every run
    np.testing.assert_array_equal(sess.run(None, {"image": x.tolist()})[0], ref)
    with pytest.raises(InvalidArgument, match="dtype"):
        sess.run(None, {"image": np.full(x.shape, "a").tolist()})

    class Sub(np.ndarray):
        pass

    np.testing.assert_array_equal(sess.run(None, {"image": x.view(Sub)})[0], ref)
    np.testing.assert_array_equal(sess.run(None, {"image": x})[0], ref)


def _identity_and_relu_model(shape):
    m = h.make_model(
        h.make_graph(
            [h.make_node("Identity", ["x"], ["same"]), h.make_node("Relu", ["x"], ["y"])], "g",
            [h.make_tensor_value_info("x", TP.FLOAT, shape)],
            [h.make_tensor_value_info("same", TP.FLOAT, shape), h.make_tensor_value_info("y", TP.FLOAT, shape)],
        ),
        opset_imports=[h.make_opsetid("", 17)],
    )
    onnx.checker.check_model(m)
    return m


@pytest.mark.parametrize("shape", [[2, 3], ["n", 3]])
def test_outputs_never_alias_the_feed_on_repeated_runs(shape):
    sess = minirt.Session(builder.build_bytes(_identity_and_relu_model(shape)))
    for _ in range(3):
        x = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], np.float32)
        same, y = sess.run(None, {"x": x})
        assert not np.shares_memory(same, x)
        np.testing.assert_array_equal(same, x)
        np.testing.assert_array_equal(y, np.maximum(x, 0))
    with pytest.raises(InvalidArgument):
        sess.run(None, {"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(InvalidArgument):
        sess.run(None, {"x": np.zeros((2, 3), np.int32)})


@pytest.mark.parametrize("memory_plan", [True, False])
def test_weights_computed_at_run_time_are_never_taken_from_a_cache(memory_plan):
    """Conv (channel-vector and GEMM geometries, depthwise), MatMul and Gemm whose weights, bias and
    residual are computed from the feed: the memory plan hands each node the same buffer object on
    every run with new values in it, so nothing derived from them (packed weights, a folded bias)
    may be kept by identity.  Every run against onnxruntime, the weights changing each time."""
    ort = pytest.importorskip("onnxruntime")
    shapes = {"x": [1, 64, 10, 10], "wi": [64, 64, 3, 3], "dwi": [64, 1, 3, 3], "a": [1, 64, 128], "bi": [128, 128],
              "zi": [128], "ci": [128, 96], "gi": [128, 128]}
    nodes = [h.make_node("Relu", ["wi"], ["w"]), h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["dwi"], ["dw"]), h.make_node("Conv", ["x", "dw"], ["yd"], pads=[1, 1, 1, 1], group=64),
             h.make_node("Relu", ["bi"], ["b"]), h.make_node("MatMul", ["a", "b"], ["m"]),
             h.make_node("Relu", ["zi"], ["z"]), h.make_node("Add", ["m", "z"], ["mz"]),
             h.make_node("Relu", ["ci"], ["c"]), h.make_node("MatMul", ["a", "c"], ["mc"]),
             h.make_node("Reshape", ["a", "two_d"], ["a2"]), h.make_node("Relu", ["gi"], ["g"]),
             h.make_node("Gemm", ["a2", "g", "z"], ["gm"], transB=1)]
    outs = {"y": [1, 64, 10, 10], "yd": [1, 64, 10, 10], "mz": [1, 64, 128], "mc": [1, 64, 96], "gm": [64, 128]}
    graph = h.make_graph(nodes, "computed_weights", [h.make_tensor_value_info(k, TP.FLOAT, v) for k, v in shapes.items()],
                         [h.make_tensor_value_info(k, TP.FLOAT, v) for k, v in outs.items()],
                         [onnx.numpy_helper.from_array(np.array([64, 128], np.int64), "two_d")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    sess = minirt.Session(build(model, None).data, threads=1, memory_plan=memory_plan)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    fixed = {k: rng.standard_normal(shapes[k]).astype(np.float32) for k in ("x", "a")}
    for _ in range(5):
        feed = dict(fixed, **{k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items() if k not in fixed})
        for name, got, want in zip(outs, sess.run(None, feed), ref.run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3, err_msg=name)
