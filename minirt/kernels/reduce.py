"""Reduction kernels: Reduce{Sum,Mean,Max,Min,Prod,L1,L2,LogSum,LogSumExp,SumSquare}, ArgMax, ArgMin.

Every Reduce* op has two forms: ``axes`` as an attribute (opset 1; opset 11
only allowed negative axes) and ``axes`` as an optional int64 input together
with ``noop_with_empty_axes`` (opset 13 for ReduceSum, 18 for the others).
Empty/absent axes means "reduce everything" unless ``noop_with_empty_axes=1``,
in which case no axis is reduced (the output has the input's shape; L1, L2,
LogSum, ... still apply their elementwise part, matching onnxruntime).

Results keep the input dtype.  float16 is accumulated in float32 and integer
sums in their own dtype (numpy would otherwise widen int32 to int64).
Reducing over zero elements yields the operation's identity (0 for sums,
1 for products, -inf/+inf or the integer limits for Max/Min), as ONNX 18 specifies.
"""
from __future__ import annotations

import math

import numpy as np

from minirt import native as _native
from minirt.kernels.registry import is_constant, kernel

_F32 = np.dtype(np.float32)


def _resolve_axes(x: np.ndarray, axes) -> tuple[int, ...] | None:
    """Normalised axes tuple, or None for "all axes"."""
    if axes is None:
        return None
    axes = [int(a) for a in np.asarray(axes).reshape(-1)]
    if not axes:
        return None
    out = []
    for a in axes:
        if not -x.ndim <= a < max(x.ndim, 1):
            raise ValueError(f"reduction axis {a} out of range for rank {x.ndim}")
        out.append(a + x.ndim if a < 0 else a)
    if len(set(out)) != len(out):
        raise ValueError(f"duplicate reduction axes {axes}")
    return tuple(out) if x.ndim else None


def _acc_dtype(x: np.ndarray) -> np.dtype:
    return np.dtype(np.float32) if x.dtype == np.float16 else x.dtype


def _max_identity(dtype: np.dtype):
    if dtype.kind == "f":
        return -np.inf
    if dtype == bool:
        return False
    return np.iinfo(dtype).min


def _min_identity(dtype: np.dtype):
    if dtype.kind == "f":
        return np.inf
    if dtype == bool:
        return True
    return np.iinfo(dtype).max


def _sum(x, axes, keep):
    return np.sum(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x))


def _mean(x, axes, keep):
    if x.dtype.kind in "iu":
        # Integer mean is the integer quotient of the sum, truncated like C.
        total = np.sum(x, axis=axes, keepdims=keep, dtype=np.int64)
        count = x.size // max(total.size, 1) if x.size else 0
        if count == 0:
            raise ValueError("ReduceMean over zero elements")
        return np.trunc(total / count)
    return np.mean(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x))


def _max(x, axes, keep):
    if x.size == 0:
        return np.max(x, axis=axes, keepdims=keep, initial=_max_identity(x.dtype))
    return np.max(x, axis=axes, keepdims=keep)


def _min(x, axes, keep):
    if x.size == 0:
        return np.min(x, axis=axes, keepdims=keep, initial=_min_identity(x.dtype))
    return np.min(x, axis=axes, keepdims=keep)


def _prod(x, axes, keep):
    return np.prod(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x))


def _l1(x, axes, keep):
    return np.sum(np.abs(x), axis=axes, keepdims=keep, dtype=_acc_dtype(x))


def _l2(x, axes, keep):
    xf = x.astype(_acc_dtype(x), copy=False)
    out = np.sqrt(np.sum(xf * xf, axis=axes, keepdims=keep))
    return np.trunc(out) if x.dtype.kind in "iu" else out


def _sum_square(x, axes, keep):
    xf = x.astype(_acc_dtype(x), copy=False)
    return np.sum(xf * xf, axis=axes, keepdims=keep)


def _log_sum(x, axes, keep):
    return np.log(np.sum(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x)))


