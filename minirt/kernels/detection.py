"""Object-detection kernels: NonMaxSuppression and RoiAlign.

NonMaxSuppression selects exactly what the ONNX reference evaluator and onnxruntime select: per batch
and class, the candidates (score > score_threshold) in descending score order (ties: lower box index
first), each kept unless a box kept before it overlaps it with IoU > iou_threshold, the IoU evaluated
in the boxes' float type operation for operation as the reference does (``_suppresses``).  The native
kernel (``mrt_nms_f32``, minirt/native/nms_impl.h) does it for float32 with a radix sort and greedy
suppression against the kept boxes of an x-ordered window; the numpy path takes the candidates in
blocks of ``_NMS_BLOCK``: each block is tested against the boxes kept so far (only those whose x range
can overlap, found by binary search in x order) and resolved inside with a block x block suppression
matrix, in a few vectorised rounds.  Both skip only pairs the IoU test provably rejects (boxes whose x
ranges do not overlap; boxes with a non-finite corner, which never suppress and are never suppressed),
and both stop once ``max_output_boxes_per_class`` boxes are kept.  Memory stays linear in the number
of boxes (a detector's 27,000 anchors would need a 5.4 GiB float64 IoU matrix).

RoiAlign is separable: for every RoI the sample rows and columns (and their bilinear taps) are
computed per axis, the four taps are gathered for the whole (rows x columns) sample grid at once and
pooled per output bin; the native kernel (``mrt_roi_align_f32``) samples channels-last vectors.
"""
from __future__ import annotations

import math

import numpy as np

from minirt import native as _native
from minirt.kernels import _narrow
from minirt.kernels._limits import check_alloc
from minirt.kernels.registry import kernel

# --------------------------------------------------------------------------- NonMaxSuppression

# Candidates resolved together by the numpy path (a block x block suppression matrix).
_NMS_BLOCK = 256
# Candidate / kept pairs evaluated at once by the numpy path (bounds its temporaries: ~60 bytes a pair).
_NMS_PAIRS = 1 << 18


def _corners(boxes: np.ndarray, center_point_box: int) -> tuple:
    """(..., 4) boxes -> (x0, x1, y0, y1, area) as the reference's IoU test reads them, in the boxes'
    float type: [y1, x1, y2, x2] through its MaxMin (x0 <= x1, y0 <= y1), [xc, yc, w, h] as centre +- half
    size (a negative size leaves x0 > x1: such a box never overlaps anything)."""
    if center_point_box:
        half_w, half_h = boxes[..., 2] / 2, boxes[..., 3] / 2
        x0, x1 = boxes[..., 0] - half_w, boxes[..., 0] + half_w
        y0, y1 = boxes[..., 1] - half_h, boxes[..., 1] + half_h
    else:
        a, b = boxes[..., 1], boxes[..., 3]
        x0, x1 = np.where(a >= b, b, a), np.where(a >= b, a, b)
        a, b = boxes[..., 0], boxes[..., 2]
        y0, y1 = np.where(a >= b, b, a), np.where(a >= b, a, b)
    return x0, x1, y0, y1, (x1 - x0) * (y1 - y0)


def _suppresses(c: tuple, s: tuple, thr) -> np.ndarray:
    """Elementwise: whether box ``s`` suppresses candidate ``c`` (tuples of (x0, x1, y0, y1, area) arrays
    of finite boxes): the reference's IoU test in the arrays' float type (intersection, union = area(c) +
    area(s) - intersection, both positive areas, IoU > threshold strictly)."""
    ix0, ix1 = np.maximum(c[0], s[0]), np.minimum(c[1], s[1])
    iy0, iy1 = np.maximum(c[2], s[2]), np.minimum(c[3], s[3])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inter = (ix1 - ix0) * (iy1 - iy0)
        union = c[4] + s[4] - inter
        iou = inter / union
    return ((ix1 > ix0) & (iy1 > iy0) & (inter > 0) & (c[4] > 0) & (s[4] > 0) & (union > 0) & (iou > thr))


