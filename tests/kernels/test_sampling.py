"""GridSample / AffineGrid kernels compared against onnxruntime (onnx reference evaluator where noted)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_elementwise import check, rand

RNG = np.random.default_rng(7)


def _grid(shape, spread=1.3):
    # beyond [-1, 1] on purpose, so every padding mode is exercised
    return RNG.uniform(-spread, spread, size=shape).astype(np.float32)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_2d(mode, padding_mode, align_corners):
    x = rand((2, 3, 5, 6))
    grid = _grid((2, 4, 7, 2))
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    check("GridSample", [x, grid], attrs, opset=20, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_16(mode, padding_mode):
    x = rand((1, 2, 4, 3))
    grid = _grid((1, 5, 2, 2))
    check("GridSample", [x, grid], {"mode": mode, "padding_mode": padding_mode}, opset=16, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_3d(mode, padding_mode, align_corners):
    x = rand((1, 2, 3, 4, 5))
    grid = _grid((1, 2, 3, 4, 3))
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    check("GridSample", [x, grid], attrs, opset=20, rtol=1e-4, atol=1e-5)


def test_grid_sample_1d_against_reference():
    x = rand((2, 3, 6))
    grid = _grid((2, 5, 1))
    check("GridSample", [x, grid], {"mode": "linear"}, opset=20, engine="onnx-reference", rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 3, 1, 4), (1, 2, 3, 4, 5)])
def test_affine_grid(align_corners, size):
    if align_corners and 1 in size[2:]:
        pytest.skip("a length-1 axis with align_corners=1 is degenerate: see test_affine_grid_length_one")
    r = len(size) - 2
    theta = RNG.uniform(-1, 1, size=(size[0], r, r + 1)).astype(np.float32)
    check("AffineGrid", [theta, np.array(size, np.int64)], {"align_corners": align_corners}, opset=20,
          constant_inputs=(1,), rtol=1e-5, atol=1e-6)


def test_affine_grid_length_one_axis_is_centred():
    # With align_corners=1 a single position cannot sit on both corner centres;
    # onnxruntime (1.0) and the onnx reference (-1.0) disagree, minirt uses the
    # centre 0 as torch.nn.functional.affine_grid does.
    from tests.kernels.test_elementwise import run_kernel

    theta = np.array([[[1, 0, 0], [0, 1, 0]]], np.float32)
    (grid,) = run_kernel("AffineGrid", [theta, np.array([1, 1, 1, 2], np.int64)], {"align_corners": 1}, opset=20)
    np.testing.assert_array_equal(grid.reshape(-1, 2), [[-1.0, 0.0], [1.0, 0.0]])
