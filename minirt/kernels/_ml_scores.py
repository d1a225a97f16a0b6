"""Score arithmetic shared by the ``ai.onnx.ml`` classifiers and regressors, as onnxruntime does it.

Not a kernel family (no kernels register here): minirt/kernels/ml.py and minirt/kernels/trees.py
import it.  Every function works on a batch: ``scores`` is [N, K] and each row is one sample.

onnxruntime's choices that these functions reproduce, because a converted model's probabilities are
compared with onnxruntime's to 1e-5:

* the post transforms are computed in float32, whatever the accumulation type was;
* PROBIT is not the exact inverse normal CDF but ``sqrt(2) * erfinv(2p - 1)`` with erfinv replaced
  by the closed-form approximation with a = 0.147 (Winitzki), in float32: its error (~1e-3) is part
  of the result onnxruntime returns, so the exact function would not match;
* LOGISTIC is ``1 / (1 + exp(-|v|))``, mirrored for negative v (no overflow for large |v|);
* SOFTMAX_ZERO leaves (near-)zero scores out of the exponentials: |v| <= 1e-7 counts as zero;
* a row of ONE score (binary models that store only the positive class) is expanded to two
  columns in one of four ways (``add_second_class``) and, except for PROBIT, is not transformed
  by LOGISTIC/SOFTMAX at all: see :func:`finalize_scores`.
"""
from __future__ import annotations

import numpy as np

# post_transform codes: the ONNX attribute's strings in the order TreeEnsemble (v5) numbers them
NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT = range(5)
POST_TRANSFORMS = {"NONE": NONE, "SOFTMAX": SOFTMAX, "LOGISTIC": LOGISTIC, "SOFTMAX_ZERO": SOFTMAX_ZERO,
                   "PROBIT": PROBIT}

# How a single score s becomes two columns (onnxruntime's "add_second_class" / "write_additional_scores"):
KEEP_ONE = -1  # no second column
COMPLEMENT = 0  # [1 - s, s]: all weights positive, s is a probability (0 and 1 behave the same)
COMPLEMENT_NEG = 1
MIRROR_POS = 2  # [-s, s], or [logistic(-s), logistic(s)] under LOGISTIC: mixed-sign weights (2 and 3 alike)
MIRROR_NEG = 3

_F32 = np.float32


def post_transform_code(op: str, value) -> int:
    """The post_transform attribute (a string for the opset-1..3 ops, an int for TreeEnsemble v5) as a code."""
    if isinstance(value, (int, np.integer)):
        code = int(value)
        if not 0 <= code <= 4:
            raise ValueError(f"{op}: post_transform must be in 0..4, got {code}")
        return code
    text = value.decode() if isinstance(value, bytes) else str(value)
    if text not in POST_TRANSFORMS:
        raise ValueError(f"{op}: post_transform must be one of {sorted(POST_TRANSFORMS)}, got {text!r}")
    return POST_TRANSFORMS[text]


def logistic(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=_F32)
    with np.errstate(over="ignore"):
        u = _F32(1) / (_F32(1) + np.exp(-np.abs(v)))
    return np.where(v < 0, _F32(1) - u, u).astype(_F32)


def probit(v: np.ndarray) -> np.ndarray:
    """sqrt(2) * erfinv(2v - 1) with onnxruntime's float32 erfinv approximation (see the module docstring)."""
    y = _F32(2) * np.asarray(v, dtype=_F32) - _F32(1)
    sign = np.where(y < 0, _F32(-1), _F32(1))
    with np.errstate(divide="ignore", invalid="ignore"):
        ln = np.log((_F32(1) - y) * (_F32(1) + y))
        a = _F32(2) / (_F32(3.14159) * _F32(0.147)) + _F32(0.5) * ln
        b = _F32(1) / _F32(0.147) * ln
        c = -a + np.sqrt(a * a - b)
        return (_F32(np.sqrt(2)) * sign * np.sqrt(c)).astype(_F32)


def softmax(scores: np.ndarray) -> np.ndarray:
    s = np.asarray(scores, dtype=_F32)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(_F32)


def softmax_zero(scores: np.ndarray) -> np.ndarray:
    """Softmax over the non-zero scores; a zero score stays (about) zero instead of taking exp(0)."""
    s = np.asarray(scores, dtype=_F32)
    vmax = s.max(axis=1, keepdims=True)
    nonzero = np.abs(s) > _F32(1e-7)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        e = np.where(nonzero, np.exp(s - vmax), s * np.exp(-vmax))
        total = np.where(nonzero, e, _F32(0)).sum(axis=1, keepdims=True)
        return (e / total).astype(_F32)


def transform(scores: np.ndarray, post: int) -> np.ndarray:
    """``post`` applied to every row of [N, K] scores (K >= 2), in float32."""
    if post == NONE:
        return np.asarray(scores, dtype=_F32)
    if post == SOFTMAX:
        return softmax(scores)
    if post == LOGISTIC:
        return logistic(scores)
    if post == SOFTMAX_ZERO:
        return softmax_zero(scores)
    return probit(scores)


def finalize_scores(scores: np.ndarray, post: int, add_second_class=KEEP_ONE) -> np.ndarray:
    """The scores output of an ml classifier/regressor from its raw [N, K] scores.

    K >= 2: ``post`` on every row.  K == 1: PROBIT transforms the score; otherwise
    ``add_second_class`` (a scalar or one code per row) decides the second column and no other
    transform applies (onnxruntime's rule, kept although LOGISTIC is then silently ignored)."""
    scores = np.asarray(scores)
    if scores.shape[1] != 1:
        return transform(scores, post)
    s = scores[:, 0].astype(_F32)
    if post == PROBIT:
        return probit(s)[:, None]
    asc = np.broadcast_to(np.asarray(add_second_class), s.shape)
    if (asc == KEEP_ONE).all():
        return s[:, None]
    complement = np.stack([_F32(1) - s, s], axis=1)
    if post == LOGISTIC:
        mirror = np.stack([logistic(-s), logistic(s)], axis=1)
    else:
        mirror = np.stack([-s, s], axis=1)
    out = np.where((asc >= MIRROR_POS)[:, None], mirror, complement).astype(_F32)
    # rows that keep one score (mixed codes only happen for tree classifiers): the score, then 0
    keep = asc == KEEP_ONE
    if keep.any():
        out[keep] = np.stack([s[keep], np.zeros_like(s[keep])], axis=1)
    return out


def labels_array(labels, picks: np.ndarray) -> np.ndarray:
    """``labels[picks]`` as an int64 tensor, or an object tensor of str for string labels."""
    if len(labels) and isinstance(labels[0], str):
        table = np.empty(len(labels), dtype=object)
        table[:] = list(labels)
        return table[picks]
    return np.asarray(labels, dtype=np.int64)[picks]


def as_float_rows(op: str, x, dtype=np.float32) -> np.ndarray:
    """The input X of a classifier/regressor as [N, C] of ``dtype`` (None: X's own type); a 1-D X is
    one sample, as onnxruntime reads it."""
    x = np.asarray(x)
    if x.dtype.kind not in "fiub":
        raise ValueError(f"{op}: X must be a numeric tensor (float, double, int32 or int64), got {x.dtype}")
    if x.ndim == 0 or x.ndim > 2:
        raise ValueError(f"{op}: X must be [N, C] or [C], got shape {list(x.shape)}")
    x = x.reshape(1, -1) if x.ndim == 1 else x
    return x if dtype is None else x.astype(dtype, copy=False)
