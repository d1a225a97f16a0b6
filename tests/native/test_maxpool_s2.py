"""The stride-2 MaxPool path of the native pool (FN(maxpool_s2_task): vertical maxima into a line with
-inf margins, then the kw neighbours of each output) against the numpy kernel.  Outputs of 2,048 pixels
or more are split between threads by bands of rows (MRT_POOL_BAND_PIXELS), smaller ones by planes: the
`threads` fixture (1, 2, 3) runs both, and band edges on odd row counts.  AVX-512 takes 16 outputs (16
vertical maxima) at a time where a row has that many, the others 8."""
from __future__ import annotations

import numpy as np
import pytest

from minirt.kernels import nn
from tests.native.conftest import numpy_path

CASES = [  # (shape, kernel, pads, ceil_mode, vertical stride)
    ((1, 64, 111, 111), (3, 3), (0, 0, 0, 0), 1, 2),    # SqueezeNet's pools (ceil_mode)
    ((1, 3, 112, 112), (3, 3), (1, 1, 1, 1), 0, 2),     # ResNet's stem pool
    ((2, 5, 27, 28), (3, 3), (0, 0, 0, 0), 1, 2),       # odd / even widths, batch
    ((1, 4, 13, 13), (3, 3), (1, 2, 2, 1), 1, 2),       # asymmetric pads
    ((1, 2, 9, 17), (5, 5), (2, 2, 2, 2), 0, 2),        # 5x5
    ((1, 2, 8, 10), (2, 3), (0, 1, 0, 1), 0, 1),        # vertical stride 1, rectangular kernel
    ((1, 1, 3, 3), (3, 3), (1, 1, 1, 1), 1, 2),         # tiny plane, windows mostly padding
    ((1, 1, 5, 4200), (3, 3), (0, 0, 0, 0), 0, 2),      # rows wider than the line: the general loop
    ((1, 3, 67, 131), (5, 5), (2, 1, 2, 1), 0, 1),      # bands (67 x 65 outputs), vertical stride 1, 5x5
    ((2, 2, 181, 47), (3, 3), (1, 0, 0, 1), 1, 2),      # bands (91 x 24 outputs, ceil), batch
    ((1, 2, 33, 33), (3, 3), (0, 0, 0, 0), 0, 2),       # 16 outputs a row: one 16-lane group (AVX-512)
    ((1, 3, 35, 63), (3, 3), (0, 0, 0, 0), 0, 2),       # 31 a row: the last 16 overlap the first
    ((1, 2, 19, 36), (3, 3), (0, 1, 0, 1), 1, 2),       # 18 a row from 36 + pads, rows of 36 + 2 columns
]


@pytest.mark.parametrize("shape,k,pads,ceil,sh", CASES, ids=[str(c[0]) + str(c[1]) for c in CASES])
def test_maxpool_stride_2_matches_numpy(shape, k, pads, ceil, sh, every_isa, threads):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[rng.integers(0, x.size, size=3)] = np.nan
    attrs = dict(kernel_shape=k, strides=(sh, 2), pads=pads, ceil_mode=ceil)
    got = nn.max_pool_10(x, **attrs)
    with numpy_path():
        want = nn.max_pool_10(x, **attrs)
    np.testing.assert_array_equal(got, want)
