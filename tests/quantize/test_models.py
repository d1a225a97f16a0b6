"""End to end: quantize the digits demo model (and PP-OCR det) and run the artifacts with minirt."""
import contextlib
import dataclasses
import os

import numpy as np
import onnx_ir as ir
import pytest

import minirt
from minirt.builder.errors import BuildError
from minirt.builder.quantize import QuantizeOptions, _run, demo_rows, quantize
from minirt.format import reader
from minirt.targets.profiles import get_target
from tests.quantize.conftest import DIGITS, ROOT, optimized, ort_reference_session

NO_TIMING = dict(measure_latency=False)


def _generic(**rules):
    """The generic target profile with other int8 speed rules (targets/profiles.py)."""
    return dataclasses.replace(get_target("generic"), **rules)


def _accuracy(model, images, labels):
    return float((_run.session(model).run(None, {"image": images})[0].argmax(1) == labels).mean())


def test_int8_digits_size_and_accuracy(digits, heldout, calib):
    images, labels = heldout
    float_model = digits.clone()
    report = quantize(digits, "int8", calib, QuantizeOptions(eval=[{"image": images, "label": labels}], **NO_TIMING))
    ops = {n.op_type for n in digits.graph}
    assert {"QConv", "QMatMul"} <= ops
    assert report.size_ratio <= 0.3
    f_acc, q_acc = _accuracy(float_model, images, labels), _accuracy(digits, images, labels)
    assert q_acc >= f_acc - 0.01
    acc = report.accuracy["logits"]
    assert acc["float_accuracy"] == pytest.approx(f_acc) and acc["quant_accuracy"] == pytest.approx(q_acc)
    assert acc["cosine"] > 0.999 and 0 < acc["max_abs"] < 1 and acc["top1_agreement"] > 0.98
    # the final Gemm is int8 too by default (D149); with quantize_final=False it computes in float
    assert not any("final layer" in k["reason"] for k in report.kept_float)
    assert "int8 layers: 5" in str(report)
    float_final = float_model.clone()
    report = quantize(float_final, "int8", calib, QuantizeOptions(quantize_final=False, **NO_TIMING))
    assert any("final layer" in k["reason"] for k in report.kept_float) and "int8 layers: 4" in str(report)


@pytest.mark.parametrize("native_on", [True, False])
def test_int8_chained_is_identical_to_unchained(native_on, digits, heldout, calib):
    """chain_int8: QConv -> QConv passes uint8 in the consumer's quantization (output_scale /
    output_zero_point, uint8 value type); the outputs equal the unchained build's exactly,
    on the native kernels and on the numpy reference path."""
    from tests.native.conftest import numpy_path

    images, _ = heldout
    plain = digits.clone()
    quantize(plain, "int8", calib, QuantizeOptions(chain_int8=False, **NO_TIMING))
    quantize(digits, "int8", calib, QuantizeOptions(chain_int8=True, **NO_TIMING))
    chained = [n for n in digits.graph if n.op_type == "QConv" and "output_scale" in n.attributes]
    assert [n.name for n in chained] == ["/0/Conv"]  # -> /3/Conv; /3 has the MaxPool fused, /7 feeds Flatten
    assert chained[0].outputs[0].dtype == ir.DataType.UINT8
    assert not any("output_scale" in n.attributes for n in plain.graph)
    if native_on:
        y_plain = _run.session(plain).run(None, {"image": images})[0]
        y_chain = _run.session(digits).run(None, {"image": images})[0]
    else:
        with numpy_path():
            y_plain = _run.session(plain).run(None, {"image": images})[0]
            y_chain = _run.session(digits).run(None, {"image": images})[0]
    np.testing.assert_array_equal(y_chain, y_plain)


