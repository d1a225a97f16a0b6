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
    feeds = [{"image": np.zeros((128, 1, 8, 8), np.float32)}]
    with pytest.raises(BuildError, match=r"calibration feed 0: input 'image' has shape \[128, 1, 8, 8\].*\[1, 1, 8, 8\]"):
        build(DIGITS, str(tmp_path / "d.mrt"), input_shapes={"image": [1, 1, 8, 8]}, quantize="int8",
              calibration=feeds)


def test_eval_rank_mismatch(tmp_path):
    calib = [{"image": np.zeros((1, 1, 8, 8), np.float32)}]
    with pytest.raises(BuildError, match=r"--eval feed 0: input 'image' has shape \[1, 8, 8\]"):
        build(DIGITS, str(tmp_path / "d.mrt"), quantize="int8", calibration=calib,
              eval_data=[{"image": np.zeros((1, 8, 8), np.float32)}])
