"""Object-detection kernels: NonMaxSuppression and RoiAlign.

NonMaxSuppression walks each (batch, class)'s candidates in score order and,
for every box it keeps, computes that box's IoU with the candidates still alive
after it in one vectorised pass: memory stays linear in the number of boxes (a
detector's 27,000 anchors would need a 5.4 GiB float64 IoU matrix).  RoiAlign
is separable: for every RoI the sample rows and columns (and their bilinear
taps) are computed per axis, the four taps are gathered for the whole
(rows x columns) sample grid at once and pooled per output bin.
"""
from __future__ import annotations

import math

import numpy as np

from minirt.kernels import _narrow
from minirt.kernels.registry import kernel

# --------------------------------------------------------------------------- NonMaxSuppression


def _corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """(..., 4) boxes -> (..., 4) as [y_min, x_min, y_max, x_max]."""
    b = boxes.astype(np.float64)
    if center_point_box:
        xc, yc, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
    if center_point_box != 0:
        raise ValueError(f"NonMaxSuppression: center_point_box must be 0 or 1, got {center_point_box}")
    # any diagonal pair of corners
    return np.stack([np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3]),
                     np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3])], axis=-1)


def _iou_with(c: np.ndarray, area: np.ndarray, i: int, others: np.ndarray) -> np.ndarray:
    """IoU of corner box ``c[i]`` with the boxes ``c[others]`` ((K, 4) corners, their areas); 0 where
    either box has no area."""
    o = c[others]
    ih = np.clip(np.minimum(c[i, 2], o[:, 2]) - np.maximum(c[i, 0], o[:, 0]), 0, None)
    iw = np.clip(np.minimum(c[i, 3], o[:, 3]) - np.maximum(c[i, 1], o[:, 1]), 0, None)
    inter = ih * iw
    union = area[i] + area[others] - inter
    ok = (area[i] > 0) & (area[others] > 0) & (union > 0)
    return np.where(ok, inter / np.where(ok, union, 1.0), 0.0)


def _scalar(v, default, cast):
    if v is None:
        return default
    a = np.asarray(v).reshape(-1)
    return default if a.size == 0 else cast(a[0])


