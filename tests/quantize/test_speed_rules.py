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
from minirt.targets.profiles import AVX2_INT8_RULES, get_target
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
    rules = [f for f in AVX2_INT8_RULES if f != "int8_macs_per_float_mac"]
    assert {f: getattr(host, f) for f in rules} == {f: getattr(generic, f) for f in rules}
    # the cost model's int8 rate: the dot-product one with VNNI, AVX2's without, below float without
    # native kernels (int8 layers then dequantize and multiply in float)
    assert host.int8_macs_per_float_mac == profiles.DOT_PRODUCT_INT8_MACS > generic.int8_macs_per_float_mac
    assert AVX2_INT8_RULES["int8_macs_per_float_mac"] < generic.int8_macs_per_float_mac
    monkeypatch.setattr(native, "available", False)
    assert profiles.host_profile().int8_macs_per_float_mac == profiles.NO_NATIVE_INT8_MACS < 1.0