@pytest.mark.parametrize("native_on", [True, False])
def test_int8_max_pool_and_flatten_fused(native_on, digits, heldout, calib):
    """fuse_pool_flatten (default): digits' MaxPool after /3/Conv becomes that QConv's pool_kernel_shape /
    pool_strides, keeping the pooled value's name, and the Flatten before the QMatMul its flatten_axis;
    outputs equal the unfused build's exactly."""
    from tests.native.conftest import numpy_path

    images, _ = heldout
    plain = digits.clone()
    quantize(plain, "int8", calib, QuantizeOptions(fuse_pool_flatten=False, **NO_TIMING))
    quantize(digits, "int8", calib, QuantizeOptions(**NO_TIMING))
    assert "MaxPool" in {n.op_type for n in plain.graph} and "MaxPool" not in {n.op_type for n in digits.graph}
    pooled = [n for n in digits.graph if "pool_kernel_shape" in n.attributes]
    assert [n.name for n in pooled] == ["/3/Conv"]
    assert list(pooled[0].attributes["pool_kernel_shape"].value) == [2, 2]
    assert list(pooled[0].attributes["pool_strides"].value) == [2, 2]
    assert pooled[0].outputs[0].name == "/6/MaxPool_output_0"
    assert "Flatten" in {n.op_type for n in plain.graph} and "Flatten" not in {n.op_type for n in digits.graph}
    qmatmul = [n for n in digits.graph if n.op_type == "QMatMul" and "flatten_axis" in n.attributes]
    assert len(qmatmul) == 1 and qmatmul[0].attributes["flatten_axis"].value == 1
    assert qmatmul[0].inputs[0].producer().name == "/7/Conv"
    with numpy_path() if not native_on else contextlib.nullcontext():
        y_plain = _run.session(plain).run(None, {"image": images})[0]
        y_fused = _run.session(digits).run(None, {"image": images})[0]
        y_one = _run.session(digits).run(None, {"image": images[:1]})[0]  # batch 1: no images side by side
        y_one_plain = _run.session(plain).run(None, {"image": images[:1]})[0]
    np.testing.assert_array_equal(y_fused, y_plain)
    np.testing.assert_array_equal(y_one, y_one_plain)


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_int8_calibration_methods_keep_accuracy(method, digits, heldout, calib):
    images, labels = heldout
    report = quantize(digits, "int8", calib, QuantizeOptions(method=method, eval=[{"image": images, "label": labels}],
                                                             **NO_TIMING))
    acc = report.accuracy["logits"]
    assert acc["quant_accuracy"] >= acc["float_accuracy"] - 0.01


def test_int8_symmetric_and_per_tensor_options(digits, heldout, calib):
    images, labels = heldout
    report = quantize(digits, "int8", calib, QuantizeOptions(symmetric_activations=True, per_channel=False,
                                                             quantize_final=True, **NO_TIMING))
    assert not any("final layer" in k["reason"] for k in report.kept_float)
    zps = [v.const_value.numpy() for n, v in digits.graph.initializers.items() if n.endswith("_qzp")]
    assert zps and all(z.dtype == np.int8 and z == 0 for z in zps)
    assert _accuracy(digits, images, labels) > 0.95


def test_int8_dynamic_needs_no_calibration(digits, heldout):
    images, labels = heldout
    float_acc = _accuracy(digits.clone(), images, labels)
    report = quantize(digits, "int8-dynamic", None, QuantizeOptions(eval=[{"image": images}], **NO_TIMING))
    assert report.size_ratio <= 0.3
    assert not any(n.endswith("_qscale") for n in digits.graph.initializers)
    assert _accuracy(digits, images, labels) >= float_acc - 0.01


def test_int8_without_calibration_is_refused(digits):
    with pytest.raises(BuildError, match="needs calibration data"):
        quantize(digits, "int8", None)


def test_fp16_digits_within_1e_2(digits, heldout):
    images, _ = heldout
    report = quantize(digits, "fp16", None, QuantizeOptions(eval=[{"image": images}], **NO_TIMING))
    assert report.size_ratio <= 0.55
    assert report.accuracy["logits"]["max_abs"] < 1e-2


