"""The int8 depthwise rule (D30): static int8 quantizes depthwise convs over large input planes,
keeps the others float (weights stored int8), and arm64 targets keep every one float."""
import dataclasses

import numpy as np
import onnx
from onnx import helper as h

from minirt.builder.build import build
from minirt.builder.passes import optimize
from minirt.builder.passes import testing as T
from minirt.builder.quantize import QuantizeOptions, _run, quantize
from minirt.targets.profiles import get_target

R = np.random.default_rng(5)


def _model(side, dynamic: bool = False) -> onnx.ModelProto:
    """pointwise 8 -> 16, depthwise 3x3 on the input plane, stride-2 pointwise (half the side),
    depthwise 3x3 on that quarter-size plane, pointwise 16 -> 8."""
    nodes = [
        h.make_node("Conv", ["x", "w0", "b0"], ["a"], name="pw0"),
        h.make_node("Relu", ["a"], ["a_r"]),
        h.make_node("Conv", ["a_r", "w1", "b1"], ["d"], name="dw_large", group=16, pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["d"], ["d_r"]),
        h.make_node("Conv", ["d_r", "w2", "b2"], ["p"], name="pw_down", strides=[2, 2]),
        h.make_node("Relu", ["p"], ["p_r"]),
        h.make_node("Conv", ["p_r", "w3", "b3"], ["e"], name="dw_small", group=16, pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["e"], ["e_r"]),
        h.make_node("Conv", ["e_r", "w4", "b4"], ["y"], name="pw_out"),
    ]
    inits = [T.tensor("w0", R.standard_normal((16, 8, 1, 1)).astype(np.float32) * 0.3),
             T.tensor("w1", R.standard_normal((16, 1, 3, 3)).astype(np.float32) * 0.3),
             T.tensor("w2", R.standard_normal((16, 16, 1, 1)).astype(np.float32) * 0.3),
             T.tensor("w3", R.standard_normal((16, 1, 3, 3)).astype(np.float32) * 0.3),
             T.tensor("w4", R.standard_normal((8, 16, 1, 1)).astype(np.float32) * 0.3)]
    inits += [T.tensor(f"b{i}", R.standard_normal(n).astype(np.float32) * 0.1) for i, n in enumerate((16, 16, 16, 16, 8))]
    return T.make_model(nodes, [T.vinfo("x", [1, 8, "h" if dynamic else side, "w" if dynamic else side])],
                        [T.vinfo("y", [1, 8, "oh" if dynamic else side // 2, "ow" if dynamic else side // 2])], inits)


def _feeds(side, n=2):
    return [{"x": R.standard_normal((1, 8, side, side)).astype(np.float32)} for _ in range(n)]


def _float_depthwise(kept_float) -> set:
    return {k["node"] for k in kept_float if "depthwise" in k["reason"]}


def test_large_planes_from_the_static_shape_or_the_first_calibration_feed():
    # a threshold between the two planes (40 x 40 = 1600 and 20 x 20 = 400)
    for dynamic in (False, True):
        model = T.load(_model(40, dynamic))
        optimize(model, 2)
        float_model = model.clone()
        report = quantize(model, "int8", _feeds(40), QuantizeOptions(measure_latency=False),
                          target=dataclasses.replace(get_target("generic"), int8_depthwise_min_plane=1000))
        assert _float_depthwise(report.kept_float) == {"dw_small"}, dynamic
        qconvs = {n.name for n in model.graph if n.op_type == "QConv"}
        assert "dw_large" in qconvs and "dw_small" not in qconvs
        x = _feeds(40, 1)[0]
        y_ref = _run.session(float_model).run(None, x)[0]
        y = _run.session(model).run(None, x)[0]
        assert np.abs(y - y_ref).max() <= 0.05 * np.abs(y_ref).max()
        # int8-dynamic and the threshold at 0 (an arm64 profile): every depthwise conv float
        for mode, target in (("int8-dynamic", "generic"), ("int8", "rpi5")):
            m = float_model.clone()
            report = quantize(m, mode, _feeds(40), QuantizeOptions(measure_latency=False), target=target)
            assert _float_depthwise(report.kept_float) == {"dw_large", "dw_small"}, (mode, target)


def test_default_threshold_160_by_160_and_arm64_targets_keep_depthwise_float():
    assert get_target("generic").int8_depthwise_min_plane == 160 * 160
    model = _model(160)
    report = build(model, None, quantize="int8", calibration=_feeds(160, 1))
    assert _float_depthwise(report.quantization["kept_float"]) == {"dw_small"}  # 80 x 80 is below it
    # arm64 devices (NEON): the int8 depthwise kernel has only its portable path there
    for target in ("rpi5", "android-api33"):
        report = build(model, None, quantize="int8", calibration=_feeds(160, 1), target=target)
        assert _float_depthwise(report.quantization["kept_float"]) == {"dw_large", "dw_small"}, target


def test_a_model_with_an_int8_depthwise_conv_replays_as_a_native_program():
    """mrt_qdwconv2d is a recordable call (MRT_CALL_QDWCONV2D): the int8 depthwise conv on the large plane
    no longer keeps the run in Python (PP-OCR det's int8 builds ran node by node); the replay gives the
    node-by-node results exactly, at 1 and 2 threads."""
    import pytest

    import minirt
    from minirt import native

    if not native.available:
        pytest.skip("native kernels not built")
    report = build(_model(160), None, quantize="int8", calibration=_feeds(160, 1))
    assert "dw_large" in report.quantization["quantized"]
    feeds = _feeds(160, 4)
    for threads in (1, 2):
        sess = minirt.Session(report.data, threads=threads)
        nodes = minirt.Session(report.data, threads=threads, native_program=False)
        for feed in feeds:
            np.testing.assert_array_equal(sess.run(None, feed)[0], nodes.run(None, feed)[0])
        assert sess.native_program_status().startswith("yes"), sess.native_program_status()
