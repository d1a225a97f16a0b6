"""More pooling kernels: LpPool, GlobalLpPool and MaxUnpool.

LpPool reuses the sliding-window geometry of :mod:`minirt.kernels.nn`
(``auto_pad``, pads, strides, dilations, ``ceil_mode``): the padded input is
read once per kernel tap through strided slices and ``|x|**p`` is accumulated,
so the cost is one vectorised pass per tap.  Registered with
:func:`kernel_if_absent` in case ``nn`` grows its own versions.
"""
from __future__ import annotations

import math

import numpy as np

from minirt.kernels import _narrow
from minirt.kernels.registry import kernel
from minirt.kernels._limits import check_alloc
from minirt.kernels.nn import _check_rank, _geometry, _pad_for_windows, _per_axis, _tap_slices


def _pow_sum_root(acc: np.ndarray, p: float) -> np.ndarray:
    if p == 1:
        return acc
    if p == 2:
        return np.sqrt(acc)
    return np.power(acc, 1.0 / p)


def _abs_pow(v: np.ndarray, p: float) -> np.ndarray:
    a = np.abs(v)
    return a if p == 1 else (a * a if p == 2 else np.power(a, p))


def _lp_pool(x, p, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides):
    nd = _check_rank("LpPool", x)
    if not kernel_shape:
        raise ValueError("LpPool: kernel_shape attribute is required")
    xw = _narrow.widen(x)
    if xw.dtype.kind != "f":
        raise ValueError(f"LpPool: unsupported dtype {x.dtype}")
    p = float(p)
    if p <= 0:
        raise ValueError(f"LpPool: p must be positive, got {p}")
    k = _per_axis("LpPool", "kernel_shape", kernel_shape, nd, 1)
    s = _per_axis("LpPool", "strides", strides, nd, 1)
    d = _per_axis("LpPool", "dilations", dilations, nd, 1)
    out, pb, _ = _geometry("LpPool", xw.shape[2:], k, s, d, pads, auto_pad, ceil_mode,
                           planes=(xw.shape[0] * xw.shape[1],) * 2, dtype=xw.dtype)
    cdt = np.float64 if xw.dtype == np.float64 else np.float32
    xp = _pad_for_windows(xw.astype(cdt, copy=False), out, k, s, d, pb, 0)  # padding contributes 0
    acc = None
    for sl in _tap_slices(k, s, d, out):
        term = _abs_pow(xp[sl], p)
        acc = term.copy() if acc is None else acc + term
    return _pow_sum_root(acc, p).astype(x.dtype)


@kernel("LpPool", since=1)
def lp_pool_1(x, /, *, auto_pad="NOTSET", kernel_shape=(), p=2.0, pads=(), strides=()):
    return _lp_pool(x, p, auto_pad, 0, (), kernel_shape, pads, strides)


@kernel("LpPool", since=2)
def lp_pool_2(x, /, *, auto_pad="NOTSET", kernel_shape=(), p=2, pads=(), strides=()):
    return _lp_pool(x, p, auto_pad, 0, (), kernel_shape, pads, strides)


@kernel("LpPool", since=11)
def lp_pool_11(x, /, *, auto_pad="NOTSET", kernel_shape=(), p=2, pads=(), strides=()):
    return _lp_pool(x, p, auto_pad, 0, (), kernel_shape, pads, strides)


@kernel("LpPool", since=18)
def lp_pool_18(x, /, *, auto_pad="NOTSET", ceil_mode=0, dilations=(), kernel_shape=(), p=2, pads=(), strides=()):
    return _lp_pool(x, p, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides)


@kernel("LpPool", since=22)
def lp_pool_22(x, /, *, auto_pad="NOTSET", ceil_mode=0, dilations=(), kernel_shape=(), p=2, pads=(), strides=()):
    return _lp_pool(x, p, auto_pad, ceil_mode, dilations, kernel_shape, pads, strides)


