"""NonMaxSuppression against onnxruntime and the onnx reference evaluator, index for index.

Every case runs three ways: the native kernel (``mrt_nms_f32``) with the best ISA and with the baseline
one, and the numpy path.  Both references select the same boxes on these inputs (they share the
algorithm: onnx's evaluator is a port of onnxruntime's kernel), so any difference is ours.  The
reference evaluator's pure-Python loop is quadratic: it gets the small cases, onnxruntime all of them.
"""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from tests.kernels.test_elementwise import reference, run_kernel

RNG = np.random.default_rng(23)


# (the `path` fixture, native at the best / baseline ISA or numpy: tests/kernels/conftest.py)


def nms_inputs(boxes, scores, max_out=None, iou=None, score=None):
    """The node's inputs: trailing absent optionals dropped, the present ones as 1-element tensors."""
    inputs = [np.asarray(boxes, np.float32), np.asarray(scores, np.float32),
              None if max_out is None else np.array([max_out], np.int64),
              None if iou is None else np.array([iou], np.float32),
              None if score is None else np.array([score], np.float32)]
    while inputs[-1] is None:
        inputs.pop()
    return inputs


def check_nms(inputs, center=0, opset=11, engines=("onnxruntime", "onnx-reference")):
    """The kernel's selection equals each engine's, row for row."""
    attrs = {"center_point_box": center}
    actual = run_kernel("NonMaxSuppression", inputs, attrs, opset)[0]
    assert actual.dtype == np.int64 and actual.ndim == 2 and actual.shape[1] == 3, (actual.dtype, actual.shape)
    for engine in engines:
        expected = np.asarray(reference("NonMaxSuppression", inputs, attrs, opset=opset, engine=engine)[0])
        np.testing.assert_array_equal(actual, expected.reshape(-1, 3), err_msg=engine)
    return actual


def random_boxes(batch, n, center, spread=10.0, size=(0.5, 4.0), flip=0.5):
    """Random boxes: centre format, or corners with a fraction ``flip`` of them given as the other diagonal
    (y1 > y2 and / or x1 > x2)."""
    xy = RNG.uniform(0, spread, size=(batch, n, 2))
    wh = RNG.uniform(*size, size=(batch, n, 2))
    if center:
        return np.concatenate([xy, wh], axis=-1).astype(np.float32)
    b = np.concatenate([xy, xy + wh], axis=-1)
    fy, fx = RNG.random((batch, n)) < flip, RNG.random((batch, n)) < flip
    b[fy] = b[fy][:, [2, 1, 0, 3]]
    b[fx] = b[fx][:, [0, 3, 2, 1]]
    return b.astype(np.float32)


# --------------------------------------------------------------------------- random inputs


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("max_out,iou,score", [(3, 0.5, None), (100, 0.3, 0.4), (1, 0.0, None), (5, 0.7, 0.2),
                                               (1000, 1.0, None), (1000, 0.45, 0.1)])
@pytest.mark.parametrize("opset", [10, 11])
def test_random(path, center, max_out, iou, score, opset):
    boxes = random_boxes(2, 40, center)
    scores = RNG.random((2, 3, 40)).astype(np.float32)
    check_nms(nms_inputs(boxes, scores, max_out, iou, score), center, opset)


@pytest.mark.parametrize("center", [0, 1])
def test_many_boxes_window(path, center):
    # past NMS_WINDOW_MIN candidates the native kernel searches an x-ordered window of the kept boxes
    boxes = random_boxes(1, 3000, center, spread=100.0, size=(0.5, 12.0))
    scores = RNG.random((1, 2, 3000)).astype(np.float32)
    check_nms(nms_inputs(boxes, scores, 3000, 0.3, 0.05), center, engines=("onnxruntime",))


def test_batched_offsets_like_torchvision(path):
    # torchvision's batched_nms: one class, every class's boxes shifted by class * (max coordinate + 1),
    # so that boxes of different classes never overlap (SSDlite: 90 classes x 300 boxes)
    classes, per = 30, 200
    boxes = random_boxes(1, classes * per, 0, spread=300.0, size=(5.0, 150.0), flip=0.0)[0]
    offsets = np.repeat(np.arange(classes, dtype=np.float32) * (boxes.max() + 1), per)
    boxes = (boxes + offsets[:, None])[None]
    scores = RNG.random((1, 1, classes * per)).astype(np.float32)
    selected = check_nms(nms_inputs(boxes, scores, 2**62, 0.55), engines=("onnxruntime",))
    assert 0 < len(selected) < classes * per


def test_large_coordinates(path):
    # far from the origin float32 steps are coarse (1/16 at 1e6): the x window's bounds must still hold
    # every box that can overlap (its margin covers the rounding of x0 - widest width)
    boxes = random_boxes(1, 2000, 0, spread=400.0, size=(0.05, 30.0), flip=0.3) + np.float32(1e6)
    scores = RNG.random((1, 1, 2000)).astype(np.float32)
    check_nms(nms_inputs(boxes, scores, 2000, 0.2), engines=("onnxruntime",))


