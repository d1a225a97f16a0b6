"""Random-sampling kernels: RandomUniform(Like), RandomNormal(Like), Bernoulli, Multinomial.

With a ``seed`` attribute every run of the node draws the same values
(numpy's PCG64 generator seeded with it); without one each run draws fresh
values.  Outputs are not comparable with other runtimes' random streams, only
their distributions are.
"""
from __future__ import annotations

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY
from minirt.kernels import _narrow
from minirt.kernels.registry import kernel


def _rng(seed) -> np.random.Generator:
    return np.random.default_rng(None if seed is None else int(np.float32(seed).view(np.uint32)))


def _dtype(code, default: np.dtype, op: str) -> np.dtype:
    if code is None:
        return np.dtype(default)
    dt = ONNX_TO_NUMPY.get(int(code))
    if dt is None:
        raise ValueError(f"{op}: unsupported dtype {code}")
    return dt


def _shape(shape, op: str) -> tuple:
    if shape is None:
        raise ValueError(f"{op}: the shape attribute is required")
    return tuple(int(s) for s in shape)


def _cast(values: np.ndarray, dt: np.dtype) -> np.ndarray:
    return _narrow.cast(values, dt) if _narrow.is_narrow_float(dt) else values.astype(dt)


def _uniform(shape, dt, low, high, seed):
    return _cast(_rng(seed).uniform(low, high, size=shape), dt)


def _normal(shape, dt, mean, scale, seed):
    return _cast(_rng(seed).normal(mean, scale, size=shape), dt)


def _register(op, versions, fn):
    for v in versions:
        kernel(op, since=v)(fn)


def random_uniform(*, dtype=1, high=1.0, low=0.0, seed=None, shape=None):
    return _uniform(_shape(shape, "RandomUniform"), _dtype(dtype, np.float32, "RandomUniform"), low, high, seed)


def random_normal(*, dtype=1, mean=0.0, scale=1.0, seed=None, shape=None):
    return _normal(_shape(shape, "RandomNormal"), _dtype(dtype, np.float32, "RandomNormal"), mean, scale, seed)


def random_uniform_like(x, /, *, dtype=None, high=1.0, low=0.0, seed=None):
    return _uniform(np.shape(x), _dtype(dtype, np.asarray(x).dtype, "RandomUniformLike"), low, high, seed)


def random_normal_like(x, /, *, dtype=None, mean=0.0, scale=1.0, seed=None):
    return _normal(np.shape(x), _dtype(dtype, np.asarray(x).dtype, "RandomNormalLike"), mean, scale, seed)


def bernoulli(x, /, *, dtype=None, seed=None):
    """1 with probability x (elementwise), else 0."""
    p = _narrow.widen(np.asarray(x)).astype(np.float64)
    draw = _rng(seed).random(p.shape) < p
    return _cast(draw.astype(np.float64), _dtype(dtype, np.asarray(x).dtype, "Bernoulli"))


def multinomial(x, /, *, dtype=6, sample_size=1, seed=None):
    """``sample_size`` class indices per batch row, drawn from softmax(x) (x holds unnormalised log-probabilities)."""
    logits = _narrow.widen(np.asarray(x)).astype(np.float64)
    if logits.ndim != 2:
        raise ValueError(f"Multinomial: input must be [batch_size, class_size], got shape {logits.shape}")
    out_dt = _dtype(dtype, np.int32, "Multinomial")
    if out_dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ValueError(f"Multinomial: dtype must be int32 or int64, got {out_dt}")
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    cdf = np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1)
    u = _rng(seed).random((logits.shape[0], int(sample_size)))
    idx = (u[:, :, None] >= cdf[:, None, :]).sum(axis=2)  # inverse-CDF sampling, vectorised
    return np.minimum(idx, logits.shape[1] - 1).astype(out_dt)


_register("RandomUniform", (1, 22), random_uniform)
_register("RandomNormal", (1, 22), random_normal)
_register("RandomUniformLike", (1, 22), random_uniform_like)
_register("RandomNormalLike", (1, 22), random_normal_like)
_register("Bernoulli", (15, 22), bernoulli)
_register("Multinomial", (7, 22), multinomial)
