"""Assorted tensor operators the other families do not cover.

Compress, Unique, ReverseSequence, Det, CumProd, BitCast, TensorScatter,
Scatter (opset 9), CenterCropPad, Col2Im, Swish, SwiGLU, GroupNormalization,
MeanVarianceNormalization.
"""
from __future__ import annotations

import itertools

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY
from minirt.kernels._limits import check_alloc
from minirt.kernels.registry import kernel, lookup


@kernel("Compress", since=9)
def compress(input, condition, *, axis=None):  # noqa: A002
    cond = np.asarray(condition).astype(bool).reshape(-1)
    if axis is None:
        return np.compress(cond, np.asarray(input).reshape(-1))
    return np.compress(cond, input, axis=axis)


@kernel("Unique", since=11)
def unique(X, *, axis=None, sorted=1):  # noqa: A002
    x = np.asarray(X)
    if axis is None:
        y, idx, inv, cnt = np.unique(x.reshape(-1), return_index=True, return_inverse=True, return_counts=True)
    else:
        y, idx, inv, cnt = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    inv = inv.reshape(-1)
    if not sorted:
        order = np.argsort(idx, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=0 if axis is None else axis)
        idx, cnt, inv = idx[order], cnt[order], rank[inv]
    i64 = np.int64
    return y, idx.astype(i64), inv.astype(i64), cnt.astype(i64)


@kernel("ReverseSequence", since=10)
def reverse_sequence(input, sequence_lens, *, batch_axis=1, time_axis=0):  # noqa: A002
    y = np.array(input, copy=True)
    x = np.asarray(input)
    for b, n in enumerate(np.asarray(sequence_lens).astype(np.int64)):
        n = int(n)
        src = [slice(None)] * x.ndim
        src[batch_axis] = b
        src[time_axis] = slice(0, n)
        dst = list(src)
        dst[time_axis] = slice(n - 1, None, -1) if n > 0 else slice(0, 0)
        y[tuple(src)] = x[tuple(dst)]
    return y


@kernel("Det", since=11)
def det(X):
    return np.linalg.det(X).astype(X.dtype)


@kernel("CumProd", since=26)
def cum_prod(x, axis, *, exclusive=0, reverse=0):
    ax = int(np.asarray(axis).reshape(-1)[0])
    ax = ax + x.ndim if ax < 0 else ax
    v = np.flip(x, ax) if reverse else x
    out = np.cumprod(v, axis=ax, dtype=x.dtype)
    if exclusive:
        ones = np.ones_like(np.take(out, [0], axis=ax))
        out = np.concatenate([ones, np.take(out, np.arange(out.shape[ax] - 1), axis=ax)], axis=ax)
    return np.flip(out, ax) if reverse else out


@kernel("BitCast", since=26)
def bit_cast(input, *, to=None):  # noqa: A002
    dt = ONNX_TO_NUMPY.get(int(to))
    if dt is None or dt == object:
        raise ValueError(f"BitCast: target type {to} is not supported")
    x = np.array(input, order="C", copy=True)
    if x.dtype.itemsize != dt.itemsize:
        raise ValueError(f"BitCast: {x.dtype} and {dt} differ in width")
    return x.view(dt).reshape(x.shape)


@kernel("TensorScatter", since=24)
def tensor_scatter(past_cache, update, write_indices=None, *, axis=-2, mode="linear"):
    present = np.array(past_cache, copy=True)
    ax = axis + present.ndim if axis < 0 else axis
    max_len, seq = present.shape[ax], update.shape[ax]
    for b in range(present.shape[0]):
        start = 0 if write_indices is None else int(write_indices[b])
        idx = start + np.arange(seq)
        if mode == "circular":
            idx = idx % max_len
        dst = np.moveaxis(present[b], ax - 1, 0)
        dst[idx] = np.moveaxis(update[b], ax - 1, 0)
    return present


@kernel("Scatter", since=9)
def scatter(data, indices, updates, *, axis=0):
    entry = lookup("", "ScatterElements", 11)
    return entry.fn(data, indices, updates, axis=axis)