def _log_sum_exp(x, axes, keep):
    xf = x.astype(_acc_dtype(x), copy=False)
    if x.size == 0:
        return np.log(np.sum(np.exp(xf), axis=axes, keepdims=keep))
    # Subtract the max for stability; an all -inf slice keeps max 0 so it yields -inf, not NaN.
    m = np.max(xf, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0).astype(xf.dtype)
    out = np.log(np.sum(np.exp(xf - m), axis=axes, keepdims=True)) + m
    return out if keep else np.squeeze(out, axis=axes)


def _reduce(fn, x: np.ndarray, axes, keepdims: int, noop_with_empty_axes: int) -> np.ndarray:
    ax = _resolve_axes(x, axes)
    if ax is None and noop_with_empty_axes:
        # Reducing over no axes still applies the per-element part of the op
        # (|x| for L1, log for LogSum, ...), as onnxruntime does; axis=() does that.
        ax = ()
    out = fn(x, ax, bool(keepdims))
    return np.asarray(out).astype(x.dtype, copy=False)


def _native_axes(x, axes, noop_with_empty_axes: int, ints: bool = False) -> tuple | None:
    """The axes a native reduction of ``x`` runs over (all of them when none are given), or None when
    the native path does not apply: no native kernels, not a float32 (with ``ints`` also int32 / int64)
    C-contiguous array with values, or no axes with ``noop_with_empty_axes`` (nothing to reduce)."""
    if not (_native.available and type(x) is np.ndarray and x.size and x.flags.c_contiguous
            and (x.dtype == _F32 or ints and x.dtype.name in _native.REDUCE_INT_TYPES)):
        return None
    ax = _resolve_axes(x, axes)
    if ax is None:
        if noop_with_empty_axes or not x.ndim:
            return None
        ax = tuple(range(x.ndim))
    return tuple(ax)


def _reduce_native(op: str, x, axes, keepdims: int, noop_with_empty_axes: int, out=None):
    """``op`` (a key of native.REDUCE_OPS) of a float32 C-contiguous ``x`` over one block of consecutive
    axes by one native call (mrt_reduce_f32: x as (outer, reduced, inner)), declared final; None
    when it is not that case (the numpy path then computes it, or raises the op's error).  Sum / Max /
    Min of int32 / int64 likewise (mrt_reduce_int: a decoder's attention mask summed into its sequence
    lengths, part of its replayed decode step, D123)."""
    if op not in _native.REDUCE_OPS:
        return None
    ax = _native_axes(x, axes, noop_with_empty_axes, ints=op in _native.REDUCE_INT_OPS)
    if ax is None:
        return None
    ax = sorted(ax)
    if not ax or ax != list(range(ax[0], ax[-1] + 1)):
        return None
    outer, n, inner = (math.prod(x.shape[:ax[0]]), math.prod(x.shape[ax[0]:ax[-1] + 1]),
                       math.prod(x.shape[ax[-1] + 1:]))
    shape = tuple(1 if a in ax else d for a, d in enumerate(x.shape)) if keepdims else \
        tuple(d for a, d in enumerate(x.shape) if a not in ax)
    if out is not None and out.shape == shape and out.dtype == x.dtype and out.flags.c_contiguous \
            and not np.may_share_memory(x, out):
        y = out
    else:
        y = np.empty(shape, x.dtype)
    if x.dtype == _F32:
        _native.reduce(op, x, y, outer, n, inner)
    else:
        _native.reduce_int(op, x, y, outer, n, inner)
    # (axes given as a computed input: this run's axes, which a replay would reuse: not declared)
    return _native.final(y) if is_constant(axes) or isinstance(axes, (tuple, list)) else y


def _register(op: str, fn, input_since: int) -> None:
    """Register the attribute form (since 1) and the axes-input form (since ``input_since``)."""

    def reduce_attr(x, *, axes: tuple | None = None, keepdims: int = 1):
        y = _reduce_native(op, x, axes, keepdims, 0)
        return _reduce(fn, x, axes, keepdims, 0) if y is None else y

    def reduce_input(x, axes=None, /, *, keepdims: int = 1, noop_with_empty_axes: int = 0):
        y = _reduce_native(op, x, axes, keepdims, noop_with_empty_axes)
        return _reduce(fn, x, axes, keepdims, noop_with_empty_axes) if y is None else y

    base = "reduce_" + op[len("Reduce"):].lower()
    reduce_attr.__name__ = reduce_attr.__qualname__ = base + "_1"
    reduce_input.__name__ = reduce_input.__qualname__ = f"{base}_{input_since}"
    kernel(op, since=1)(reduce_attr)
    kernel(op, since=input_since)(reduce_input)


