"""Calibration data that does not fit the model's fixed input shape is a clear build error."""
from __future__ import annotations

import os

import numpy as np
import pytest

from minirt.builder.build import build
from minirt.builder.errors import BuildError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS = os.path.join(ROOT, "examples", "digits", "digits_cnn.onnx")


def test_calibration_batch_against_fixed_input_shape(tmp_path):
    # samples stacked on the batch axis split into feeds of the declared batch (128 feeds of 1) ...
    feeds = [{"image": np.zeros((128, 1, 8, 8), np.float32)}]
    report = build(DIGITS, str(tmp_path / "d.mrt"), input_shapes={"image": [1, 1, 8, 8]}, quantize="int8",
                   calibration=feeds)
    assert report.as_dict()["quantization"]["calibration_feeds"] == 128
    # ... but a stack that is not a whole number of declared batches is refused, naming both shapes
    feeds = [{"image": np.zeros((3, 1, 8, 8), np.float32)}]
    with pytest.raises(BuildError, match=r"calibration feed 0: input 'image' has shape \[3, 1, 8, 8\].*\[2, 1, 8, 8\]"):
        build(DIGITS, str(tmp_path / "d.mrt"), input_shapes={"image": [2, 1, 8, 8]}, quantize="int8",
              calibration=feeds)


def test_eval_rank_mismatch(tmp_path):
    calib = [{"image": np.zeros((1, 1, 8, 8), np.float32)}]
    with pytest.raises(BuildError, match=r"--eval feed 0: input 'image' has shape \[1, 8, 8\]"):
        build(DIGITS, str(tmp_path / "d.mrt"), quantize="int8", calibration=calib,
              eval_data=[{"image": np.zeros((1, 8, 8), np.float32)}])