@kernel("CenterCropPad", since=18)
def center_crop_pad(input_data, shape, *, axes=None):
    x = np.asarray(input_data)
    shape = np.asarray(shape).astype(np.int64).reshape(-1)
    axes = list(range(x.ndim)) if axes is None else [a + x.ndim if a < 0 else a for a in axes]
    for ax, size in zip(axes, shape):
        size = int(size)
        cur = x.shape[ax]
        if cur > size:
            start = (cur - size) // 2
            x = np.take(x, np.arange(start, start + size), axis=ax)
        elif cur < size:
            before = (size - cur) // 2
            pad = [(0, 0)] * x.ndim
            pad[ax] = (before, size - cur - before)
            check_alloc(x.shape[:ax] + (size,) + x.shape[ax + 1 :], x.dtype, "CenterCropPad output")
            x = np.pad(x, pad)
    return x


@kernel("Col2Im", since=18)
def col2im(input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):  # noqa: A002
    x = np.asarray(input)
    img = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    blk = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    nd = len(img)
    dil = list(dilations) if dilations else [1] * nd
    st = list(strides) if strides else [1] * nd
    pd = list(pads) if pads else [0] * (2 * nd)
    n = x.shape[0]
    c = x.shape[1] // int(np.prod(blk))
    padded = [img[i] + pd[i] + pd[i + nd] for i in range(nd)]
    outs = [(padded[i] - (dil[i] * (blk[i] - 1) + 1)) // st[i] + 1 for i in range(nd)]
    cols = x.reshape([n, c] + blk + outs)
    check_alloc([n, c] + padded, x.dtype, "Col2Im output")
    buf = np.zeros([n, c] + padded, dtype=x.dtype)
    for k in itertools.product(*[range(b) for b in blk]):
        sl = tuple(slice(k[i] * dil[i], k[i] * dil[i] + st[i] * (outs[i] - 1) + 1, st[i]) for i in range(nd))
        buf[(slice(None), slice(None)) + sl] += cols[(slice(None), slice(None)) + k]
    crop = tuple(slice(pd[i], pd[i] + img[i]) for i in range(nd))
    return buf[(slice(None), slice(None)) + crop]


def _swish(x, alpha):
    return x / (1 + np.exp(-x * x.dtype.type(alpha)))


@kernel("Swish", since=24)
def swish(X, *, alpha=1.0):
    return _swish(X, alpha).astype(X.dtype)


@kernel("SwiGLU", since=28)
def swiglu(A, B, *, alpha=1.0):
    return (_swish(A, alpha) * B).astype(A.dtype)


def _group_norm(X, scale, bias, epsilon, num_groups, stash_type, per_group: bool):
    n, c = X.shape[:2]
    ct = ONNX_TO_NUMPY.get(int(stash_type), np.dtype(np.float32))
    x = X.astype(ct).reshape(n, num_groups, -1)
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    y = ((x - mean) / np.sqrt(var + ct.type(epsilon))).reshape(X.shape)
    bshape = (1, c) + (1,) * (X.ndim - 2)
    if per_group:
        s = np.repeat(np.asarray(scale), c // num_groups)
        b = np.repeat(np.asarray(bias), c // num_groups)
    else:
        s, b = np.asarray(scale), np.asarray(bias)
    return (y * s.astype(ct).reshape(bshape) + b.astype(ct).reshape(bshape)).astype(X.dtype)


@kernel("GroupNormalization", since=18)
def group_normalization18(X, scale, bias, *, epsilon=1e-5, num_groups=1, stash_type=1):
    return _group_norm(X, scale, bias, epsilon, num_groups, stash_type, per_group=True)


@kernel("GroupNormalization", since=21)
def group_normalization(X, scale, bias, *, epsilon=1e-5, num_groups=1, stash_type=1):
    return _group_norm(X, scale, bias, epsilon, num_groups, stash_type, per_group=False)


@kernel("MeanVarianceNormalization", since=9)
def mean_variance_normalization(X, *, axes=(0, 2, 3)):
    axes = tuple(axes)
    mean = X.mean(axis=axes, keepdims=True)
    var = ((X - mean) ** 2).mean(axis=axes, keepdims=True)
    return ((X - mean) / (np.sqrt(var) + X.dtype.type(1e-9))).astype(X.dtype)
