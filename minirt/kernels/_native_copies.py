"""Data movement through the native index copy (``mrt_index_copy``, ``mrt_gather_rows``; kernels.h).

The ops that only move data (Transpose, Slice, Expand, Split, DepthToSpace, Pad, Tile, Gather) are
each one native call here, which a native program can replay (docs/runtime.md, "Native programs"),
instead of a numpy copy that keeps the run in Python.

* :func:`copy_of_view`: a C-contiguous copy of a strided numpy view of a C-contiguous array
  (``x.transpose(perm)``, ``x[slices]``, ``np.broadcast_to(x, shape)``, a reshape of those): the
  view's own strides become the per-axis offset tables, so one function serves every view-shaped op.
* :func:`pad_copy`: Pad (constant, edge, reflect, wrap; negative pads crop).
* :func:`tile_copy`: Tile.
* :func:`gather_copy`: Gather with int64 indices (constant or given at run time).

Each returns None when the native path does not apply (no native module, an element size other than
1, 2, 4 or 8 bytes, a non-contiguous source, more than ``INDEX_MAX_RANK`` axes after merging) or does
not pay (a copy below ``_NATIVE_MIN_BYTES`` outside a native-program recording): the caller then takes
its numpy path, which also raises the op's errors.  Maps are built once per
shape and parameters and cached (:data:`_maps`); a map's tables are kept alive by its struct.
"""
from __future__ import annotations

import math

import numpy as np

from minirt import native as _native

_maps: dict = {}  # key -> (mrt_index_map or None when the copy does not fit the kernel)
_MAPS_MAX = 2048


def _usable(x) -> bool:
    return (_native.available and type(x) is np.ndarray and x.flags.c_contiguous and x.size > 0
            and x.dtype.itemsize in (1, 2, 4, 8) and x.dtype.kind in "biufc")


# Outside a native-program recording, copies smaller than this take numpy (the callers' other path):
# the native path's Python side (map lookup, struct, cffi call) costs 15-30 us a call where numpy's
# copy of 1-64 KB costs 2-15 us (measured at 1 thread: a 4 KB Transpose 21 vs 4 us, Gather 32 vs
# 12 us), and without a recording nothing replays the call.  Detectors' post-processing makes hundreds
# of such copies per image and never replays (its NMS makes the shapes depend on the data): SSDlite's
# Gathers and Transposes took 27 ms this way, 15 ms with numpy.  From this size on the native copy's
# threads may pay.
_NATIVE_MIN_BYTES = 1 << 20


def _worth(nbytes: int) -> bool:
    return nbytes >= _NATIVE_MIN_BYTES or _native.recording()


def _cached(key, make):
    m = _maps.get(key, _maps)
    if m is _maps:
        if len(_maps) >= _MAPS_MAX:
            _maps.clear()
        m = _maps[key] = make()
    return m


def _merged(shape, tables):
    """Drop axes of size 1 (their one offset added to another axis) and merge neighbouring axes whose
    offsets are one affine run (the inner axis a run of step s with no fill, the outer one of step
    n * s): fewer, longer rows.  Returns (shape, tables); both lists, at least one axis."""
    shape, tables = list(shape), [np.asarray(t, dtype=np.int64) for t in tables]
    constant = 0
    keep_s, keep_t = [], []
    for n, t in zip(shape, tables):
        if n == 1 and t[0] >= 0:
            constant += int(t[0])
        else:
            keep_s.append(n)
            keep_t.append(t)
    if not keep_s:
        return [1], [np.array([constant], dtype=np.int64)]
    keep_t[0] = np.where(keep_t[0] >= 0, keep_t[0] + constant, -1)
    out_s, out_t = [keep_s[-1]], [keep_t[-1]]
    for n, t in zip(reversed(keep_s[:-1]), reversed(keep_t[:-1])):
        inner_n, inner = out_s[0], out_t[0]
        step = _affine_step(inner)
        if step is not None and _affine_step(t) == step * inner_n:
            out_s[0] = n * inner_n
            out_t[0] = inner[0] + t[0] + np.arange(n * inner_n, dtype=np.int64) * step
            continue
        out_s.insert(0, n)
        out_t.insert(0, t)
    return out_s, out_t


def _affine_step(t) -> int | None:
    """s when t[i] == t[0] + i * s for every i with no fill (t[0] >= 0 and nothing < 0), else None."""
    if t.size == 0 or t.min() < 0:
        return None
    if t.size == 1:
        return 0
    s = int(t[1] - t[0])
    return s if np.array_equal(t, t[0] + np.arange(t.size, dtype=np.int64) * s) else None


def _prepare(shape, tables, itemsize, fill=0):
    shape, tables = _merged(shape, tables)
    if len(shape) > _native.INDEX_MAX_RANK:
        return None
    return _native.index_map(shape, tables, itemsize, fill)


def _run(m, x, shape, dtype, out, final: bool):
    if m is None:
        return None
    y = out if (out is not None and out.shape == tuple(shape) and out.dtype == dtype and out.flags.c_contiguous
                and not np.may_share_memory(out, x)) else np.empty(shape, dtype=dtype)
    if y.size:
        _native.index_copy(m, x, y)
    # (declared the node's result only when the map follows from constants: a map made from computed
    # starts, pads or shapes holds this run's values, which a replay would reuse)
    return _native.final(y) if final else y