def _nms_class_numpy(box: tuple, finite: np.ndarray, thr, max_out: int) -> np.ndarray:
    """Positions kept among candidates already in score order (``box`` their (x0, x1, y0, y1, area),
    ``finite`` whether all four corners are finite), at most ``max_out``, in order."""
    m = box[0].size
    kept_parts, n_kept = [], 0
    # the finite kept boxes in x0 order, and an upper bound of their widths (double, with a margin for
    # the rounding of the subtraction)
    kept = tuple(np.empty(0, box[0].dtype) for _ in range(5))
    kept_x0 = np.empty(0, np.float64)
    wmax = 0.0
    for start in range(0, m, _NMS_BLOCK):
        end = min(start + _NMS_BLOCK, m)
        blk = tuple(a[start:end] for a in box)
        fin = finite[start:end]
        alive = np.ones(end - start, dtype=bool)
        # 1. against the boxes kept in earlier blocks: those whose x0 lies in [x0 - W - margin, x1)
        cand = np.flatnonzero(fin)
        if kept_x0.size and cand.size:
            x0 = blk[0][cand].astype(np.float64)
            lo = np.searchsorted(kept_x0, x0 - wmax - (np.abs(x0) + wmax) * 2.0 ** -40, "left")
            hi = np.searchsorted(kept_x0, blk[1][cand].astype(np.float64), "left")
            counts = np.maximum(hi - lo, 0)
            ends = np.cumsum(counts)
            first = 0
            while first < cand.size:  # candidates in groups of at most _NMS_PAIRS pairs (or one candidate)
                base = ends[first - 1] if first else 0
                last = max(int(np.searchsorted(ends, base + _NMS_PAIRS, "right")), first + 1)
                cnt = counts[first:last]
                total = int(cnt.sum())
                if total:
                    who = np.repeat(np.arange(first, last), cnt)
                    at = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt) + np.repeat(lo[first:last], cnt)
                    hit = _suppresses(tuple(a[cand[who]] for a in blk), tuple(k[at] for k in kept), thr)
                    alive[cand[np.unique(who[hit])]] = False
                first = last
        # 2. inside the block: sup[i, j] = box i suppresses box j (i before j, both finite)
        sup = _suppresses(tuple(a[None, :] for a in blk), tuple(a[:, None] for a in blk), thr)
        sup &= np.triu(np.ones((end - start, end - start), dtype=bool), 1) & fin[:, None] & fin[None, :]
        # Greedy order in rounds.  Invariant: a box is decided (kept or removed) only once every box
        # before it that could suppress it is decided; it is removed as soon as a kept box suppresses
        # it.  Each round decides at least the first undecided box, so the loop ends.
        undecided, keep = alive, np.zeros_like(alive)
        while undecided.any():
            undecided = undecided & ~sup[keep].any(axis=0)
            ready = undecided & ~sup[undecided].any(axis=0)
            keep |= ready
            undecided = undecided & ~ready
        pos = np.flatnonzero(keep)[: max_out - n_kept] + start
        kept_parts.append(pos)
        n_kept += pos.size
        if n_kept >= max_out:
            break
        new = pos[finite[pos]]
        if new.size:
            merged = tuple(np.concatenate([k, a[new]]) for k, a in zip(kept, box))
            order = np.argsort(merged[0], kind="stable")
            kept = tuple(a[order] for a in merged)
            kept_x0 = kept[0].astype(np.float64)
            width = float(np.max(box[1][new].astype(np.float64) - box[0][new].astype(np.float64)))
            wmax = max(wmax, width * (1 + 2.0 ** -40))
    return np.concatenate(kept_parts) if kept_parts else np.zeros(0, dtype=np.int64)


def _nms_numpy(boxes, scores, max_out, iou_thr, score_thr, center_point_box):
    ftype = boxes.dtype
    thr = ftype.type(iou_thr)
    with np.errstate(invalid="ignore", over="ignore"):  # (inf - inf: a non-finite box, never compared)
        x0, x1, y0, y1, area = _corners(boxes, center_point_box)
    finite = np.isfinite(x0) & np.isfinite(x1) & np.isfinite(y0) & np.isfinite(y1)
    rows = []
    for b in range(scores.shape[0]):
        for cls in range(scores.shape[1]):
            s = scores[b, cls]
            cand = np.arange(s.shape[0]) if score_thr is None else np.flatnonzero(s > scores.dtype.type(score_thr))
            if cand.size == 0:
                continue
            # descending score, ties in box order (stable sort of the negated scores; -0.0 == 0.0), NaN last
            cand = cand[np.argsort(-s[cand], kind="stable")]
            box = tuple(a[b, cand] for a in (x0, x1, y0, y1, area))
            pos = _nms_class_numpy(box, finite[b, cand], thr, max_out)
            if pos.size:
                rows.append(np.stack([np.full(pos.size, b), np.full(pos.size, cls), cand[pos]], axis=1))
    return np.concatenate(rows).astype(np.int64) if rows else np.zeros((0, 3), dtype=np.int64)


def _scalar(v, default, cast, what: str):
    if v is None:
        return default
    a = np.asarray(v)
    if a.size > 1:
        raise ValueError(f"NonMaxSuppression: {what} must hold one value, got shape {a.shape}")
    return default if a.size == 0 else cast(a.reshape(-1)[0])