def test_accuracy_budget_returns_layers_to_float(digits, heldout, calib):
    images, labels = heldout
    # An impossible-to-meet-while-quantized budget: every layer goes back to float, most sensitive first.
    report = quantize(digits, "int8", calib, QuantizeOptions(accuracy_budget="cosine>=0.9999999",
                                                             eval=[{"image": images[:64]}], **NO_TIMING))
    b = report.budget
    assert b["reverted"] and all("quantized alone" in r["why"] for r in b["reverted"])
    assert len(report.quantized) + len(b["reverted"]) == 5
    scores = [b["sensitivity"][r["node"]]["cosine_deficit"] for r in b["reverted"]]
    assert scores == sorted(scores, reverse=True)
    assert any("accuracy budget" in k["reason"] for k in report.kept_float)
    # A budget that already holds changes nothing.
    fresh = optimized(DIGITS)
    report = quantize(fresh, "int8", calib, QuantizeOptions(accuracy_budget="top1-drop<=1",
                                                            eval=[{"image": images, "label": labels}], **NO_TIMING))
    assert report.budget["met"] and not report.budget["reverted"] and len(report.quantized) == 5


def test_bad_budget_spec_is_explained(digits, calib):
    with pytest.raises(BuildError, match="accuracy-budget"):
        quantize(digits, "int8", calib, QuantizeOptions(accuracy_budget="top1 < 1"))


def test_latency_is_measured_and_slowdown_reported(digits, calib):
    # the build machine's timing is reported only; the warning follows the target's cost-model estimate
    # (D87: this machine is not the device, and its load moves the timing)
    report = quantize(digits, "int8", calib, QuantizeOptions(latency_runs=2))
    lat = report.latency
    assert lat["float_ms"] > 0 and lat["quant_ms"] > 0 and lat["ratio"] == pytest.approx(lat["quant_ms"] / lat["float_ms"])
    warned = any("faster" in w for w in report.warnings)
    assert report.estimate.get("ratio") is not None
    assert warned == (report.estimate["ratio"] >= 0.95)


def test_report_is_json_serialisable(digits, calib):
    import json

    report = quantize(digits, "int8", calib, QuantizeOptions(**NO_TIMING))
    json.dumps(report.as_dict())


def test_demo_rows(tmp_path, digits, heldout, calib):
    images, labels = heldout
    float_bytes = _run.artifact_bytes(digits)
    quantize(digits, "int8", calib, QuantizeOptions(**NO_TIMING))
    rows = demo_rows(float_bytes, _run.artifact_bytes(digits), images, labels, runs=2)
    assert [r[0] for r in rows] == ["model size", "accuracy", "latency batch 1", f"latency batch {len(labels)}"]


def _rapidocr_model(name):
    rapidocr = pytest.importorskip("rapidocr_onnxruntime")
    path = os.path.join(os.path.dirname(rapidocr.__file__), "models", name)
    if not os.path.exists(path):
        pytest.skip(f"{name} not installed")
    return path


