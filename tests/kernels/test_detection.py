"""RoiAlign kernels compared against onnxruntime (NonMaxSuppression: test_nms.py)."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from tests.kernels.test_elementwise import check, rand, run_kernel

RNG = np.random.default_rng(11)


def _rois(k, h, w):
    x1 = RNG.uniform(-1, w - 1, k)
    y1 = RNG.uniform(-1, h - 1, k)
    x2 = x1 + RNG.uniform(0.2, w / 1.5, k)
    y2 = y1 + RNG.uniform(0.2, h / 1.5, k)
    return np.stack([x1, y1, x2, y2], axis=1).astype(np.float32)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_roi_align(mode, ctm, sampling_ratio, scale):
    x = rand((2, 3, 9, 11))
    rois = _rois(5, 9 / scale, 11 / scale)
    bi = np.array([0, 1, 1, 0, 1], np.int64)
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm, "output_height": 3, "output_width": 4,
             "sampling_ratio": sampling_ratio, "spatial_scale": scale}
    check("RoiAlign", [x, rois, bi], attrs, opset=16, rtol=1e-4, atol=1e-5)


def test_roi_align_opset10():
    x = rand((1, 2, 8, 8))
    rois = _rois(4, 8, 8)
    check("RoiAlign", [x, rois, np.zeros(4, np.int64)], {"output_height": 2, "output_width": 2}, opset=10,
          rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- each path: native (best / baseline ISA), numpy


# (the `path` fixture, native at the best / baseline ISA or numpy: tests/kernels/conftest.py)


def _attrs(mode="avg", ctm="half_pixel", oh=7, ow=7, sampling_ratio=2, scale=1.0):
    return {"mode": mode, "coordinate_transformation_mode": ctm, "output_height": oh, "output_width": ow,
            "sampling_ratio": sampling_ratio, "spatial_scale": scale}


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_detector_head_many_rois_small_map(path, mode, threads):
    # Faster R-CNN's box head: 150 RoIs in image pixels on a 1/32 feature map of 256 channels (the
    # native kernel's channels-last path), legacy coordinates
    before = native.threads()
    native.set_threads(threads)
    try:
        x = rand((1, 256, 10, 10))
        rois = _rois(150, 320, 320)
        attrs = _attrs(mode, "output_half_pixel", scale=1 / 32)
        check("RoiAlign", [x, rois, np.zeros(150, np.int64)], attrs, opset=16, rtol=1e-4, atol=1e-5)
    finally:
        native.set_threads(before)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("sampling_ratio", [0, 3])
def test_few_rois_large_map(path, mode, sampling_ratio):
    # a few RoIs on a large map: the native kernel reads the planes in place
    x = rand((2, 8, 96, 80))
    rois = _rois(3, 96, 80)
    check("RoiAlign", [x, rois, np.array([1, 0, 1], np.int64)], _attrs(mode, sampling_ratio=sampling_ratio,
                                                                        oh=3, ow=5), opset=16,
          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_degenerate_and_outside_rois(path, ctm, mode):
    x = rand((2, 5, 12, 9))
    rois = np.array([
        [3, 3, 3, 3],        # a point
        [6, 2, 4, 8],        # x2 < x1
        [5, 9, 7, 1],        # y2 < y1
        [-30, -30, -20, -20],  # wholly outside
        [-3, -2, 4, 5],      # partly outside
        [7, 10, 40, 50],     # past the far edges
        [0, 0, 9, 12],       # the whole map
        [8.5, 11.5, 9, 12],  # the last pixel
    ], np.float32)
    bi = np.array([0, 1, 0, 1, 0, 1, 0, 1], np.int64)
    # (onnxruntime overflows on the negative sample grids of inverted RoIs in half_pixel mode: those
    # against the onnx reference evaluator, which samples nothing there, as minirt does)
    engine = "onnx-reference" if ctm == "half_pixel" else "onnxruntime"
    for sr in (0, 2):
        check("RoiAlign", [x, rois, bi], _attrs(mode, ctm, oh=3, ow=2, sampling_ratio=sr), opset=16, rtol=1e-4,
              atol=1e-5, engine=engine)


def test_few_channels(path):
    x = rand((1, 2, 16, 16))  # fewer channels than a vector: planes path
    check("RoiAlign", [x, _rois(40, 16, 16), np.zeros(40, np.int64)], _attrs(oh=2, ow=3, sampling_ratio=0),
          opset=16, rtol=1e-4, atol=1e-5)


def test_opset_22(path):
    x = rand((1, 16, 8, 8))
    check("RoiAlign", [x, _rois(20, 8, 8), np.zeros(20, np.int64)], _attrs(oh=2, ow=2), opset=22, rtol=1e-4,
          atol=1e-5)


def test_no_rois(path):
    x = rand((1, 4, 5, 5))
    out = check("RoiAlign", [x, np.zeros((0, 4), np.float32), np.zeros(0, np.int64)], _attrs(oh=2, ow=2),
                opset=16)[0]
    assert out.shape == (0, 4, 2, 2)


def test_batch_index_out_of_range_is_named(path):
    x = rand((2, 4, 5, 5))
    with pytest.raises(ValueError, match=r"batch_indices\[1\] = 2 is out of range for X's batch of 2"):
        run_kernel("RoiAlign", [x, _rois(3, 5, 5), np.array([0, 2, 1], np.int64)], _attrs(), opset=16)


@pytest.mark.parametrize("rois_shape,bi_shape,match", [((3, 5), (3,), r"rois must be \(num_rois, 4\)"),
                                                       ((3, 4), (2,), r"batch_indices must be \(num_rois,\) = \(3,\)")])
def test_bad_shapes_are_named(path, rois_shape, bi_shape, match):
    x = rand((1, 4, 5, 5))
    with pytest.raises(ValueError, match=match):
        run_kernel("RoiAlign", [x, np.zeros(rois_shape, np.float32), np.zeros(bi_shape, np.int64)], _attrs(),
                   opset=16)


def test_huge_sampling_grid_is_refused(path):
    x = rand((1, 4, 5, 5))
    rois = np.array([[0, 0, 4, 1e7]], np.float32)  # sampling_ratio 0: ceil(1e7 / 7) samples per bin
    with pytest.raises(ValueError, match="samples per bin along an axis"):
        run_kernel("RoiAlign", [x, rois, np.zeros(1, np.int64)], _attrs(sampling_ratio=0), opset=16)
