"""MelWeightMatrix against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_elementwise import check


@pytest.mark.parametrize("args", [(8, 16, 8192, 0.0, 4096.0), (10, 64, 16000, 20.0, 8000.0),
                                  (40, 512, 22050, 0.0, 11025.0), (5, 20, 1000, 100.0, 400.0),
                                  (64, 1024, 48000, 30.0, 20000.0)])
@pytest.mark.parametrize("output_datatype", [1, 11])
def test_mel_weight_matrix(args, output_datatype):
    n, dft, sr, lo, hi = args
    inputs = [np.array(n, np.int32), np.array(dft, np.int32), np.array(sr, np.int32), np.array(lo, np.float32),
              np.array(hi, np.float32)]
    check("MelWeightMatrix", inputs, {"output_datatype": output_datatype}, opset=17)