def test_everything_overlaps_many_kept(path):
    # no spatial structure to exploit: every box overlaps every other, IoU threshold high enough that
    # most are kept (the window is the whole class)
    boxes = random_boxes(1, 1500, 0, spread=1.0, size=(40.0, 50.0), flip=0.0)
    scores = RNG.random((1, 1, 1500)).astype(np.float32)
    selected = check_nms(nms_inputs(boxes, scores, 1500, 0.97), engines=("onnxruntime",))
    assert len(selected) > 100


# --------------------------------------------------------------------------- adversarial inputs


def test_tied_scores_lower_index_first(path):
    boxes = random_boxes(1, 60, 0)
    scores = (RNG.integers(0, 4, (1, 2, 60)) / 4).astype(np.float32)  # four distinct values
    scores[0, 1, ::3] = -0.0  # -0.0 ties with 0.0
    scores[0, 1, 1::3] = 0.0
    check_nms(nms_inputs(boxes, scores, 60, 0.3))


def test_identical_boxes(path):
    one = random_boxes(1, 5, 0)
    boxes = np.repeat(one, 6, axis=1)  # each box six times, adjacent
    scores = RNG.random((1, 2, 30)).astype(np.float32)
    scores[0, 1] = 0.5  # all tied: the lowest index of each group survives
    out = check_nms(nms_inputs(boxes, scores, 30, 0.5))
    assert len(out[out[:, 1] == 1]) <= 5


@pytest.mark.parametrize("center", [0, 1])
def test_zero_area_and_negative_sizes(path, center):
    boxes = random_boxes(1, 40, center)
    if center:
        boxes[0, :10, 2] = 0.0  # zero width
        boxes[0, 10:20, 3] = -boxes[0, 10:20, 3]  # negative height: y0 > y1
        boxes[0, 20:25, 2:] = -boxes[0, 20:25, 2:]  # both negative: a positive area, never overlapping
    else:
        boxes[0, :10, 2] = boxes[0, :10, 0]  # y1 == y2
        boxes[0, 10:20, 3] = boxes[0, 10:20, 1]  # x1 == x2
    boxes[0, 30:] = boxes[0, :10]  # some duplicates of the degenerate ones
    scores = RNG.random((1, 1, 40)).astype(np.float32)
    check_nms(nms_inputs(boxes, scores, 40, 0.0), center)
    check_nms(nms_inputs(boxes, scores, 40, 0.4), center)


def test_iou_exactly_at_the_threshold_is_kept(path):
    # IoU([0,0,1,2], [0,0,1,1]) = 1 / 2 exactly: suppressed only above the threshold
    boxes = np.array([[[0, 0, 1, 2], [0, 0, 1, 1], [5, 5, 6, 7], [5, 5, 6, 6]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7, 0.6]]], np.float32)
    assert len(check_nms(nms_inputs(boxes, scores, 10, 0.5))) == 4
    assert len(check_nms(nms_inputs(boxes, scores, 10, np.nextafter(np.float32(0.5), np.float32(0))))) == 2


def test_touching_boxes_do_not_overlap(path):
    # sharing an edge or a corner: no intersection, kept even at IoU threshold 0
    boxes = np.array([[[0, 0, 1, 1], [0, 1, 1, 2], [1, 1, 2, 2], [0.5, 0.5, 1.5, 1.5]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7, 0.6]]], np.float32)
    out = check_nms(nms_inputs(boxes, scores, 10, 0.0))
    assert out[:, 2].tolist() == [0, 1, 2]


def test_score_exactly_at_the_threshold_is_dropped(path):
    boxes = random_boxes(1, 6, 0, spread=100.0)
    scores = np.array([[[0.5, 0.25, 0.75, 0.5, 0.1, 0.9]]], np.float32)
    out = check_nms(nms_inputs(boxes, scores, 10, 0.5, 0.5))
    assert sorted(out[:, 2].tolist()) == [2, 5]


def test_iou_threshold_edges(path):
    boxes = random_boxes(2, 50, 0, spread=5.0)
    scores = RNG.random((2, 2, 50)).astype(np.float32)
    none = check_nms(nms_inputs(boxes, scores, 50, 1.0))  # IoU <= 1: nothing is ever suppressed
    assert len(none) == 2 * 2 * 50
    check_nms(nms_inputs(boxes, scores, 50, 0.0))  # any overlap suppresses


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # (the reference evaluator's inf - inf)
@pytest.mark.parametrize("center", [0, 1])
def test_non_finite_boxes_never_suppress(path, center):
    boxes = random_boxes(1, 30, center, spread=3.0)
    boxes[0, 0, 1] = np.nan
    boxes[0, 3, 3] = np.inf
    boxes[0, 6, 0] = -np.inf
    boxes[0, 9] = np.inf
    boxes[0, 12, 2] = np.nan
    scores = RNG.random((1, 1, 30)).astype(np.float32)
    scores[0, 0, [0, 3, 6, 9, 12]] = 1.0  # first in line: they would suppress the rest
    out = check_nms(nms_inputs(boxes, scores, 30, 0.1), center)
    assert {0, 3, 6, 9, 12} <= set(out[:, 2].tolist())