def _mean_native(x, axes, keepdims: int, noop_with_empty_axes: int, out):
    """ReduceMean over trailing axes of a float32 C-contiguous ``x`` by one native call
    (mrt_plane_means_f32: the mean of each plane of prod(reduced sizes) values; the squeeze of a
    squeeze-excite block, axes (2, 3)), declared final; None when it is not that case."""
    ax = _native_axes(x, axes, noop_with_empty_axes)
    if ax is None:
        return None
    k = x.ndim - len(ax)
    if sorted(ax) != list(range(k, x.ndim)):
        return _reduce_native("ReduceMean", x, axes, keepdims, noop_with_empty_axes, out)  # (a middle block)
    shape = x.shape[:k] + (1,) * len(ax) if keepdims else x.shape[:k]
    if out is not None and out.shape == shape and out.dtype == _F32 and out.flags.c_contiguous \
            and not np.may_share_memory(x, out):
        y = out
    else:
        y = np.empty(shape, _F32)
    _native.plane_means(x, y)
    return _native.final(y) if is_constant(axes) or isinstance(axes, (tuple, list)) else y


@kernel("ReduceMean", since=1, out=True)
def reduce_mean_1(x, *, axes: tuple | None = None, keepdims: int = 1, out=None):
    y = _mean_native(x, axes, keepdims, 0, out)
    return _reduce(_mean, x, axes, keepdims, 0) if y is None else y


@kernel("ReduceMean", since=18, out=True)
def reduce_mean_18(x, axes=None, /, *, keepdims: int = 1, noop_with_empty_axes: int = 0, out=None):
    y = _mean_native(x, axes, keepdims, noop_with_empty_axes, out)
    return _reduce(_mean, x, axes, keepdims, noop_with_empty_axes) if y is None else y


_register("ReduceSum", _sum, 13)
_register("ReduceMax", _max, 18)
_register("ReduceMin", _min, 18)
_register("ReduceProd", _prod, 18)
_register("ReduceL1", _l1, 18)
_register("ReduceL2", _l2, 18)
_register("ReduceLogSum", _log_sum, 18)
_register("ReduceLogSumExp", _log_sum_exp, 18)
_register("ReduceSumSquare", _sum_square, 18)


def _arg(x: np.ndarray, axis: int, keepdims: int, select_last_index: int, largest: bool) -> np.ndarray:
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} out of range for rank {x.ndim}")
    axis = axis + x.ndim if axis < 0 else axis
    if x.shape[axis] == 0:
        raise ValueError("ArgMax/ArgMin over an empty axis")
    fn = np.argmax if largest else np.argmin
    if select_last_index:
        # numpy returns the first extreme; on the reversed axis that is the last one.
        idx = (x.shape[axis] - 1) - fn(np.flip(x, axis), axis=axis)
    else:
        idx = fn(x, axis=axis)
    idx = np.asarray(idx, dtype=np.int64)
    return np.expand_dims(idx, axis) if keepdims else idx


@kernel("ArgMax", since=1)
def arg_max_1(x, *, axis: int = 0, keepdims: int = 1):
    return _arg(x, axis, keepdims, 0, True)


@kernel("ArgMax", since=12)
def arg_max(x, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0):
    return _arg(x, axis, keepdims, select_last_index, True)


@kernel("ArgMin", since=1)
def arg_min_1(x, *, axis: int = 0, keepdims: int = 1):
    return _arg(x, axis, keepdims, 0, False)


@kernel("ArgMin", since=12)
def arg_min(x, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0):
    return _arg(x, axis, keepdims, select_last_index, False)