def test_ppocr_det_int8_and_fp16_sizes():
    from tests.native.conftest import numpy_path

    path = _rapidocr_model("ch_PP-OCRv4_det_infer.onnx")
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 3, 64, 96)).astype(np.float32)} for _ in range(2)]
    model = optimized(path)
    # (random inputs: the default accuracy budget, which would return layers to float, is off here)
    report = quantize(model, "int8", feeds, QuantizeOptions(**NO_TIMING, accuracy_budget="none"),
                      target=_generic(int8_depthwise=True))
    # with int8_depthwise (a target profile field), depthwise convolutions are int8 too (D46): per-channel input scales,
    # chained in uint8 with their neighbours; the learnable affine Mul / Add after each QConv folded
    assert report.size_ratio <= 0.30
    assert len(report.quantized) > 40
    assert not any("depthwise" in k["reason"] for k in report.kept_float)
    qconvs = [n for n in model.graph if n.op_type == "QConv"]
    depthwise = [n for n in qconvs if n.inputs[3].shape[1] == 1]
    assert len(depthwise) >= 14 and all(n.inputs[1].shape == (n.inputs[3].shape[0],) for n in depthwise)
    assert sum("output_scale" in n.attributes for n in qconvs) >= 20  # into and out of the depthwise convs
    # the maps after the pointwise convs (those after a depthwise conv already went into the next
    # pointwise conv's weights in the optimizer: fold_input_affine)
    assert sum("post_scale" in n.attributes for n in qconvs) >= 15
    dequant = [n for n in model.graph if n.op_type == "DequantizeWeights"]
    # the small convs kept float: int8 weights from weight_only_min_elements, float16 below (D174)
    assert dequant and {n.inputs[0].dtype for n in dequant} == {ir.DataType.INT8, ir.DataType.FLOAT16}
    # the head's first 2x2 / stride-2 ConvTranspose in int8 (D55); the second, the final layer,
    # stays float unless asked (quantize_final_conv_transpose)
    convt = [n for n in model.graph if n.op_type == "QConvTranspose"]
    assert len(convt) == 1
    assert sum(n.op_type == "FusedConvTranspose" for n in model.graph) == 1
    y = _run.session(model).run(None, feeds[0])[0]
    assert y.shape == (1, 1, 64, 96) and np.isfinite(y).all()
    with numpy_path():  # the numpy reference path of every quantized op
        np.testing.assert_allclose(_run.session(model).run(None, feeds[0])[0], y, atol=0.02)
    # the defaults (D29): depthwise float, weights stored int8; the affine Mul / Add still folded
    # (the default accuracy budget off again: random inputs)
    model = optimized(path)
    report = quantize(model, "int8", feeds, QuantizeOptions(**NO_TIMING, accuracy_budget="none"))
    assert report.size_ratio <= 0.30
    depthwise = [k for k in report.kept_float if "depthwise" in k["reason"]]
    assert len(depthwise) >= 14 and any("weights stored int8" in k["reason"] for k in depthwise)  # (the big ones)
    assert not any(n.op_type == "QConv" and n.inputs[3].shape[1] == 1 for n in model.graph)
    assert sum("post_scale" in n.attributes for n in model.graph if n.op_type == "QConv") >= 10
    y_default = _run.session(model).run(None, feeds[0])[0]
    assert np.abs(y_default - y).max() < 0.5
    # the defaults before D46: depthwise float, nothing chained, Mul / Add nodes
    model = optimized(path)
    report = quantize(model, "int8", feeds, QuantizeOptions(chain_int8=False, fold_affine=False, **NO_TIMING))
    depthwise = [k for k in report.kept_float if "depthwise" in k["reason"]]
    assert depthwise and any("weights stored int8" in k["reason"] for k in depthwise)
    assert {k["node"] for k in depthwise if "weights stored int8" in k["reason"]} <= set(report.weight_only)
    assert not any("post_scale" in n.attributes or "output_scale" in n.attributes for n in model.graph)
    y_plain = _run.session(model).run(None, feeds[0])[0]
    assert np.abs(y_plain - y).max() < 0.5
    model = optimized(path)
    report = quantize(model, "fp16", None, QuantizeOptions(eval=feeds, **NO_TIMING))
    assert report.size_ratio <= 0.55
    assert report.accuracy["sigmoid_0.tmp_0"]["cosine"] > 0.999
    assert report.accuracy["sigmoid_0.tmp_0"]["max_abs"] <= 5e-3  # the default fp16 budget
    assert report.budget["spec"] == "max-abs<=0.005" and report.budget["met"] and report.budget["default"]
    assert report.fp16["bias_corrected"] > 30  # rounding error folded into the float32 biases
    # fitted on eval + calibration feeds (D21): still within the size cap
    model = optimized(path)
    calib = [{"x": rng.standard_normal((1, 3, 64, 96)).astype(np.float32)} for _ in range(3)]
    report = quantize(model, "fp16", calib, QuantizeOptions(eval=feeds, **NO_TIMING))
    assert report.size_ratio <= 0.55 and report.budget["default"]
    assert report.accuracy["sigmoid_0.tmp_0"]["max_abs"] <= 1e-2


