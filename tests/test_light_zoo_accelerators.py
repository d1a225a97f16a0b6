"""onnx's light model zoo (real architectures whose weights are ConstantOfShape fills; also run on the CPU
by tests/test_real_models.py) on the accelerators (issue 27, D169): ShuffleNet v1 (3x3 / 2 average pools
with padding TFLite's SAME does not say) and GoogLeNet (LRN, fill weights) build with every node in one
partition on Core ML and NNAPI, and `minirt verify` checks the programs off the device against
onnxruntime's golden outputs.  GoogLeNet's fp16 Core ML program overflows on those weights (activations
grow ~10x a layer): verify reports it with the remedy, and ``coreml_precision="fp32"``
(``--coreml-precision fp32``) builds one that verifies."""
from __future__ import annotations

import os

import onnx
import pytest

from minirt.builder import build
from minirt.tools.verify import format_verify, verify

# (the overflowing fp16 program's evaluation warns about its infinities on the way)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
CASES = [("shufflenet", "gpu_0/data_0", "android-api34", None, "ok"),
         ("shufflenet", "gpu_0/data_0", "macos", None, "ok"),
         ("inception_v1", "data_0", "android-api34", None, "ok"),
         ("inception_v1", "data_0", "macos", None, "MISMATCH"),  # fp16, the target's default: overflows
         ("inception_v1", "data_0", "macos", "fp32", "ok")]


@pytest.mark.parametrize("name, data, target, precision, status", CASES,
                         ids=[f"{c[0]}-{c[2]}-{c[3] or 'default'}" for c in CASES])
def test_light_model_all_on_the_accelerator(tmp_path, name, data, target, precision, status):
    pytest.importorskip("coremltools" if target == "macos" else "ai_edge_litert")
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"onnx's light_{name}.onnx is not installed")
    out = tmp_path / "m.mrt"
    report = build(path, str(out), target=target, input_shapes={data: [1, 3, 224, 224]}, coreml_precision=precision)
    parts = report.partitions
    assert parts["accelerated_nodes"] == parts["nodes"] and len(parts["partitions"]) == 1, parts["cpu_nodes"]
    checked = verify(str(out))
    results = [r for row in checked["partitions"] for r in row["results"] if "max_abs" in r]
    assert [r["status"] for r in results] == [status], results
    if status == "MISMATCH":  # the output says what happened and what to do
        assert results[0]["non_finite"] > 0
        assert "build with --coreml-precision fp32" in format_verify(checked)