def _global_lp_pool(x, p):
    nd = _check_rank("GlobalLpPool", x)
    xw = _narrow.widen(x)
    if xw.dtype.kind != "f":
        raise ValueError(f"GlobalLpPool: unsupported dtype {x.dtype}")
    cdt = np.float64 if xw.dtype == np.float64 else np.float32
    acc = _abs_pow(xw.astype(cdt, copy=False), float(p)).sum(axis=tuple(range(2, 2 + nd)), keepdims=True)
    return _pow_sum_root(acc, float(p)).astype(x.dtype)


@kernel("GlobalLpPool", since=1)
def global_lp_pool_1(x, /, *, p=2.0):
    return _global_lp_pool(x, p)


@kernel("GlobalLpPool", since=2)
def global_lp_pool_2(x, /, *, p=2):
    return _global_lp_pool(x, p)


@kernel("GlobalLpPool", since=22)
def global_lp_pool_22(x, /, *, p=2):
    return _global_lp_pool(x, p)


# --------------------------------------------------------------------------- MaxUnpool


def _max_unpool(x, indices, output_shape, kernel_shape, pads, strides):
    nd = _check_rank("MaxUnpool", x)
    if not kernel_shape:
        raise ValueError("MaxUnpool: kernel_shape attribute is required")
    if np.shape(indices) != x.shape:
        raise ValueError(f"MaxUnpool: I shape {np.shape(indices)} must equal X shape {x.shape}")
    k = _per_axis("MaxUnpool", "kernel_shape", kernel_shape, nd, 1)
    s = _per_axis("MaxUnpool", "strides", strides, nd, 1)
    pads = tuple(int(v) for v in pads) if pads else (0,) * (2 * nd)
    if len(pads) != 2 * nd:
        raise ValueError(f"MaxUnpool: pads has {len(pads)} values, expected {2 * nd}")
    # the shape MaxPool was run on (the inverse of its output-size formula)
    inferred = [(i - 1) * si + ki - pads[a] - pads[a + nd]
                for a, (i, si, ki) in enumerate(zip(x.shape[2:], s, k))]
    shape = list(x.shape[:2]) + inferred
    if output_shape is not None:
        req = [int(v) for v in np.asarray(output_shape).reshape(-1)]
        if len(req) != x.ndim:
            raise ValueError(f"MaxUnpool: output_shape {req} must have rank {x.ndim}")
        if req[:2] != list(x.shape[:2]) or any(r < i for r, i in zip(req[2:], inferred)):
            raise ValueError(f"MaxUnpool: output_shape {req} is smaller than the unpooled shape {shape}")
        shape = req
    # MaxPool indices are row-major offsets into the whole (N, C, ...) tensor it
    # pooled, i.e. the unpooled shape; a larger output_shape pads at the end of
    # each spatial axis and keeps every value at its (n, c, i, j, ...) position.
    pooled_shape = list(x.shape[:2]) + inferred
    total = math.prod(pooled_shape)
    idx = np.asarray(indices).astype(np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= total):
        raise ValueError(f"MaxUnpool: indices must be in [0, {total}) for the unpooled shape {pooled_shape}")
    if shape != pooled_shape:
        idx = np.ravel_multi_index(np.unravel_index(idx, pooled_shape), shape)
    check_alloc(shape, x.dtype, "MaxUnpool output")
    y = np.zeros(math.prod(shape), dtype=x.dtype)
    y[idx] = x.reshape(-1)
    return y.reshape(shape)


@kernel("MaxUnpool", since=9)
def max_unpool_9(x, indices, output_shape=None, /, *, kernel_shape=(), pads=(), strides=()):
    return _max_unpool(x, indices, output_shape, kernel_shape, pads, strides)


@kernel("MaxUnpool", since=11)
def max_unpool_11(x, indices, output_shape=None, /, *, kernel_shape=(), pads=(), strides=()):
    return _max_unpool(x, indices, output_shape, kernel_shape, pads, strides)


@kernel("MaxUnpool", since=22)
def max_unpool_22(x, indices, output_shape=None, /, *, kernel_shape=(), pads=(), strides=()):
    return _max_unpool(x, indices, output_shape, kernel_shape, pads, strides)