def _nms(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold, center_point_box):
    boxes = np.asarray(boxes)
    scores = _narrow.widen(np.asarray(scores))
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ValueError(f"NonMaxSuppression: boxes must be (batch, spatial, 4), got {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"NonMaxSuppression: scores {scores.shape} do not fit boxes {boxes.shape}")
    max_out = _scalar(max_output_boxes_per_class, 0, int)
    iou_thr = _scalar(iou_threshold, 0.0, float)
    score_thr = _scalar(score_threshold, None, float)
    if not 0.0 <= iou_thr <= 1.0:
        raise ValueError(f"NonMaxSuppression: iou_threshold must be in [0, 1], got {iou_thr}")
    selected: list[tuple[int, int, int]] = []
    if max_out <= 0:
        return np.zeros((0, 3), dtype=np.int64)
    corners = _corners(_narrow.widen(boxes), center_point_box)
    for b in range(scores.shape[0]):
        for cls in range(scores.shape[1]):
            s = scores[b, cls].astype(np.float64)
            cand = np.arange(s.shape[0])
            if score_thr is not None:
                cand = cand[s >= score_thr]  # boxes scoring below the threshold are removed
            if cand.size == 0:
                continue
            cand = cand[np.argsort(-s[cand], kind="stable")]  # ties: lower box index first
            c = corners[b, cand]
            area = (c[:, 2] - c[:, 0]) * (c[:, 3] - c[:, 1])
            # Invariant: alive[j] is False once a kept, higher-scoring box overlaps box j by more
            # than the threshold; a box is kept when it is still alive at its turn.
            alive = np.ones(cand.size, dtype=bool)
            kept = 0
            for i in range(cand.size):
                if not alive[i]:
                    continue
                selected.append((b, cls, int(cand[i])))
                kept += 1
                if kept >= max_out:
                    break
                later = np.flatnonzero(alive[i + 1:]) + (i + 1)
                if later.size:
                    alive[later[_iou_with(c, area, i, later) > iou_thr]] = False  # equal to the threshold is kept
    if not selected:
        return np.zeros((0, 3), dtype=np.int64)
    return np.array(selected, dtype=np.int64)


@kernel("NonMaxSuppression", since=10)
def non_max_suppression_10(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                           score_threshold=None, /, *, center_point_box=0):
    return _nms(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold, center_point_box)


@kernel("NonMaxSuppression", since=11)
def non_max_suppression_11(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                           score_threshold=None, /, *, center_point_box=0):
    return _nms(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold, center_point_box)


# --------------------------------------------------------------------------- RoiAlign


def _axis_samples(start: float, bin_size: float, n_out: int, grid: int, length: int):
    """Bilinear taps of the sample positions along one axis.

    Returns (low, high, w_low, w_high), each (n_out * grid,).  Positions more
    than one pixel outside the map get zero weights; the rest are clamped to
    the map as in Mask R-CNN's reference implementation.
    """
    p = np.arange(n_out, dtype=np.float64)[:, None]
    i = np.arange(grid, dtype=np.float64)[None, :]
    pos = (start + p * bin_size + (i + 0.5) * bin_size / grid).reshape(-1)
    outside = (pos < -1.0) | (pos > length)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    at_edge = low >= length - 1
    low = np.where(at_edge, length - 1, low)
    high = np.where(at_edge, length - 1, low + 1)
    pos = np.where(at_edge, low.astype(np.float64), pos)
    frac = pos - low
    w_low = np.where(outside, 0.0, 1.0 - frac)
    w_high = np.where(outside, 0.0, frac)
    return low, high, w_low, w_high


def _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
               half_pixel):
    x = np.asarray(x)
    rois = _narrow.widen(np.asarray(rois)).astype(np.float64)
    batch_indices = np.asarray(batch_indices).reshape(-1).astype(np.int64)
    if x.ndim != 4:
        raise ValueError(f"RoiAlign: X must be (N, C, H, W), got shape {x.shape}")
    if rois.ndim != 2 or rois.shape[1] != 4 or batch_indices.shape[0] != rois.shape[0]:
        raise ValueError(f"RoiAlign: rois {rois.shape} / batch_indices {batch_indices.shape} mismatch")
    if mode not in ("avg", "max"):
        raise ValueError(f"RoiAlign: mode must be 'avg' or 'max', got {mode!r}")
    n, c, h, w = x.shape
    oh, ow = int(output_height), int(output_width)
    cdt = np.float64 if x.dtype == np.float64 else np.float32
    xw = _narrow.widen(x).astype(cdt, copy=False)
    out = np.zeros((rois.shape[0], c, oh, ow), dtype=cdt)
    offset = 0.5 if half_pixel else 0.0
    for r in range(rois.shape[0]):
        b = int(batch_indices[r])
        if not 0 <= b < n:
            raise ValueError(f"RoiAlign: batch index {b} out of range for batch size {n}")
        x1, y1, x2, y2 = rois[r] * spatial_scale - offset
        roi_w, roi_h = x2 - x1, y2 - y1
        if not half_pixel:  # legacy behaviour: RoIs are at least one pixel
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / oh, roi_w / ow
        gh = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(roi_h / oh))
        gw = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(roi_w / ow))
        gh, gw = max(gh, 1), max(gw, 1)  # a degenerate RoI still samples once per bin
        yl, yh, wyl, wyh = _axis_samples(y1, bin_h, oh, gh, h)
        xl, xh, wxl, wxh = _axis_samples(x1, bin_w, ow, gw, w)
        img = xw[b]  # (C, H, W)
        terms = (
            (img[:, yl[:, None], xl[None, :]], np.outer(wyl, wxl)),
            (img[:, yl[:, None], xh[None, :]], np.outer(wyl, wxh)),
            (img[:, yh[:, None], xl[None, :]], np.outer(wyh, wxl)),
            (img[:, yh[:, None], xh[None, :]], np.outer(wyh, wxh)),
        )
        if mode == "avg":
            vals = sum(v * wt.astype(cdt) for v, wt in terms)  # (C, oh*gh, ow*gw)
            out[r] = vals.reshape(c, oh, gh, ow, gw).mean(axis=(2, 4))
        else:
            # max of the weighted taps of every sample (onnxruntime's definition), then over the bin
            vals = np.maximum.reduce([v * wt.astype(cdt) for v, wt in terms])
            out[r] = vals.reshape(c, oh, gh, ow, gw).max(axis=(2, 4))
    return out.astype(x.dtype)


@kernel("RoiAlign", since=10)
def roi_align_10(x, rois, batch_indices, /, *, mode="avg", output_height=1, output_width=1, sampling_ratio=0,
                 spatial_scale=1.0):
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
                      half_pixel=False)


def _roi_align_16(x, rois, batch_indices, coordinate_transformation_mode, mode, output_height, output_width,
                  sampling_ratio, spatial_scale):
    if coordinate_transformation_mode not in ("half_pixel", "output_half_pixel"):
        raise ValueError("RoiAlign: coordinate_transformation_mode must be 'half_pixel' or 'output_half_pixel', "
                         f"got {coordinate_transformation_mode!r}")
    return _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
                      half_pixel=coordinate_transformation_mode == "half_pixel")


@kernel("RoiAlign", since=16)
def roi_align_16(x, rois, batch_indices, /, *, coordinate_transformation_mode="half_pixel", mode="avg",
                 output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    return _roi_align_16(x, rois, batch_indices, coordinate_transformation_mode, mode, output_height,
                         output_width, sampling_ratio, spatial_scale)


@kernel("RoiAlign", since=22)
def roi_align_22(x, rois, batch_indices, /, *, coordinate_transformation_mode="half_pixel", mode="avg",
                 output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    return _roi_align_16(x, rois, batch_indices, coordinate_transformation_mode, mode, output_height,
                         output_width, sampling_ratio, spatial_scale)
