"""NonMaxSuppression / RoiAlign kernels compared against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_elementwise import check, rand

RNG = np.random.default_rng(11)


def _boxes(batch, n, center):
    xy = RNG.uniform(0, 10, size=(batch, n, 2))
    wh = RNG.uniform(0.5, 4, size=(batch, n, 2))
    if center:
        return np.concatenate([xy, wh], axis=-1).astype(np.float32)
    b = np.concatenate([xy, xy + wh], axis=-1)
    # mix the corner order: any diagonal pair is allowed
    flip = RNG.random((batch, n)) < 0.5
    b[flip] = b[flip][:, [2, 3, 0, 1]]
    return b.astype(np.float32)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("max_out,iou,score", [(3, 0.5, None), (100, 0.3, 0.4), (1, 0.0, None), (5, 0.7, 0.2)])
@pytest.mark.parametrize("opset", [10, 11])
def test_nms(center, max_out, iou, score, opset):
    boxes = _boxes(2, 30, center)
    scores = RNG.random((2, 3, 30)).astype(np.float32)
    inputs = [boxes, scores, np.array([max_out], np.int64), np.array([iou], np.float32)]
    if score is not None:
        inputs.append(np.array([score], np.float32))
    check("NonMaxSuppression", inputs, {"center_point_box": center}, opset=opset)


def test_nms_many_boxes_matches_onnxruntime():
    # a detector's anchor count: thousands of candidates, a few hundred kept
    boxes = _boxes(1, 3000, 0)
    scores = RNG.random((1, 2, 3000)).astype(np.float32)
    check("NonMaxSuppression", [boxes, scores, np.array([200], np.int64), np.array([0.5], np.float32),
                                np.array([0.05], np.float32)], opset=11)


def test_nms_memory_is_linear_in_the_boxes():
    # SSDlite's 27,000 anchors once needed a 5.4 GiB IoU matrix; the kernel now holds O(boxes) at a time
    import tracemalloc

    from minirt.kernels.detection import non_max_suppression_11

    n = 20000
    boxes, scores = _boxes(1, n, 0), RNG.random((1, 1, n)).astype(np.float32)
    tracemalloc.start()
    try:
        selected = non_max_suppression_11(boxes, scores, np.array([50], np.int64), np.array([0.5], np.float32))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert selected.shape == (50, 3)
    assert peak < 64 * n * 8, f"NonMaxSuppression of {n} boxes peaked at {peak / 2**20:.1f} MiB"


def test_nms_optional_inputs_absent():
    boxes = _boxes(1, 8, 0)
    scores = RNG.random((1, 1, 8)).astype(np.float32)
    check("NonMaxSuppression", [boxes, scores], opset=11)
    check("NonMaxSuppression", [boxes, scores, np.array([4], np.int64)], opset=11)


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