def _nms(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold, center_point_box):
    boxes = np.asarray(_narrow.widen(np.asarray(boxes)))
    scores = np.asarray(_narrow.widen(np.asarray(scores)))
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ValueError(f"NonMaxSuppression: boxes must be (num_batches, spatial_dimension, 4), got shape "
                         f"{boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"NonMaxSuppression: scores must be (num_batches, num_classes, spatial_dimension) = "
                         f"({boxes.shape[0]}, C, {boxes.shape[1]}) for boxes {boxes.shape}, got {scores.shape}")
    if boxes.dtype.kind != "f" or scores.dtype.kind != "f":
        raise ValueError(f"NonMaxSuppression: boxes and scores must be float, got {boxes.dtype} and {scores.dtype}")
    if center_point_box not in (0, 1):
        raise ValueError(f"NonMaxSuppression: center_point_box must be 0 or 1, got {center_point_box}")
    max_out = max(_scalar(max_output_boxes_per_class, 0, int, "max_output_boxes_per_class"), 0)
    iou_thr = _scalar(iou_threshold, 0.0, float, "iou_threshold")
    score_thr = _scalar(score_threshold, None, float, "score_threshold")
    if not 0.0 <= iou_thr <= 1.0:
        raise ValueError(f"NonMaxSuppression: iou_threshold must be in [0, 1], got {iou_thr}")
    if max_out == 0 or boxes.shape[1] == 0 or scores.shape[1] == 0:
        return np.zeros((0, 3), dtype=np.int64)
    if boxes.dtype == np.float32 and scores.dtype == np.float32 and _native.available:
        return _native.nms(np.ascontiguousarray(boxes), np.ascontiguousarray(scores), max_out, iou_thr, score_thr,
                           int(center_point_box))
    if boxes.dtype != np.float64:  # (the test runs in the boxes' type: float32, or float64 as given)
        boxes = boxes.astype(np.float32)
    return _nms_numpy(boxes, scores, max_out, iou_thr, score_thr, center_point_box)


@kernel("NonMaxSuppression", since=10)
def non_max_suppression_10(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                           score_threshold=None, /, *, center_point_box=0):
    return _nms(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold, center_point_box)


@kernel("NonMaxSuppression", since=11)
def non_max_suppression_11(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                           score_threshold=None, /, *, center_point_box=0):
    return _nms(boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold, center_point_box)


# --------------------------------------------------------------------------- RoiAlign


# a RoI needing more samples per bin along an axis than this is refused (mrt_roi_align_f32's limit too)
_ROI_MAX_GRID = 65536


def _axis_samples(start, bin_size, n_out: int, grid: int, length: int, ftype):
    """Bilinear taps of the sample positions along one axis, in onnxruntime's arithmetic (``ftype``:
    the input's float type; sample i of bin p at start + p * bin + (i + 0.5) * bin / grid).

    Returns (low, high, w_low, w_high), each (n_out * grid,).  Positions more than one pixel outside
    the map (or NaN) get zero weights; the rest are clamped to the map as in Mask R-CNN's reference
    implementation (below 0 -> 0, at or past the last pixel -> the last pixel).
    """
    f = ftype.type
    p = np.arange(n_out, dtype=ftype)[:, None]
    i = np.arange(grid, dtype=ftype)[None, :]
    pos = ((f(start) + p * f(bin_size)) + (i + f(0.5)) * f(bin_size) / f(grid)).reshape(-1)
    outside = ~((pos >= -1) & (pos <= length))
    pos = np.where(outside, f(0), np.maximum(pos, f(0)))
    low = pos.astype(np.int64)  # (pos >= 0: truncation is floor)
    at_edge = low >= length - 1
    low = np.where(at_edge, length - 1, low)
    high = np.where(at_edge, length - 1, low + 1)
    pos = np.where(at_edge, low.astype(ftype), pos)
    frac = pos - low.astype(ftype)
    w_low = np.where(outside, f(0), f(1) - frac)
    w_high = np.where(outside, f(0), frac)
    return low, high, w_low, w_high


def _roi_grid(size, bins: int, sampling_ratio: int) -> int:
    """Samples per bin along an axis: the sampling ratio, or ceil(size / bins); 0 for none (an empty or
    negative RoI: its output is 0, as onnxruntime's)."""
    g = int(sampling_ratio) if sampling_ratio > 0 else (int(np.ceil(size / type(size)(bins))) if size > 0 else 0)
    if g > _ROI_MAX_GRID:
        raise ValueError(f"RoiAlign: a RoI needs {g} samples per bin along an axis (more than {_ROI_MAX_GRID}): "
                         f"sampling_ratio {sampling_ratio}, RoI size {float(size)} for {bins} bins")
    return max(g, 0)