def test_ppocr_cls_int8_keeps_its_small_float_convs_in_float16(tmp_path):
    """PP-OCR's direction classifier (a real model: MobileNetV3 at scale 0.35) keeps many small convs float
    for speed.  Their weights under the weights-only floor are stored float16 (D174): its int8 file is under
    0.3x of the float one with the default settings, and its outputs stay where float's are."""
    from minirt.builder import build
    from tests.test_real_models import ppocr_input

    path = _rapidocr_model("ch_ppocr_mobile_v2.0_cls_infer.onnx")
    shapes = {"x": [6, 3, 48, 192]}
    calib = [{"x": ppocr_input((6, 3, 48, 192), seed)} for seed in range(4)]
    float_report = build(path, str(tmp_path / "f.mrt"), input_shapes=shapes)
    report = build(path, str(tmp_path / "q.mrt"), input_shapes=shapes, quantize="int8", calibration=calib)
    q = report.quantization
    half = [k for k in q["kept_float"] if k["reason"].endswith("weights stored float16")]
    assert len(half) >= 10 and q["fp16"]["initializers"] == len(half)
    # (against the model's own file: the float artifact is 0.88x of it here, 0.99x built for an x86-64 host
    # with its weights packed for the float kernels, which benchmarks/results_quant.md compares with)
    assert (tmp_path / "q.mrt").stat().st_size <= 0.3 * os.path.getsize(path)
    art = reader.load(str(tmp_path / "q.mrt"))
    assert sum(t.dtype == 10 for t in art.tensors) == len(half)  # (ONNX code 10: float16)
    x = {"x": ppocr_input((6, 3, 48, 192), 9)}
    want = minirt.Session(float_report.data).run(None, x)[0]
    got = minirt.Session(str(tmp_path / "q.mrt")).run(None, x)[0]
    assert (got.argmax(1) == want.argmax(1)).all() and np.abs(got - want).max() < 0.05


def test_weights_only_small_convs_and_min_elements(digits, calib):
    """Kept-float convs with few weights keep float32 weights (int8 would save almost nothing)."""
    report = quantize(digits, "int8", calib, QuantizeOptions(**NO_TIMING), target=_generic(int8_min_reduction=10_000))
    # every pointwise conv... the digits convs are 3x3, so nothing is kept float for speed
    assert not any("pointwise" in k["reason"] for k in report.kept_float)
    report = quantize(optimized(DIGITS), "int8", calib, QuantizeOptions(exclude=["QConv"], **NO_TIMING))
    assert report.weight_only == []


def test_fp16_default_budget_keeps_sensitive_weights_within_a_size_cap(digits, heldout):
    images, _ = heldout
    # an unreachable budget under a tight cap: nothing may go back beyond the cap
    report = quantize(digits, "fp16", None, QuantizeOptions(eval=[{"image": images[:32]}], fp16_budget="max-abs<=1e-9",
                                                          fp16_max_ratio=0.0, **NO_TIMING))
    assert report.budget["default"] and not report.budget["met"] and report.budget["capped"]
    assert not report.budget["reverted"] and any("not met" in w and "stay float16" in w for w in report.warnings)
    fresh = optimized(DIGITS)
    report = quantize(fresh, "fp16", None, QuantizeOptions(eval=[{"image": images[:32]}], fp16_budget="max-abs<=1e-9",
                                                         fp16_max_ratio=1.0, **NO_TIMING))
    assert report.budget["reverted"] and report.kept_float
    assert all("default fp16 budget max-abs<=1e-09" in k["reason"] for k in report.kept_float)


# --------------------------------------------------------------------------- onnxruntime-quantized models