def test_nan_scores_are_dropped_by_a_threshold(path):
    boxes = random_boxes(1, 20, 0)
    scores = RNG.random((1, 1, 20)).astype(np.float32)
    scores[0, 0, ::4] = np.nan
    out = check_nms(nms_inputs(boxes, scores, 20, 0.5, 0.0))
    assert not set(out[:, 2].tolist()) & set(range(0, 20, 4))


def test_max_output_stops_early_per_class(path):
    boxes = random_boxes(3, 50, 0, spread=50.0)
    scores = RNG.random((3, 4, 50)).astype(np.float32)
    out = check_nms(nms_inputs(boxes, scores, 2, 0.5))
    assert len(out) == 3 * 4 * 2


@pytest.mark.parametrize("max_out", [0, -3])
def test_max_output_zero_or_negative_selects_nothing(path, max_out):
    boxes = random_boxes(1, 10, 0)
    scores = RNG.random((1, 2, 10)).astype(np.float32)
    out = check_nms(nms_inputs(boxes, scores, max_out, 0.5), engines=("onnxruntime",))
    assert out.shape == (0, 3)


def test_optional_inputs_absent(path):
    boxes = random_boxes(1, 8, 0)
    scores = RNG.random((1, 1, 8)).astype(np.float32)
    # (the reference evaluator fails without max_output_boxes_per_class or iou_threshold; onnxruntime
    # selects nothing, and takes an absent iou_threshold as 0)
    assert check_nms(nms_inputs(boxes, scores), engines=("onnxruntime",)).shape == (0, 3)
    check_nms(nms_inputs(boxes, scores, 4), engines=("onnxruntime",))


@pytest.mark.parametrize("shape_boxes,shape_scores", [((1, 0, 4), (1, 3, 0)), ((2, 5, 4), (2, 0, 5)),
                                                      ((0, 5, 4), (0, 2, 5))])
def test_empty_inputs(path, shape_boxes, shape_scores):
    boxes = RNG.random(shape_boxes).astype(np.float32)
    scores = RNG.random(shape_scores).astype(np.float32)
    out = check_nms(nms_inputs(boxes, scores, 5, 0.5), engines=("onnxruntime",))
    assert out.shape == (0, 3)


def test_scores_below_every_threshold(path):
    boxes = random_boxes(2, 10, 0)
    scores = RNG.random((2, 2, 10)).astype(np.float32) * 0.1
    assert check_nms(nms_inputs(boxes, scores, 5, 0.5, 0.5)).shape == (0, 3)


def test_memory_is_linear_in_the_boxes(path):
    # SSDlite's 27,000 anchors once needed a 5.4 GiB IoU matrix; both paths hold O(boxes) at a time
    import tracemalloc

    n = 20000
    boxes, scores = random_boxes(1, n, 0), RNG.random((1, 1, n)).astype(np.float32)
    tracemalloc.start()
    try:
        selected = run_kernel("NonMaxSuppression", nms_inputs(boxes, scores, 50, 0.5), opset=11)[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert selected.shape == (50, 3)
    assert peak < 64 * n * 8, f"NonMaxSuppression of {n} boxes peaked at {peak / 2**20:.1f} MiB"


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("boxes_shape,scores_shape,match", [
    ((1, 5, 3), (1, 1, 5), r"boxes must be \(num_batches, spatial_dimension, 4\)"),
    ((5, 4), (1, 1, 5), r"boxes must be"),
    ((1, 5, 4), (1, 1, 6), r"scores must be \(num_batches, num_classes, spatial_dimension\) = \(1, C, 5\)"),
    ((2, 5, 4), (1, 1, 5), r"scores must be"),
])
def test_bad_shapes_are_named(path, boxes_shape, scores_shape, match):
    inputs = nms_inputs(np.zeros(boxes_shape), np.zeros(scores_shape), 3, 0.5)
    with pytest.raises(ValueError, match=match):
        run_kernel("NonMaxSuppression", inputs, opset=11)


@pytest.mark.parametrize("iou", [-0.1, 1.5, float("nan")])
def test_iou_threshold_outside_zero_one(path, iou):
    inputs = nms_inputs(random_boxes(1, 4, 0), RNG.random((1, 1, 4)), 3, iou)
    with pytest.raises(ValueError, match=r"iou_threshold must be in \[0, 1\]"):
        run_kernel("NonMaxSuppression", inputs, opset=11)


def test_center_point_box_must_be_0_or_1(path):
    inputs = nms_inputs(random_boxes(1, 4, 0), RNG.random((1, 1, 4)), 3, 0.5)
    with pytest.raises(ValueError, match="center_point_box must be 0 or 1, got 2"):
        run_kernel("NonMaxSuppression", inputs, {"center_point_box": 2}, opset=11)
