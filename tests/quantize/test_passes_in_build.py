"""The quantizer's rewrites are passes: listed in the build report (text, JSON, the artifact's
metadata), switched off by name with --disable-pass, and the old QuantizeOptions booleans alias them."""
import pytest

import minirt
from minirt.builder.build import build
from minirt.builder.errors import BuildError
from minirt.builder.quantize import QuantizeOptions, _run, quantize
from minirt.builder.quantize.passes import pass_names, pipeline
from tests.quantize.conftest import DIGITS, optimized

CALIBRATION = DIGITS.replace("digits_cnn.onnx", "calibration.npz")


def _rows(passes: dict) -> dict:
    return {row["name"]: row for row in passes["passes"]}


def test_int8_build_reports_its_passes():
    report = build(DIGITS, None, quantize="int8", calibration=CALIBRATION)
    passes = report.quantization["passes"]
    assert passes["pipeline"] == [p.name for p in pipeline("int8")] and passes["stage"] == "quantizer (int8)"
    rows = _rows(passes)
    assert rows["quant_layers"]["changed_runs"] == 1
    assert rows["quant_fuse_max_pool"]["nodes_removed"] == 1 and rows["quant_fuse_flatten"]["nodes_removed"] == 1
    assert "quantizer (int8) passes" in str(report) and "quant_fuse_max_pool" in str(report)
    stored = minirt.Session(report.data).metadata["build.quantization"]["passes"]
    # as the optimizer's: only the rows that changed the graph or refused a match are kept
    assert {row["name"] for row in stored["passes"]} == {n for n, r in rows.items() if r["changed_runs"] or r["refused"]}


def test_disable_a_quantizer_pass_by_name():
    report = build(DIGITS, None, quantize="int8", calibration=CALIBRATION, disabled_passes=["quant_fuse_max_pool"])
    assert report.op_histogram.get("MaxPool") == 1
    assert report.quantization["passes"]["disabled"] == ["quant_fuse_max_pool"]
    assert "quant_fuse_max_pool" not in report.quantization["passes"]["pipeline"]
    # (nothing left to quantize: without the fallback that is an error, tests/test_builder_errors.py)
    report = build(DIGITS, None, quantize="int8-dynamic", disabled_passes=["quant_layers"], allow_float_fallback=True)
    assert "QConv" not in report.op_histogram and report.quantization["quantized"] == []
    assert all("quant_layers is disabled" in k["reason"] for k in report.quantization["kept_float"][-4:])
    report = build(DIGITS, None, quantize="fp16", disabled_passes=["fp16_weights"], allow_float_fallback=True)
    assert "DequantizeWeights" not in report.op_histogram


def test_unknown_pass_names_list_both_pipelines():
    with pytest.raises(BuildError) as err:
        build(DIGITS, None, quantize="int8-dynamic", disabled_passes=["quant_nothing"])
    assert "quant_nothing" in str(err.value) and "quant_chain_int8" in str(err.value) and "fuse_pad" in str(err.value)
    with pytest.raises(BuildError, match="known quantizer passes"):
        quantize(optimized(DIGITS), "int8-dynamic", None, QuantizeOptions(disabled_passes=["fuse_pad"]))


def test_option_aliases_disable_the_passes(calib):
    model = optimized(DIGITS)
    report = quantize(model, "int8", calib, QuantizeOptions(fuse_pool_flatten=False, measure_latency=False))
    assert report.passes["disabled"] == ["quant_fuse_max_pool", "quant_fuse_flatten"]
    assert {n.op_type for n in model.graph} >= {"MaxPool", "Flatten"}
    assert set(pass_names()) >= {"quant_layers", "quant_fold_affine", "quant_chain_int8", "fp16_weights"}
    y = _run.session(model).run(None, calib[0])[0]
    assert y.shape[0] == calib[0]["image"].shape[0]
