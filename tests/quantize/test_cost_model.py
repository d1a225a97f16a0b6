"""The int8 cost model of the target profile (builder/quantize/cost.py, docs/decisions.md D87): its
arithmetic against a hand count, what ``--quantize auto`` and a target without ``--quantize`` decide
from it, and that the build machine's timing no longer decides the "not faster" warning."""
from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import minirt
from minirt.builder.build import build
from minirt.builder.quantize import QuantizeOptions, _run, estimate_mode, quantize
from minirt.targets.profiles import get_target
from tests.quantize.conftest import optimized

RNG = np.random.default_rng(5)


def _conv_model(c_in: int, c_out: int, k: int, size: int, extra_adds: int = 0, batch: int | str = 1,
                head: bool = False) -> bytes:
    """x (batch, c_in, size, size) -> Conv k x k (same padding) -> Relu -> ``extra_adds`` x Add(y, y)
    [-> ``head``: a 1 x 1 conv to 4 channels, the final layer, which stays float by default]."""
    w = numpy_helper.from_array((RNG.standard_normal((c_out, c_in, k, k)) * 0.1).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(c_out, np.float32), "b")
    wh = numpy_helper.from_array((RNG.standard_normal((4, c_out, 1, 1)) * 0.1).astype(np.float32), "wh")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[k // 2] * 4),
             helper.make_node("Relu", ["c"], ["y0"], name="relu")]
    for i in range(extra_adds):
        nodes.append(helper.make_node("Add", [f"y{i}", f"y{i}"], [f"y{i + 1}"], name=f"add{i}"))
    out, channels = f"y{extra_adds}", c_out
    if head:
        nodes.append(helper.make_node("Conv", [out, "wh"], ["h"], name="head"))
        out, channels = "h", 4
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c_in, size, size])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [batch, channels, size, size])],
        [w, b] + ([wh] if head else []))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _optimized(data: bytes):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.onnx")
        with open(path, "wb") as f:
            f.write(data)
        return optimized(path)


@pytest.mark.parametrize("field", ["float_winograd_speedup", "int8_winograd_speedup"])
def test_a_winograd_conv_costs_its_multiply_adds_over_the_speedup(field):
    """A 3x3 conv 32 -> 64 over 16 x 16, which the float kernels run as Winograd F(2x2, 3x3) (the rule of
    mrt_conv2d_uses_winograd, D178) and the int8 ones too on AVX2 without VNNI (20 c + 8 m <= c m, D180),
    costs its multiply-adds over ``field``'s speedup in that model (float, or int8 on top of
    int8_macs_per_float_mac), the other model the same as without it; a conv neither rule takes (8 -> 16
    over 10 x 10: too few channels) is unchanged."""
    opts = QuantizeOptions(quantize_final=True)
    base = dataclasses.replace(get_target("generic"), int8_macs_per_float_mac=2.0, int8_convert_cost=5.0,
                               element_cost=3.0)
    fast = dataclasses.replace(base, **{field: 1.5})
    model = _optimized(_conv_model(32, 64, 3, 16, extra_adds=1))
    plain, wino = estimate_mode(model, "int8", base, opts), estimate_mode(model, "int8", fast, opts)
    macs = 64 * 256 * 32 * 9
    if field == "float_winograd_speedup":
        assert plain.float_cost - wino.float_cost == pytest.approx(macs - macs / 1.5)
        assert wino.quant_cost == pytest.approx(plain.quant_cost) and wino.ratio > plain.ratio
    else:
        assert plain.quant_cost - wino.quant_cost == pytest.approx(macs / 2.0 - macs / 3.0)
        assert wino.float_cost == pytest.approx(plain.float_cost) and wino.ratio < plain.ratio
    small = _optimized(_conv_model(8, 16, 3, 10, extra_adds=1))
    small_plain, small_fast = estimate_mode(small, "int8", base, opts), estimate_mode(small, "int8", fast, opts)
    assert (small_fast.float_cost, small_fast.quant_cost) == pytest.approx((small_plain.float_cost,
                                                                            small_plain.quant_cost))


def test_the_host_profile_has_the_winograd_speedup_where_its_float_kernels_take_it():
    from minirt import native
    from minirt.targets.profiles import WINOGRAD_FLOAT_SPEEDUP, host_profile

    want = WINOGRAD_FLOAT_SPEEDUP if native.available and native.packed_panel_width() == 16 else 1.0
    assert host_profile().float_winograd_speedup == want
    assert get_target("rpi5").float_winograd_speedup == get_target("generic").float_winograd_speedup == 1.0


def test_the_int8_winograd_speedup_is_in_the_profiles_of_avx2_without_vnni():
    from minirt import native
    from minirt.targets.profiles import INT8_WINOGRAD_SPEEDUP, host_profile

    want = INT8_WINOGRAD_SPEEDUP if native.available and native.qgemm_isa == "avx2" else 1.0
    assert host_profile().int8_winograd_speedup == want
    assert get_target("x86-64-v3").int8_winograd_speedup == INT8_WINOGRAD_SPEEDUP
    assert get_target("x86-64-v4").int8_winograd_speedup == get_target("rpi5").int8_winograd_speedup == 1.0


