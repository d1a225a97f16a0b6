"""What the builder records in an artifact's metadata about its optimizer run."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minirt
from minirt.builder.build import build

DIGITS = Path(__file__).resolve().parent.parent / "examples" / "digits" / "digits_cnn.onnx"


def test_optimizer_metadata_keeps_only_the_passes_that_did_something():
    report = build(str(DIGITS), None)
    kept = minirt.Session(report.data).metadata["build.optimizer"]
    full = report.optimizer
    assert kept["pipeline"] == full["pipeline"] and kept["nodes_before"] == full["nodes_before"]
    assert kept["nodes_after"] == full["nodes_after"]
    effective = [row["name"] for row in full["passes"] if row["changed_runs"] or row["refused"]]
    assert [row["name"] for row in kept["passes"]] == effective
    assert {"fuse_batchnorm", "fuse_activation"} <= set(effective) and len(effective) < len(full["pipeline"])


# Keys of what a build measures about itself (timings, latency on the build machine): in the BuildResult,
# never in the artifact (D174).
MEASURED = {"seconds", "timings", "latency", "time_utc"}


def _keys(value) -> set:
    """Every dict key inside ``value`` (nested dicts and lists)."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_an_artifact_records_no_time_or_timing_of_its_build():
    with np.load(DIGITS.parent / "calibration.npz") as f:
        calib = [{"image": f["image"][i:i + 8]} for i in range(0, 32, 8)]
    report = build(str(DIGITS), None, quantize="int8", calibration=calib, input_shapes={"image": [8, 1, 8, 8]})
    meta = minirt.Session(report.data).metadata
    assert "build.time_utc" not in meta
    stored = {k: v for k, v in meta.items() if k.startswith("build.")}
    assert "build.quantization" in stored and "build.optimizer" in stored
    for key, value in stored.items():
        assert not {k.split(".")[-1] for k in _keys(value)} & MEASURED, (key, _keys(value) & MEASURED)
    # ... the build's report still has them
    assert report.timings["quantize"] > 0 and report.quantization["timings"]["total"] > 0
    assert report.quantization["latency"]["float_ms"] > 0
    assert all(row["seconds"] >= 0 for row in report.optimizer["passes"])


BUILD_ALL_MODES = r"""
import sys
import numpy as np
from minirt.builder.build import build
from tests.test_real_models import PPOCR_CLS, ppocr_input

out = sys.argv[1]
calib = [{"x": ppocr_input((2, 3, 48, 192), seed)} for seed in range(3)]
for mode in (None, "int8", "int8-dynamic", "fp16"):
    build(PPOCR_CLS, f"{out}/{mode}.mrt", input_shapes={"x": [2, 3, 48, 192]}, quantize=mode,
          calibration=calib if mode == "int8" else None, eval_data=calib if mode == "fp16" else None)
for target in ("macos", "android-api30"):  # (a Core ML and an NNAPI partition: their provider blobs)
    build(PPOCR_CLS, f"{out}/{target}.mrt", input_shapes={"x": [2, 3, 48, 192]}, target=target)
"""


def test_one_model_and_options_build_to_the_same_bytes(tmp_path):
    """Two builds of a real model in processes of different hash seeds (set and dict orders of strings
    differ) give identical files in every mode and with accelerator partitions: nothing in an artifact
    depends on when, where or in which process it was built (D174; an int8 build's new biases followed a
    set's order before, and a Core ML blob its protobuf maps' order)."""
    from tests.test_real_models import PPOCR_CLS

    if not PPOCR_CLS or not os.path.exists(PPOCR_CLS):
        pytest.skip("rapidocr's PP-OCR models are not installed")
    root = Path(__file__).resolve().parent.parent
    for seed in ("1", "2"):
        (tmp_path / seed).mkdir()
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
        done = subprocess.run([sys.executable, "-c", BUILD_ALL_MODES, str(tmp_path / seed)], env=env, cwd=root,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    for name in ("None", "int8", "int8-dynamic", "fp16", "macos", "android-api30"):
        a, b = ((tmp_path / seed / f"{name}.mrt").read_bytes() for seed in ("1", "2"))
        assert a == b, f"{name}: two builds differ ({len(a)} and {len(b)} bytes)"
