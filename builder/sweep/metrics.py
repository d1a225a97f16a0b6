"""The evaluation metrics of a sweep, computed shard by shard and merged exactly.

The built-in metrics are those of the quantizer's accuracy report and budgets (``--eval``,
``--accuracy-budget``: builder/quantize/report.py, sensitivity.py), with the same meanings:

    accuracy         top-1 accuracy against the labels (``label`` in the eval data), 0-1     higher is better
    top1-agreement   top-1 agreement with the float model (no labels needed), 0-1           higher is better
    cosine           smallest cosine similarity to the float model's outputs                higher is better
    max-abs          largest absolute difference from the float model, over the outputs     lower is better
    mean-abs         largest mean absolute difference over the outputs                      lower is better
    accuracy-drop    accuracy points lost against the float model (labels)                  lower is better
    top1-drop        as the budget: accuracy-drop with labels, else 100 * (1 - agreement)   lower is better

"The float model" is the model built float32 (generic target, opt-level 2, the candidate's input
shapes) and run by minirt on the same shard.  A user metric ``module:function`` is called per shard
as ``function(outputs, data)`` -> float: ``outputs`` maps output names to the candidate's outputs
over the shard (stacked on axis 0), ``data`` the shard's arrays (inputs and labels).  It must be a
*mean over the shard's samples* (e.g. a fraction correct): shards are merged weighted by their sample
counts, so the result does not depend on how the set was sharded.

Each shard yields sufficient statistics (sums, counts, maxima: :func:`shard_stats`), so merging
shards (:func:`merge`) gives the value the whole set would give in one piece.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

LABEL_KEYS = ("label", "labels", "target", "targets", "y")  # (builder/quantize/calibration.py's names)


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool
    needs_labels: bool = False
    needs_reference: bool = False
    user: Callable | None = None  # module:function metrics
    user_name: str = ""  # "module:function"

    @property
    def label(self) -> str:
        return self.user_name or self.name


BUILTIN: dict[str, Metric] = {m.name: m for m in (
    Metric("accuracy", True, needs_labels=True),
    Metric("top1-agreement", True, needs_reference=True),
    Metric("cosine", True, needs_reference=True),
    Metric("max-abs", False, needs_reference=True),
    Metric("mean-abs", False, needs_reference=True),
    Metric("accuracy-drop", False, needs_labels=True, needs_reference=True),
    Metric("top1-drop", False, needs_reference=True),
)}


def split_labels(data: dict[str, np.ndarray], input_names: list[str]) -> tuple[dict, np.ndarray | None]:
    """A shard's arrays -> (feeds keyed by input name, labels or None)."""
    feeds = {k: v for k, v in data.items() if k in input_names}
    label = next((np.asarray(data[k]) for k in data if k.lower() in LABEL_KEYS and k not in input_names), None)
    return feeds, label


def _scores(y: np.ndarray) -> bool:
    return y.dtype.kind == "f" and y.ndim == 2 and y.shape[1] >= 2


def shard_stats(metric: Metric, outputs: dict[str, np.ndarray], data: dict[str, np.ndarray],
                reference: dict[str, np.ndarray] | None, labels: np.ndarray | None, output: str | None) -> dict:
    """The sufficient statistics of one shard for ``metric``: ``{"n": samples, ...}``."""
    names = list(outputs)
    chosen = output or names[0]
    n = int(next(iter(data.values())).shape[0]) if data else 0
    stats: dict[str, Any] = {"n": n}
    if metric.user is not None:
        value = metric.user(outputs, data)
        try:
            stats["user_sum"] = float(value) * n
        except (TypeError, ValueError):
            raise ValueError(f"metric {metric.user_name} returned {value!r}, not a number") from None
        return stats
    y = np.asarray(outputs[chosen])
    if metric.name in ("accuracy", "accuracy-drop", "top1-drop", "top1-agreement"):
        if not _scores(y):
            raise ValueError(f"metric {metric.name}: output {chosen!r} has shape {list(y.shape)} and dtype {y.dtype}, "
                             "not class scores [N, C]; choose another output (output = ...) or metric")
        pred = y.argmax(axis=1)
        if labels is not None:
            lab = np.asarray(labels).reshape(-1)
            if lab.shape[0] != pred.shape[0]:
                raise ValueError(f"metric {metric.name}: {lab.shape[0]} labels for {pred.shape[0]} outputs in a shard")
            stats["correct"] = int((pred == lab).sum())
        if reference is not None:
            rpred = np.asarray(reference[chosen]).argmax(axis=1)
            stats["agree"] = int((pred == rpred).sum())
            if labels is not None:
                stats["ref_correct"] = int((rpred == np.asarray(labels).reshape(-1)).sum())
        stats["rows"] = int(pred.shape[0])
        return stats
    # cosine / max-abs / mean-abs: per output, over every element (as builder/quantize/report.py's compare)
    per = {}
    for name in names:
        a = np.asarray(reference[name], dtype=np.float64).reshape(-1)
        b = np.asarray(outputs[name], dtype=np.float64).reshape(-1)
        if a.shape != b.shape:
            raise ValueError(f"output {name!r}: {b.size} values, the float model gives {a.size}")
        diff = np.abs(a - b)
        finite = np.isfinite(diff)
        per[name] = {"dot": float(a @ b), "aa": float(a @ a), "bb": float(b @ b),
                     "max_abs": float(diff[finite].max()) if finite.any() else float("inf"),
                     "sum_abs": float(diff[finite].sum()) if finite.any() else float("inf"),
                     "elements": int(a.size)}
    stats["outputs"] = per
    return stats


def merge(metric: Metric, shards: list[dict]) -> float:
    """The metric over the whole set from its shards' statistics."""
    n = sum(s["n"] for s in shards)
    if metric.user is not None or metric.user_name:
        return sum(s["user_sum"] for s in shards) / n if n else float("nan")
    if metric.name in ("accuracy", "accuracy-drop", "top1-drop", "top1-agreement"):
        rows = sum(s["rows"] for s in shards)
        acc = sum(s.get("correct", 0) for s in shards) / rows
        if metric.name == "accuracy":
            return acc
        agree = sum(s["agree"] for s in shards) / rows
        if metric.name == "top1-agreement":
            return agree
        if all("correct" in s for s in shards):  # (with labels: points of accuracy lost, as the budget)
            return 100.0 * (sum(s["ref_correct"] for s in shards) / rows - acc)
        if metric.name == "accuracy-drop":
            raise ValueError("metric accuracy-drop needs labels in the evaluation data (key 'label')")
        return 100.0 * (1.0 - agree)
    totals: dict[str, dict] = {}
    for s in shards:
        for name, o in s["outputs"].items():
            t = totals.setdefault(name, {"dot": 0.0, "aa": 0.0, "bb": 0.0, "max_abs": 0.0, "sum_abs": 0.0, "elements": 0})
            for k in ("dot", "aa", "bb", "sum_abs", "elements"):
                t[k] += o[k]
            t["max_abs"] = max(t["max_abs"], o["max_abs"])
    if metric.name == "cosine":
        def cos(t):
            na, nb = np.sqrt(t["aa"]), np.sqrt(t["bb"])
            return float(t["dot"] / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
        return min(cos(t) for t in totals.values())
    if metric.name == "max-abs":
        return max(t["max_abs"] for t in totals.values())
    return max(t["sum_abs"] / t["elements"] for t in totals.values() if t["elements"])
