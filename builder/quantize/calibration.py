"""Calibration data and activation-range collection.

Data (:func:`load_feeds`) may be given as

* an ``.npz`` file holding one set of inputs keyed by input name (arrays keep
  their batch axis; a key that is not an input, e.g. ``label``, is kept aside
  as labels for the accuracy report);
* a folder of such ``.npz`` files (sorted by name);
* a folder of images plus a preprocessing spec (``preprocess.json`` in the
  folder, or passed as ``spec``): ``{"input": "x", "size": [H, W],
  "scale": 0.00392, "mean": [..], "std": [..], "layout": "NCHW",
  "color": "RGB"}`` (needs Pillow, imported only then);
* in the Python API, one feed dict or an iterable of feed dicts.

Ranges (:class:`RangeCollector`) are collected per tensor over every feed:

``minmax``      the smallest and largest value seen;
``percentile``  the ``percentile``-th / ``100 - percentile``-th values of a
                2048-bin histogram over [min, max] (default 99.999), which
                ignores rare outliers;
``entropy``     the threshold minimising the KL divergence between the
                tensor's histogram and its quantized version (TensorRT's
                calibration), on |x| for signed data (128 levels) and x for
                data >= 0 (256 levels, the bin holding the spike of exact
                zeros left out).
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any, Iterable, Mapping

import numpy as np

from minirt.builder.errors import BuildError

METHODS = ("minmax", "percentile", "entropy")
LABEL_KEYS = ("label", "labels", "target", "targets", "y")
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


class Feeds(list):
    """A list of feed dicts; ``labels`` holds one label array per feed (or None)."""

    labels: list

    def __init__(self, feeds=(), labels=None):
        super().__init__(feeds)
        self.labels = list(labels) if labels is not None else [None] * len(self)

    def all_labels(self) -> np.ndarray | None:
        if not self or any(lab is None for lab in self.labels):
            return None
        return np.concatenate([np.asarray(lab).reshape(-1) for lab in self.labels])


def _split_npz(path: str, input_names: list[str]) -> tuple[dict, Any]:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:  # noqa: BLE001 - zipfile/ValueError/OSError
        raise BuildError(f"calibration file {path}: not a readable .npz ({type(exc).__name__}: {exc})") from None
    feed = {k: v for k, v in arrays.items() if k in input_names}
    missing = [n for n in input_names if n not in feed]
    if missing:
        if len(input_names) == 1 and len(arrays) >= 1:
            # One input: accept a single non-label array under any name.
            rest = [k for k in arrays if k.lower() not in LABEL_KEYS]
            if len(rest) == 1:
                feed = {input_names[0]: arrays[rest[0]]}
                missing = []
        if missing:
            raise BuildError(
                f"calibration file {path}: no array for input(s) {missing}; it holds {sorted(arrays)} "
                f"(key each array by the model's input name)"
            )
    label = next((arrays[k] for k in arrays if k.lower() in LABEL_KEYS and k not in input_names), None)
    return feed, label


def _image_feed(folder: str, files: list[str], spec: Mapping, input_names: list[str]) -> Feeds:
    try:
        from PIL import Image  # type: ignore[import-not-found]
    except ImportError:
        raise BuildError("calibration images need Pillow (pip install pillow), or pass .npz files instead") from None
    name = spec.get("input") or (input_names[0] if len(input_names) == 1 else None)
    if name not in input_names:
        raise BuildError(f"preprocessing spec: 'input' must name one of the model's inputs {input_names}")
    size = spec.get("size")
    scale = float(spec.get("scale", 1.0 / 255.0))
    mean = np.asarray(spec.get("mean", 0.0), dtype=np.float32)
    std = np.asarray(spec.get("std", 1.0), dtype=np.float32)
    layout = str(spec.get("layout", "NCHW")).upper()
    color = str(spec.get("color", "RGB")).upper()
    feeds = Feeds()
    for f in files:
        img = Image.open(os.path.join(folder, f)).convert("L" if color in ("L", "GRAY") else "RGB")
        if size:
            img = img.resize((int(size[1]), int(size[0])))
        arr = np.asarray(img, dtype=np.float32)
        if arr.ndim == 2:
            arr = arr[..., None]
        if color == "BGR":
            arr = arr[..., ::-1]
        arr = (arr * scale - mean) / std
        arr = arr.transpose(2, 0, 1) if layout == "NCHW" else arr
        feeds.append({name: np.ascontiguousarray(arr[None], dtype=np.float32)})
        feeds.labels.append(None)
    return feeds


def split_stacked_feeds(feeds: Feeds, batches: Mapping[str, int]) -> Feeds:
    """Feeds whose arrays hold several samples stacked on the batch axis, for a model whose inputs
    declare a fixed batch (``batches``: input name -> that size, e.g. 1), as that many feeds of the
    declared batch: an .npz of 64 images for a batch-1 model is 64 calibration feeds.  A feed whose
    inputs do not all hold the same whole number of declared batches is kept as it is (the shape check
    that follows names what is wrong)."""
    if not batches:
        return feeds
    out = Feeds()
    for feed, label in zip(feeds, feeds.labels):
        counts = {k: (v.shape[0] // batches[k] if v.ndim and v.shape[0] % batches[k] == 0 else 0)
                  for k, v in feed.items() if k in batches}
        n = next(iter(counts.values()), 0)
        if not counts or n <= 1 or any(c != n for c in counts.values()) or len(counts) != len(feed):
            out.append(feed)
            out.labels.append(label)
            continue
        lab = None if label is None else np.asarray(label).reshape(-1)
        for i in range(n):
            out.append({k: v[i * batches[k]:(i + 1) * batches[k]] for k, v in feed.items()})
            out.labels.append(None if lab is None or lab.size != n else lab[i:i + 1])
    return out


def load_feeds(source: Any, input_names: list[str], spec: Mapping | str | None = None) -> Feeds:
    """Calibration/eval data as a list of feed dicts (see the module docstring)."""
    if source is None:
        return Feeds()
    if isinstance(source, Feeds):
        return source
    if isinstance(spec, (str, os.PathLike)):
        with open(spec, encoding="utf-8") as f:
            spec = json.load(f)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isfile(path):
            if not path.endswith(".npz"):
                raise BuildError(f"calibration {path}: expected an .npz file or a folder")
            feed, label = _split_npz(path, input_names)
            return Feeds([feed], [label])
        if not os.path.isdir(path):
            raise BuildError(f"calibration {path}: no such file or folder")
        npz = sorted(glob.glob(os.path.join(path, "*.npz")))
        if npz:
            feeds = Feeds()
            for f in npz:
                feed, label = _split_npz(f, input_names)
                feeds.append(feed)
                feeds.labels.append(label)
            return feeds
        images = sorted(f for f in os.listdir(path) if f.lower().endswith(IMAGE_EXTS))
        if images:
            if spec is None and os.path.isfile(os.path.join(path, "preprocess.json")):
                with open(os.path.join(path, "preprocess.json"), encoding="utf-8") as f:
                    spec = json.load(f)
            if spec is None:
                raise BuildError(
                    f"calibration folder {path} holds images but no preprocessing spec "
                    f"(add preprocess.json: {{\"input\": ..., \"size\": [H, W], \"mean\": .., \"std\": ..}})"
                )
            return _image_feed(path, images, spec, input_names)
        raise BuildError(f"calibration folder {path} holds no .npz files and no images")
    if isinstance(source, Mapping):
        return Feeds([{k: np.asarray(v) for k, v in source.items() if k in input_names}],
                     [next((np.asarray(source[k]) for k in source if k in LABEL_KEYS), None)])
    if isinstance(source, Iterable):
        feeds = Feeds()
        for i, feed in enumerate(source):
            if not isinstance(feed, Mapping):
                raise BuildError(f"calibration item {i}: expected a dict of input arrays, got {type(feed).__name__}")
            feeds.append({k: np.asarray(v) for k, v in feed.items() if k in input_names})
            feeds.labels.append(next((np.asarray(feed[k]) for k in feed if k in LABEL_KEYS), None))
        return feeds
    raise BuildError(f"calibration: cannot read data from {type(source).__name__}")


# --------------------------------------------------------------------------- range collection

_BINS = 2048


def entropy_threshold(hist: np.ndarray, edges: np.ndarray, levels: int = 128) -> float:
    """Threshold (an upper bin edge) minimising KL(P || Q) for a histogram of values >= 0.

    P is the histogram clipped at the candidate threshold (the mass beyond it
    added to the last bin); Q is P merged into ``levels`` quantization bins and
    expanded back over the non-empty bins.  Candidates run from ``levels`` bins
    to all bins (TensorRT's entropy calibration).
    """
    hist = np.asarray(hist, dtype=np.float64)
    n = hist.size
    if n <= levels or hist.sum() == 0:
        return float(edges[-1])
    best_kl, best_i = np.inf, n
    total_tail = np.concatenate([np.cumsum(hist[::-1])[::-1], [0.0]])  # tail[i] = sum(hist[i:])
    step = max(1, (n - levels) // 256)  # at most ~256 candidates
    for i in range(levels, n + 1, step):
        p = hist[:i].copy()
        p[-1] += total_tail[i]
        nonzero = hist[:i] != 0
        # merge i bins into `levels` groups
        idx = (np.arange(i) * levels) // i
        sums = np.bincount(idx, weights=hist[:i], minlength=levels)
        counts = np.bincount(idx, weights=nonzero.astype(np.float64), minlength=levels)
        with np.errstate(invalid="ignore", divide="ignore"):
            avg = np.where(counts > 0, sums / counts, 0.0)
        q = np.where(nonzero, avg[idx], 0.0)
        ps, qs = p.sum(), q.sum()
        if ps == 0 or qs == 0:
            continue
        p /= ps
        q /= qs
        mask = p > 0
        if np.any(q[mask] == 0):
            q = q + 1e-12  # smooth: a bin of P that Q leaves empty
        kl = float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return float(edges[best_i])


class RangeCollector:
    """Per-tensor range statistics over many batches for one calibration method."""

    def __init__(self, method: str = "minmax", percentile: float = 99.999, bins: int = _BINS):
        if method not in METHODS:
            raise BuildError(f"--calibration-method must be one of {list(METHODS)}, got {method!r}")
        self.method = method
        self.percentile = float(percentile)
        self.bins = bins
        self.min: dict[str, float] = {}
        self.max: dict[str, float] = {}
        self.hist: dict[str, np.ndarray] = {}
        self.hist_range: dict[str, tuple] = {}

    @property
    def needs_histograms(self) -> bool:
        return self.method != "minmax"

    def update_minmax(self, name: str, x: np.ndarray) -> None:
        if x.size == 0 or x.dtype.kind != "f":
            return
        lo, hi = float(np.min(x)), float(np.max(x))
        if not (np.isfinite(lo) and np.isfinite(hi)):
            finite = x[np.isfinite(x)]
            if finite.size == 0:
                return
            lo, hi = float(finite.min()), float(finite.max())
        self.min[name] = min(lo, self.min.get(name, lo))
        self.max[name] = max(hi, self.max.get(name, hi))

    def update_channels(self, name: str, x: np.ndarray) -> None:
        """Per-channel (axis 1) min/max, for inputs of depthwise convolutions."""
        if x.ndim < 2 or x.size == 0 or x.dtype.kind != "f":
            return
        axes = (0,) + tuple(range(2, x.ndim))
        lo, hi = np.min(x, axis=axes).astype(np.float64), np.max(x, axis=axes).astype(np.float64)
        key = ("channel", name)
        if key in self.min:
            lo, hi = np.minimum(lo, self.min[key]), np.maximum(hi, self.max[key])
        self.min[key], self.max[key] = lo, hi

    def channel_range(self, name: str):
        key = ("channel", name)
        return (self.min[key], self.max[key]) if key in self.min else None

    def _range_of(self, name: str) -> tuple[float, float]:
        lo, hi = self.min[name], self.max[name]
        if self.method == "entropy":
            # entropy works on |x| (signed) or x (non-negative): one-sided range
            return (0.0, hi) if lo >= 0 else (0.0, max(abs(lo), abs(hi)))
        return lo, hi

    def update_histogram(self, name: str, x: np.ndarray) -> None:
        """Second pass (after every min/max is known): accumulate the histogram."""
        if name not in self.min or x.size == 0:
            return
        lo, hi = self.hist_range.setdefault(name, self._range_of(name))
        if hi <= lo:
            return
        v = np.asarray(x, dtype=np.float32).reshape(-1)
        if self.method == "entropy" and self.min[name] < 0:
            v = np.abs(v)
        h, _ = np.histogram(v, bins=self.bins, range=(lo, hi))
        if name in self.hist:
            self.hist[name] += h
        else:
            self.hist[name] = h.astype(np.int64)

    def update(self, name: str, x: np.ndarray) -> None:
        """One-pass update for minmax (histogram methods need :meth:`update_histogram` afterwards)."""
        self.update_minmax(name, x)

    def range(self, name: str, signed_levels: bool = False) -> tuple[float, float] | None:
        """The calibrated (lo, hi) of ``name``; None if it was never seen."""
        if name not in self.min:
            return None
        lo, hi = self.min[name], self.max[name]
        if self.method == "minmax" or name not in self.hist:
            return lo, hi
        hist = self.hist[name]
        hlo, hhi = self.hist_range[name]
        edges = np.linspace(hlo, hhi, hist.size + 1)
        if self.method == "percentile":
            cdf = np.cumsum(hist) / max(1, hist.sum())
            p = self.percentile / 100.0
            up = edges[min(hist.size, int(np.searchsorted(cdf, p, side="left")) + 1)]
            down = edges[int(np.searchsorted(cdf, 1.0 - p, side="left"))]
            return float(min(lo, 0.0) if lo >= 0 else down), float(up)
        # entropy: symmetric threshold for signed data, [0, T] for non-negative data
        levels = 128 if (lo < 0 or signed_levels) else 256
        if lo >= 0:
            # Non-negative data (after ReLU) piles up at exactly 0, which every
            # threshold represents exactly; left in, that spike drags the
            # threshold far down.  The first bin is set aside.
            hist = hist.copy()
            hist[0] = 0
        t = entropy_threshold(hist, edges, levels=levels)
        return (-t, t) if lo < 0 else (0.0, t)
