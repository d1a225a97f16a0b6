"""Loss operators: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.

(Inference models exported from training frameworks sometimes keep these.)
"""
from __future__ import annotations

import numpy as np

from minirt.kernels.registry import kernel


def _nll(log_prob: np.ndarray, target: np.ndarray, weight, reduction: str, ignore_index):
    target = np.asarray(target).astype(np.int64)
    c = log_prob.shape[1]
    if ignore_index is not None:
        keep = target != ignore_index
    else:
        keep = np.ones(target.shape, dtype=bool)
    safe = np.where(keep, target, 0)
    if np.any((safe < 0) | (safe >= c)):
        raise ValueError(f"target index out of range [0, {c})")
    picked = np.take_along_axis(log_prob, np.expand_dims(safe, 1), axis=1).squeeze(1)
    w = np.ones(target.shape, log_prob.dtype) if weight is None else np.asarray(weight)[safe].astype(log_prob.dtype)
    w = np.where(keep, w, 0).astype(log_prob.dtype)
    loss = (-picked * w).astype(log_prob.dtype)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.array(loss.sum(), dtype=log_prob.dtype)
    if reduction == "mean":
        denom = w.sum()
        return np.array(loss.sum() / denom if denom != 0 else loss.sum() * 0, dtype=log_prob.dtype)
    raise ValueError(f"unknown reduction {reduction!r}")


@kernel("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(input, target, weight=None, *, ignore_index=None, reduction="mean"):  # noqa: A002
    return _nll(np.asarray(input), target, weight, reduction, ignore_index)


@kernel("SoftmaxCrossEntropyLoss", since=12, context=True)
def softmax_cross_entropy_loss(scores, labels, weights=None, *, ignore_index=None, reduction="mean", ctx=None):
    x = np.asarray(scores)
    m = np.max(x, axis=1, keepdims=True)
    shifted = x - m
    log_prob = (shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))).astype(x.dtype)
    loss = _nll(log_prob, labels, weights, reduction, ignore_index)
    return (loss, log_prob)[: ctx.n_outputs]
