"""The target profile's int8 speed rules (targets/profiles.py): which convs the quantizer keeps float
because float is faster on that CPU, and the rules an AVX2-only host gets (docs/decisions.md, D80)."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from minirt import native
from minirt.builder.quantize import QuantizeOptions, quantize
from minirt.targets import profiles
from minirt.targets.profiles import AVX2_INT8_RULES, VNNI_INT8_RULES, get_target
from tests.quantize.conftest import optimized

NO_TIMING = dict(measure_latency=False)


def _generic(**rules):
    return dataclasses.replace(get_target("generic"), **rules)


def _kept(report, rule: str) -> set:
    return {k["node"] for k in report.kept_float if rule in k["reason"]}


def test_window_reduction_rule_keeps_the_stem_float(digits, calib):
    """digits: /0/Conv sums 1 x 3 x 3 = 9 products per output, /3/Conv 16 x 9 = 144: a threshold
    between them keeps only the first float, and says which rule did."""
    report = quantize(digits, "int8", calib, QuantizeOptions(**NO_TIMING),
                      target=_generic(int8_min_window_reduction=32))
    assert _kept(report, "int8_min_window_reduction") == {"/0/Conv"}
    assert "/3/Conv" in report.quantized and "/0/Conv" not in report.quantized
    assert any("summing 9 products" in k["reason"] for k in report.kept_float)


def test_window_reduction_rule_off_by_default(digits, calib):
    report = quantize(digits, "int8", calib, QuantizeOptions(**NO_TIMING), target=_generic())
    assert not _kept(report, "int8_min_window_reduction")
    assert "/0/Conv" in report.quantized


@pytest.mark.parametrize("groups", [16, 4])
def test_window_reduction_rule_leaves_depthwise_and_grouped_convs(tmp_path, groups):
    """A depthwise conv quantized for its large plane (int8_depthwise_min_plane) and a grouped conv sum
    9 and 36 products per output, under the threshold: their own rules decide, not the window rule (it
    would undo the large-plane exception and the u8 chains around it: PP-OCR det, D144)."""
    model = _grouped_model(tmp_path / "g.onnx", groups=groups)
    rng = np.random.default_rng(4)
    calib = [{"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)} for _ in range(3)]
    report = quantize(model, "int8", calib, QuantizeOptions(quantize_final=True, **NO_TIMING),
                      target=_generic(int8_min_window_reduction=64, int8_depthwise_min_plane=100))
    assert not _kept(report, "int8_min_window_reduction")
    assert "grouped" in report.quantized


@pytest.mark.parametrize("min_plane,pointwise_int8", [(100, True), (1000, False)])
def test_speed_rules_keep_the_large_plane_chain_int8(tmp_path, min_plane, pointwise_int8):
    """A depthwise conv on a plane of int8_depthwise_min_plane pixels or more computes in int8, chained in
    uint8 with its neighbours: the pointwise rule then leaves the 1x1 conv on that plane int8 (12 x 12 =
    144 pixels >= 100); on a smaller plane the depthwise conv stays float and the rule applies."""
    model = _grouped_model(tmp_path / "dw.onnx", groups=16)  # depthwise 3x3 -> Relu -> 1x1 16 -> 32
    rng = np.random.default_rng(5)
    calib = [{"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)} for _ in range(3)]
    report = quantize(model, "int8", calib, QuantizeOptions(quantize_final=True, **NO_TIMING),
                      target=_generic(int8_min_pointwise_outputs=64, int8_depthwise_min_plane=min_plane))
    assert ("grouped" in report.quantized) is pointwise_int8
    assert ("pointwise" in report.quantized) is pointwise_int8
    assert (_kept(report, "int8_min_pointwise_outputs") == {"pointwise"}) is not pointwise_int8


def _depthwise_block(path, epilogue: str = "Relu", stride: int = 1):
    """x (1, 16, 12, 12) -> "before" 1x1 16 -> 16, Relu -> "dw" 3x3 depthwise of ``stride`` -> ``epilogue``
    ("Relu", "SiLU": x * Sigmoid(x), "residual": + the dw's input, then Relu) -> "after" 1x1 16 -> 16, Relu ->
    "far" 1x1 16 -> 16."""
    rng = np.random.default_rng(7)
    w = {n: rng.standard_normal(shape).astype(np.float32) * 0.3
         for n, shape in (("wb", (16, 16, 1, 1)), ("wd", (16, 1, 3, 3)), ("wa", (16, 16, 1, 1)), ("wf", (16, 16, 1, 1)))}
    nodes = [helper.make_node("Conv", ["x", "wb"], ["b"], name="before", kernel_shape=[1, 1]),
             helper.make_node("Relu", ["b"], ["br"]),
             helper.make_node("Conv", ["br", "wd"], ["d"], name="dw", group=16, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[stride] * 2)]
    if epilogue == "SiLU":
        nodes += [helper.make_node("Sigmoid", ["d"], ["ds"]), helper.make_node("Mul", ["d", "ds"], ["dr"])]
    elif epilogue == "residual":
        nodes += [helper.make_node("Add", ["d", "br"], ["dz"]), helper.make_node("Relu", ["dz"], ["dr"])]
    else:
        nodes += [helper.make_node("Relu", ["d"], ["dr"])]
    nodes += [helper.make_node("Conv", ["dr", "wa"], ["a"], name="after", kernel_shape=[1, 1]),
              helper.make_node("Relu", ["a"], ["ar"]),
              helper.make_node("Conv", ["ar", "wf"], ["y"], name="far", kernel_shape=[1, 1])]
    side = 12 // stride
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, side, side])],
                              [numpy_helper.from_array(v, n) for n, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return optimized(str(path))


@pytest.mark.parametrize("epilogue,stride,strided_min,dw_int8", [
    ("Relu", 1, 0, True), ("SiLU", 1, 0, False), ("residual", 1, 0, False),
    ("Relu", 2, 0, True), ("Relu", 2, 100, True), ("Relu", 2, 200, False)])
def test_large_plane_depthwise_chains_only_its_neighbours(tmp_path, epilogue, stride, strided_min, dw_int8):
    """A depthwise conv on a plane of int8_depthwise_min_plane pixels (12 x 12 = 144 >= 100) computes in int8
    when its epilogue is one the int8 depthwise kernel applies (Relu; not SiLU, not a residual) and, strided,
    when the plane also reaches int8_depthwise_strided_min_plane; then the convs writing its input and reading
    its output stay int8 whatever the pointwise rule says (the uint8 chain), while a conv further on ("far")
    follows the rule (16 outputs < int8_min_pointwise_outputs 64)."""
    model = _depthwise_block(tmp_path / "b.onnx", epilogue, stride)
    rng = np.random.default_rng(8)
    calib = [{"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)} for _ in range(3)]
    report = quantize(model, "int8", calib, QuantizeOptions(quantize_final=True, **NO_TIMING),
                      target=_generic(int8_min_pointwise_outputs=64, int8_depthwise_min_plane=100,
                                      int8_depthwise_strided_min_plane=strided_min))
    assert ("dw" in report.quantized) is dw_int8
    neighbours = {"before", "after"}
    assert (neighbours <= set(report.quantized)) is dw_int8
    assert _kept(report, "int8_min_pointwise_outputs") == ({"far"} if dw_int8 else {"before", "after", "far"})
    if not dw_int8:
        assert _kept(report, "int8_depthwise") == {"dw"}


def test_speed_rules_apply_on_large_planes_without_a_depthwise_conv(tmp_path):
    """No depthwise conv, no chain to keep: the rules apply whatever the plane (SqueezeNet's stem)."""
    model = _pointwise_model(tmp_path / "p.onnx", hidden=16, out=64)
    rng = np.random.default_rng(6)
    calib = [{"x": rng.standard_normal((1, 32, 12, 12)).astype(np.float32)} for _ in range(3)]
    report = quantize(model, "int8", calib, QuantizeOptions(quantize_final=True, **NO_TIMING),
                      target=_generic(int8_min_pointwise_outputs=32, int8_depthwise_min_plane=100))
    assert _kept(report, "int8_min_pointwise_outputs") == {"narrow"}


def _pointwise_model(path, hidden: int, out: int, stride: int = 1):
    """x (1, 32, 12, 12) -> Conv 1x1 32 -> hidden ("narrow", of ``stride``) -> Relu -> Conv 1x1 hidden -> out
    ("wide")."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((hidden, 32, 1, 1)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((out, hidden, 1, 1)).astype(np.float32) * 0.2
    side = 12 // stride
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="narrow", kernel_shape=[1, 1], strides=[stride] * 2),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="wide", kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out, side, side])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return optimized(str(path))


@pytest.mark.parametrize("rule,kept", [(0, set()), (16, set()), (32, {"narrow"}), (100, {"narrow", "wide"})])
def test_pointwise_outputs_rule(tmp_path, rule, kept):
    """32 -> 16 -> 64 channels: a pointwise conv with fewer output channels than the threshold stays
    float (its weights stored int8 when big enough), the reason names the rule and the count."""
    model = _pointwise_model(tmp_path / "p.onnx", hidden=16, out=64)
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((1, 32, 12, 12)).astype(np.float32)} for _ in range(3)]
    report = quantize(model, "int8", calib, QuantizeOptions(quantize_final=True, **NO_TIMING),
                      target=_generic(int8_min_pointwise_outputs=rule))
    assert _kept(report, "int8_min_pointwise_outputs") == kept
    assert {"narrow", "wide"} - kept <= set(report.quantized)
    if "narrow" in kept:
        assert any("pointwise conv to 16 channels" in k["reason"] for k in report.kept_float)


def test_pointwise_outputs_rule_leaves_windowed_and_grouped_convs(tmp_path):
    """The rule is for 1x1 ungrouped convs: a 3x3 conv and a grouped conv of as few outputs are left
    to their own rules."""
    model = _grouped_model(tmp_path / "g.onnx", groups=4)  # 16 outputs, 3x3, grouped
    rng = np.random.default_rng(3)
    calib = [{"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)} for _ in range(3)]
    report = quantize(model, "int8", calib, QuantizeOptions(quantize_final=True, **NO_TIMING),
                      target=_generic(int8_min_pointwise_outputs=1000))
    assert _kept(report, "int8_min_pointwise_outputs") == {"pointwise"}  # (its 32 outputs < 1000)
    assert "grouped" in report.quantized


@pytest.mark.parametrize("plane,stride,kept", [(0, 1, set()), (100, 1, {"narrow"}), (200, 1, set()),
                                                (100, 2, set())])
def test_large_plane_reduction_rule(tmp_path, plane, stride, kept):
    """32 -> 48 -> 64 channels on 12 x 12 = 144-pixel planes: with int8_large_plane 100 and
    int8_min_large_plane_reduction 48, the conv over 32 channels stays float and the one over 48 does
    not; planes under int8_large_plane (200), the rule off (0), or a stride-2 conv whose output plane (36
    pixels) is under it leave both int8 (D171)."""
    model = _pointwise_model(tmp_path / "p.onnx", hidden=48, out=64, stride=stride)
    rng = np.random.default_rng(7)
    calib = [{"x": rng.standard_normal((1, 32, 12, 12)).astype(np.float32)} for _ in range(3)]
    report = quantize(model, "int8", calib, QuantizeOptions(quantize_final=True, **NO_TIMING),
                      target=_generic(int8_large_plane=plane, int8_min_large_plane_reduction=48))
    assert _kept(report, "int8_min_large_plane_reduction") == kept
    assert {"narrow", "wide"} - kept <= set(report.quantized)
    if kept:
        assert any("over 32 channels writing planes of 144 pixels" in k["reason"] for k in report.kept_float)


def test_vnni_rules_raise_the_pointwise_threshold_on_large_planes():
    """The VNNI host's rules carry the large-plane rule; the generic profile leaves it off."""
    assert VNNI_INT8_RULES["int8_large_plane"] == 112 * 112
    assert VNNI_INT8_RULES["int8_min_large_plane_reduction"] > VNNI_INT8_RULES["int8_min_reduction"]
    assert get_target("generic").int8_large_plane == 0
    assert "int8_min_large_plane_reduction" in get_target("generic").int8_speed_rules()


def _grouped_model(path, groups: int):
    """x (1, 16, 12, 12) -> Conv 3x3 16 -> 16 in `groups` groups -> Relu -> Conv 1x1 16 -> 32."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 16 // groups, 3, 3)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((32, 16, 1, 1)).astype(np.float32) * 0.2
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="grouped", group=groups, pads=[1, 1, 1, 1],
                              kernel_shape=[3, 3]),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="pointwise", kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 12, 12])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return optimized(str(path))


@pytest.mark.parametrize("rule,kept", [(0, False), (4, False), (8, True)])
def test_group_outputs_rule(tmp_path, rule, kept):
    """4 groups of 16 channels: 4 outputs per group, kept float from a threshold of 5 up."""
    model = _grouped_model(tmp_path / "g.onnx", groups=4)
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)} for _ in range(3)]
    report = quantize(model, "int8", calib, QuantizeOptions(quantize_final=True, **NO_TIMING),
                      target=_generic(int8_min_group_outputs=rule))
    assert (_kept(report, "int8_min_group_outputs") == {"grouped"}) is kept
    assert ("grouped" in report.quantized) is not kept
    assert "pointwise" in report.quantized  # not grouped: the rule never touches it
    if kept:
        assert any("4 output channels per group" in k["reason"] for k in report.kept_float)


def test_depthwise_is_not_a_grouped_conv_for_the_rule(tmp_path):
    """group == channels is the depthwise rule's business (int8_depthwise), not int8_min_group_outputs."""
    model = _grouped_model(tmp_path / "dw.onnx", groups=16)
    rng = np.random.default_rng(2)
    calib = [{"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)} for _ in range(3)]
    report = quantize(model, "int8", calib, QuantizeOptions(quantize_final=True, **NO_TIMING),
                      target=_generic(int8_min_group_outputs=1000))
    assert not _kept(report, "int8_min_group_outputs")
    assert _kept(report, "int8_depthwise") == {"grouped"}


def test_avx2_targets_take_the_avx2_rules(monkeypatch):
    v3 = get_target("x86-64-v3")
    for field, value in AVX2_INT8_RULES.items():
        assert getattr(v3, field) == value
    assert get_target("x86-64-v4").int8_min_group_outputs == 0  # (VNNI not implied: left at the defaults)
    # the host follows the int8 kernel it runs
    monkeypatch.setattr(native, "available", True)
    monkeypatch.setattr(native, "qgemm_isa", "avx2")
    host = profiles.host_profile()
    assert {f: getattr(host, f) for f in AVX2_INT8_RULES} == AVX2_INT8_RULES
    assert host.int8_speed_rules()["int8_min_group_outputs"] == AVX2_INT8_RULES["int8_min_group_outputs"]
    monkeypatch.setattr(native, "qgemm_isa", "vnni")
    host = profiles.host_profile()
    generic = get_target("generic")
    assert {f: getattr(host, f) for f in VNNI_INT8_RULES} == VNNI_INT8_RULES
    assert host.int8_min_group_outputs == generic.int8_min_group_outputs  # (VNNI's grouped convs pay)
    monkeypatch.setattr(native, "qgemm_isa", "amx")  # (VNNI runs what the AMX tiles do not take: its rules)
    assert {f: getattr(profiles.host_profile(), f) for f in VNNI_INT8_RULES} == VNNI_INT8_RULES
    monkeypatch.setattr(native, "qgemm_isa", "vnni")
    monkeypatch.setattr(native, "qgemm_isa", "dotprod")  # arm64's SDOT: not measured, the generic rules
    host = profiles.host_profile()
    rules = [f for f in AVX2_INT8_RULES if f != "int8_macs_per_float_mac"] + list(VNNI_INT8_RULES)
    assert {f: getattr(host, f) for f in rules} == {f: getattr(generic, f) for f in rules}
    monkeypatch.setattr(native, "qgemm_isa", "vnni")
    # the cost model's int8 rate: the dot-product one with VNNI, AVX2's without, below float without
    # native kernels (int8 layers then dequantize and multiply in float)
    assert host.int8_macs_per_float_mac == profiles.DOT_PRODUCT_INT8_MACS > generic.int8_macs_per_float_mac
    assert 1.0 < AVX2_INT8_RULES["int8_macs_per_float_mac"] < profiles.DOT_PRODUCT_INT8_MACS
    monkeypatch.setattr(native, "available", False)
    assert profiles.host_profile().int8_macs_per_float_mac == profiles.NO_NATIVE_INT8_MACS < 1.0


@pytest.mark.parametrize("everywhere", [True, False])
def test_chain_default_follows_the_target(digits, calib, everywhere):
    """QuantizeOptions.chain_int8 None (the default): the target's int8_chain_everywhere decides whether
    GEMM QConvs chain in uint8 too (AVX-512 VNNI hosts, D181): digits' /0/Conv feeds /3/Conv, two GEMM
    convs; with the rule off only depthwise convs chain, and digits has none."""
    m = digits.clone()
    quantize(m, "int8", calib, QuantizeOptions(**NO_TIMING), target=_generic(int8_chain_everywhere=everywhere))
    chained = {n.name for n in m.graph if n.op_type == "QConv" and "output_scale" in n.attributes}
    assert chained == ({"/0/Conv"} if everywhere else set())
    assert VNNI_INT8_RULES["int8_chain_everywhere"] and not AVX2_INT8_RULES.get("int8_chain_everywhere", False)