def test_estimate_is_the_hand_count():
    """One conv 8 -> 16, 3 x 3 over 10 x 10 (Relu fused), then 2 Adds of (16, 10, 10): with
    speedup s, convert cost c and element cost e the int8 model costs macs / s + c * inputs +
    e * outputs + the Adds, the float one macs + e * outputs + the Adds."""
    model = _optimized(_conv_model(8, 16, 3, 10, extra_adds=2))
    profile = dataclasses.replace(get_target("generic"), int8_macs_per_float_mac=2.0, int8_convert_cost=5.0,
                                  element_cost=3.0)
    opts = QuantizeOptions(quantize_final=True)  # (the conv feeds the output through the Adds)
    est = estimate_mode(model, "int8", profile, opts)
    macs, inputs, outputs = 16 * 100 * 8 * 9, 8 * 100, 16 * 100
    adds = 2 * 3.0 * outputs  # one FLOP per element each, at the element cost
    assert est.float_cost == pytest.approx(macs + 3.0 * outputs + adds)
    assert est.quant_cost == pytest.approx(macs / 2.0 + 5.0 * inputs + 3.0 * outputs + adds)
    assert est.int8_layers == 1
    dynamic = estimate_mode(model, "int8-dynamic", profile, opts)  # the input's range scanned too
    assert dynamic.quant_cost == pytest.approx(est.quant_cost + 5.0 * inputs)
    # the final layer kept float (quantize_final=False): nothing in int8, no estimate
    assert estimate_mode(model, "int8", profile, QuantizeOptions(quantize_final=False)) is None


def test_a_symbolic_batch_counts_as_one_other_unknown_sizes_give_no_estimate():
    opts = QuantizeOptions(quantize_final=True)
    fixed = estimate_mode(_optimized(_conv_model(8, 16, 3, 10, batch=1)), "int8", "rpi5", opts)
    symbolic = estimate_mode(_optimized(_conv_model(8, 16, 3, 10, batch="N")), "int8", "rpi5", opts)
    assert symbolic is not None and symbolic.ratio == pytest.approx(fixed.ratio)
    assert symbolic.float_cost == pytest.approx(fixed.float_cost)
    model = _optimized(_conv_model(8, 16, 3, 10))
    model.graph.inputs[0].shape = ir.Shape([1, 8, ir.SymbolicDim("H"), 10])  # (a dynamic height)
    for node in model.graph:
        for v in node.outputs:
            v.shape = ir.Shape([1, 16, ir.SymbolicDim("H"), 10])
    assert estimate_mode(model, "int8", "rpi5", opts) is None


def test_auto_follows_the_estimate():
    """rpi5 (int8 with a dot product): a big 3 x 3 conv is worth int8; a small pointwise conv drowned
    in elementwise work is not, and the build says why and stays float32."""
    big = _conv_model(64, 64, 3, 28, head=True)
    small = _conv_model(16, 16, 1, 8, extra_adds=12, head=True)
    for data, want in ((big, "int8-dynamic"), (small, None)):
        said = []
        report = build(data, None, target="rpi5", quantize="auto", progress=said.append)
        assert minirt.Session(report.data).metadata["build.options"]["quantize"] == want, said
        assert any("estimated at" in m and "rpi5" in m for m in said), said
        if want is None:
            assert any("float32" in m and "at most 0.9x pays" in m for m in said), said


def test_a_target_without_quantize_chooses_and_none_keeps_float():
    data = _conv_model(64, 64, 3, 28, head=True)
    said = []
    report = build(data, None, target="rpi4", progress=said.append)
    assert any("no --quantize: target rpi4 chooses" in m for m in said), said
    assert minirt.Session(report.data).metadata["build.options"]["quantize"] == "int8-dynamic"
    report = build(data, None, target="rpi4", quantize="none")
    assert minirt.Session(report.data).metadata["build.options"]["quantize"] is None
    report = build(data, None)  # the generic target never quantizes unasked
    assert minirt.Session(report.data).metadata["build.options"]["quantize"] is None


def test_the_warning_comes_from_the_target_not_the_build_machine(monkeypatch):
    """The build machine's timing is reported, never warned on: here it says int8 is 10x slower
    while the target's estimate says faster (no warning); a target whose estimate says slower
    warns, naming the target and the cost model."""
    model = _optimized(_conv_model(64, 64, 3, 28))
    monkeypatch.setattr(_run, "median_latency", lambda sessions, feed, runs: {"float": 0.001, "quant": 0.010})
    report = quantize(model.clone(), "int8-dynamic", None, QuantizeOptions(quantize_final=True), target="rpi5")
    assert report.latency["ratio"] == pytest.approx(10.0)
    assert report.estimate["ratio"] < 0.6
    assert not [w for w in report.warnings if "faster" in w or "slower" in w], report.warnings
    assert "estimated on rpi5" in str(report) and "on the build machine" in str(report)
    slow = dataclasses.replace(get_target("rpi5"), int8_macs_per_float_mac=0.5)
    report = quantize(model.clone(), "int8-dynamic", None, QuantizeOptions(quantize_final=True), target=slow)
    assert report.estimate["ratio"] > 1.05
    assert any("estimated slower than the float one on rpi5" in w and "cost model" in w for w in report.warnings)