def _roi_align(x, rois, batch_indices, mode, output_height, output_width, sampling_ratio, spatial_scale,
               half_pixel):
    x = np.asarray(x)
    rois = np.asarray(_narrow.widen(np.asarray(rois)))
    batch_indices = np.asarray(batch_indices)
    if x.ndim != 4:
        raise ValueError(f"RoiAlign: X must be (N, C, H, W), got shape {x.shape}")
    if rois.ndim != 2 or rois.shape[1] != 4:
        raise ValueError(f"RoiAlign: rois must be (num_rois, 4), got shape {rois.shape}")
    if batch_indices.ndim != 1 or batch_indices.shape[0] != rois.shape[0]:
        raise ValueError(f"RoiAlign: batch_indices must be (num_rois,) = ({rois.shape[0]},), got shape "
                         f"{batch_indices.shape}")
    if batch_indices.dtype.kind not in "iu":
        raise ValueError(f"RoiAlign: batch_indices must be integers, got {batch_indices.dtype}")
    if mode not in ("avg", "max"):
        raise ValueError(f"RoiAlign: mode must be 'avg' or 'max', got {mode!r}")
    n, c, h, w = x.shape
    oh, ow = int(output_height), int(output_width)
    if oh < 1 or ow < 1:
        raise ValueError(f"RoiAlign: output_height and output_width must be >= 1, got {oh} x {ow}")
    batch_indices = batch_indices.astype(np.int64, copy=False)
    bad = np.flatnonzero((batch_indices < 0) | (batch_indices >= n))
    if bad.size:
        raise ValueError(f"RoiAlign: batch_indices[{bad[0]}] = {batch_indices[bad[0]]} is out of range for "
                         f"X's batch of {n}")
    if rois.shape[0] and (h == 0 or w == 0):
        raise ValueError(f"RoiAlign: X {x.shape} has an empty map to sample")
    if rois.size and not np.isfinite(rois).all():
        r = int(np.flatnonzero(~np.isfinite(rois).all(axis=1))[0])
        raise ValueError(f"RoiAlign: rois[{r}] = {rois[r].tolist()} is not finite (every corner must be)")
    check_alloc((rois.shape[0], c, oh, ow), x.dtype, "RoiAlign output")
    if x.dtype == np.float32 and _native.available and rois.shape[0]:
        y = np.empty((rois.shape[0], c, oh, ow), dtype=np.float32)
        _native.roi_align(np.ascontiguousarray(x), np.ascontiguousarray(rois, dtype=np.float32),
                          np.ascontiguousarray(batch_indices), y, mode, int(sampling_ratio), float(spatial_scale),
                          bool(half_pixel))
        return y
    cdt = np.dtype(np.float64 if x.dtype == np.float64 else np.float32)
    f = cdt.type
    xw = _narrow.widen(x).astype(cdt, copy=False)
    rois = rois.astype(cdt, copy=False)
    out = np.zeros((rois.shape[0], c, oh, ow), dtype=cdt)
    offset = f(0.5) if half_pixel else f(0)
    for r in range(rois.shape[0]):
        b = int(batch_indices[r])
        x1, y1, x2, y2 = rois[r] * f(spatial_scale) - offset  # (onnxruntime's float arithmetic)
        roi_w, roi_h = x2 - x1, y2 - y1
        if not half_pixel:  # legacy behaviour: RoIs are at least one pixel
            roi_w, roi_h = max(roi_w, f(1)), max(roi_h, f(1))
        gh, gw = _roi_grid(roi_h, oh, sampling_ratio), _roi_grid(roi_w, ow, sampling_ratio)
        if gh == 0 or gw == 0:
            continue  # no samples: zeros
        yl, yh, wyl, wyh = _axis_samples(y1, roi_h / f(oh), oh, gh, h, cdt)
        xl, xh, wxl, wxh = _axis_samples(x1, roi_w / f(ow), ow, gw, w, cdt)
        img = xw[b]  # (C, H, W)
        terms = (
            (img[:, yl[:, None], xl[None, :]], np.outer(wyl, wxl)),
            (img[:, yl[:, None], xh[None, :]], np.outer(wyl, wxh)),
            (img[:, yh[:, None], xl[None, :]], np.outer(wyh, wxl)),
            (img[:, yh[:, None], xh[None, :]], np.outer(wyh, wxh)),
        )
        if mode == "avg":
            vals = sum(v * wt for v, wt in terms)  # (C, oh*gh, ow*gw)
            out[r] = vals.reshape(c, oh, gh, ow, gw).sum(axis=(2, 4)) / f(gh * gw)
        else:
            # max of the weighted taps of every sample (onnxruntime's definition), then over the bin
            vals = np.maximum.reduce([v * wt for v, wt in terms])
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