def copy_of_view(view, base, out=None, shape=None, final: bool = True):
    """A C-contiguous copy of ``view`` (a numpy view whose memory lies in the C-contiguous ``base``),
    into ``out`` when it fits (the memory plan's buffer), declared the node's result unless ``final``
    is False (the view came from computed parameters: starts, shapes); or None.
    ``shape``: the result's shape when it is a reshape of the copy (the same number of elements)."""
    if not _usable(base) or type(view) is not np.ndarray or view.size == 0 or view.dtype != base.dtype:
        return None
    item = base.itemsize
    if not _worth(view.size * item):
        return None
    start, rem = divmod(view.ctypes.data - base.ctypes.data, item)
    if rem or any(s % item for s in view.strides):
        return None
    key = ("view", view.shape, view.strides, start, item)

    def make():
        # every table >= 0 (a negative offset means "fill"): an axis with a negative stride counts from
        # its last element, and the view's lowest element (>= 0, inside base) goes into the first table
        lowest = start + sum((n - 1) * (s // item) for n, s in zip(view.shape, view.strides) if s < 0)
        tables = [(np.arange(n, dtype=np.int64) - (n - 1 if s < 0 else 0)) * (s // item)
                  for n, s in zip(view.shape, view.strides)] or [np.zeros(1, dtype=np.int64)]
        tables[0] = tables[0] + lowest
        return _prepare(view.shape or (1,), tables, item)

    return _run(_cached(key, make), base, view.shape if shape is None else shape, base.dtype, out, final)


def _source_index(n_out: int, begin: int, n_in: int, mode: str) -> np.ndarray:
    """For one axis of Pad: the source index of each output index (output i reads input i - begin),
    or -1 where the constant goes."""
    i = np.arange(n_out, dtype=np.int64) - begin
    if mode == "constant":
        return np.where((i >= 0) & (i < n_in), i, -1)
    if mode == "edge":
        return np.clip(i, 0, n_in - 1)
    if mode == "wrap":
        return np.mod(i, n_in)
    # reflect (the edge not repeated): period 2 * (n - 1)
    if n_in == 1:
        return np.zeros(n_out, dtype=np.int64)
    period = 2 * (n_in - 1)
    r = np.mod(i, period)
    return np.where(r < n_in, r, period - r)


def pad_copy(x, width, mode: str, value, final: bool = True):
    """Pad of the C-contiguous ``x`` by ``width`` ((begin, end) per axis; negative values crop, and the
    modes read the kept part), or None; declared the node's result when ``final`` (constant pads)."""
    if not _usable(x) or mode not in ("constant", "edge", "reflect", "wrap"):
        return None
    try:
        fill_bytes = np.asarray(value, dtype=x.dtype).reshape(()).tobytes() if mode == "constant" else b""
    except (TypeError, ValueError, OverflowError):
        return None
    fill = int.from_bytes(fill_bytes, "little") if fill_bytes else 0
    shape = tuple(n + b + e for n, (b, e) in zip(x.shape, width))
    if min(shape, default=1) <= 0 or not _worth(int(np.prod(shape, dtype=np.int64)) * x.itemsize):
        return None
    key = ("pad", x.shape, tuple(width), mode, fill, x.itemsize)

    def make():
        tables = []
        for n_out, (b, e), n, st in zip(shape, width, x.shape, x.strides):
            lo = max(-b, 0)  # cropped at the start
            kept = n - lo - max(-e, 0)
            src = _source_index(n_out, max(b, 0), kept, mode)
            tables.append(np.where(src >= 0, (src + lo) * (st // x.itemsize), -1))
        return _prepare(shape, tables, x.itemsize, fill)

    return _run(_cached(key, make), x, shape, x.dtype, None, final)


def tile_copy(x, reps, final: bool = True):
    """Tile of ``x`` by ``reps`` (one count per axis, each > 0), or None; declared the node's result when
    ``final`` (constant repeats)."""
    if not _usable(x) or x.ndim == 0:
        return None
    shape = tuple(n * r for n, r in zip(x.shape, reps))
    if not _worth(int(np.prod(shape, dtype=np.int64)) * x.itemsize):
        return None
    key = ("tile", x.shape, tuple(reps), x.itemsize)

    def make():
        strides = [s // x.itemsize for s in x.strides]
        return _prepare(shape, [np.mod(np.arange(n_out, dtype=np.int64), n) * st
                                for n_out, n, st in zip(shape, x.shape, strides)], x.itemsize)

    return _run(_cached(key, make), x, shape, x.dtype, None, final)


def gather_copy(data, indices, axis: int, out=None):
    """Gather of ``data`` along ``axis`` (normalised) by the int64 ``indices`` (any shape), or None.  An
    index out of range returns None too (nothing written): the numpy path then raises the error."""
    if (not _usable(data) or type(indices) is not np.ndarray or indices.dtype != np.int64
            or not indices.flags.c_contiguous or indices.size == 0
            or not _worth(data.nbytes // data.shape[axis] * indices.size)):  # (the result's bytes)
        return None
    outer = math.prod(data.shape[:axis])
    inner = math.prod(data.shape[axis + 1:]) * data.itemsize
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1:]
    y = out if (out is not None and out.shape == shape and out.dtype == data.dtype and out.flags.c_contiguous
                and not np.may_share_memory(out, data)) else np.empty(shape, dtype=data.dtype)
    s = _native.gather_shape(outer, data.shape[axis], indices.size, inner)
    if not _native.gather_rows(s, data, indices, y):
        return None
    return _native.final(y)