@pytest.fixture(scope="module")
def ort_quantized(tmp_path_factory, heldout):
    pytest.importorskip("onnxruntime.quantization")
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

    images, _ = heldout
    out = tmp_path_factory.mktemp("ortq")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"image": images[i:i + 32]} for i in range(0, 128, 32)])

        def get_next(self):
            return next(self.it, None)

    paths = {}
    for fmt in (QuantFormat.QDQ, QuantFormat.QOperator):
        p = str(out / f"digits_{fmt.name}.onnx")
        quantize_static(DIGITS, p, Reader(), quant_format=fmt, per_channel=True, weight_type=QuantType.QInt8,
                        activation_type=QuantType.QUInt8)
        paths[fmt.name] = p
    p = str(out / "digits_dynamic.onnx")
    quantize_dynamic(DIGITS, p, weight_type=QuantType.QInt8)
    paths["dynamic"] = p
    return paths


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator", "dynamic"])
def test_onnxruntime_quantized_models_build_and_match(fmt, ort_quantized, heldout, tmp_path):
    from minirt.builder.build import build

    images, labels = heldout
    path = ort_quantized[fmt]
    out = tmp_path / "q.mrt"
    report = build(path, str(out))
    if fmt != "QDQ":
        # QDQ weights are int8 + DequantizeLinear: the optimizer's constant folding currently folds them
        # back to float32 (reported to the optimizer's owner), so only the other formats stay small.
        assert report.artifact_bytes <= 0.5 * os.path.getsize(DIGITS)
    y = minirt.Session(str(out)).run(None, {"image": images})[0]
    # Exact int8 sums in the reference (conftest.ORT_EXACT_INT8): onnxruntime's default u8 x s8 kernels saturate
    # at int16 on x86-64 without VNNI, which put these outputs up to 4.13 apart on an AVX2 machine.
    ref = ort_reference_session(path).run(None, {"image": images})[0]
    diff = np.abs(y - ref)
    if fmt == "QDQ":
        # The optimizer rewrites QDQ graphs in float (folded weights, fused BN) while onnxruntime fuses them
        # into integer kernels: a few outputs land one quantization step (the final DequantizeLinear's scale)
        # apart.
        assert diff.max() <= 0.2 and diff.mean() < 0.01
        assert (y.argmax(1) == ref.argmax(1)).mean() >= 0.99
    else:
        assert diff.max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))
        assert (y.argmax(1) == labels).mean() == (ref.argmax(1) == labels).mean()


@pytest.mark.parametrize("op", ["MatMulInteger", "QLinearMatMul"])
def test_onnxruntime_reference_session_is_exact_for_int8(op):
    """The smallest graph of the digits failure: u8 activations at 255 times constant s8 weights at 127 / -128,
    every adjacent pair of products past int16 (onnxruntime's default kernel gave 32767 for 255*127*2 on AVX2).
    ort_reference_session, minirt and the onnx reference evaluator give the exact sums."""
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from minirt.builder import build_bytes

    k = 8
    a = np.full((3, k), 255, np.uint8)
    a[1, ::3] = 0
    b = np.stack([np.full(k, 127), np.full(k, -128), np.where(np.arange(k) % 2, 127, -128), np.ones(k)], 1)
    b = b.astype(np.int8)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    assert np.abs(exact).max() > 2**15
    inits = [numpy_helper.from_array(b, "b")]
    if op == "MatMulInteger":
        inputs, out_type = ["a", "b"], TensorProto.INT32
        want = exact
    else:
        # y = rint(exact * 0.5 * 0.0009 / 1.0) + 128: |exact| <= 8*255*128 = 261120 stays inside uint8
        # (-117.5 .. 117.5 around 128), where the int16-saturated sums would land about half as far out.
        inputs, out_type = ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], TensorProto.UINT8
        scales = dict(sa=0.5, sb=0.0009, sy=1.0)
        inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in scales.items()]
        zero_points = dict(za=np.uint8(0), zb=np.int8(0), zy=np.uint8(128))
        inits += [numpy_helper.from_array(np.array(v), n) for n, v in zero_points.items()]
        want = (np.rint(exact * 0.5 * 0.0009) + 128).astype(np.uint8)
        assert want.min() > 0 and want.max() < 255
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, a.shape)],
                              [helper.make_tensor_value_info("y", out_type, exact.shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    assert len(np.unique(want)) > 3  # the saturated sums would differ in most entries
    got = {
        "onnxruntime": ort_reference_session(model.SerializeToString()).run(None, {"a": a})[0],
        "onnx-reference": ReferenceEvaluator(model).run(None, {"a": a})[0],
        "minirt": minirt.Session(build_bytes(model)).run(None, {"a": a})[0],
    }
    for engine, y in got.items():
        np.testing.assert_array_equal(y, want, err_msg=engine)
