"""Tensor-manipulation kernels: shapes, indexing, copying, padding, resizing.

These ops move or select data without arithmetic (Resize aside).  Shape-like
inputs (``shape``, ``axes``, ``pads``, ``starts`` ...) arrive as small int64
arrays and are converted to Python ints once per call; per-element work stays
in numpy.  Kernels never modify their inputs in place; when an ONNX op is a
pure view (Reshape, Squeeze, ...) the result may share memory with the input,
which is safe because minirt values are immutable once produced.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from minirt import native as _native
from minirt.dtypes import ONNX_TO_NUMPY
from minirt.kernels import _narrow
from minirt.kernels._limits import check_alloc
from minirt.kernels._native_copies import copy_of_view, gather_copy, pad_copy, tile_copy
from minirt.kernels.registry import NodeContext, is_constant, kernel

# --------------------------------------------------------------------------- helpers


def _ints(value, what: str) -> list[int]:
    """A shape-like input or attribute as a list of Python ints."""
    if value is None:
        return []
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must be integers, got dtype {arr.dtype}")
    return [int(v) for v in arr.reshape(-1)]


def _scalar_int(value, what: str) -> int:
    arr = np.asarray(value)
    if arr.size != 1:
        raise ValueError(f"{what} must hold exactly one value, got shape {arr.shape}")
    return int(arr.reshape(()))


def _axis(axis: int, rank: int, what: str = "axis") -> int:
    """Normalise a possibly negative axis into [0, rank)."""
    if not -rank <= axis < rank:
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _axes(axes, rank: int, what: str = "axes") -> list[int]:
    out = [_axis(a, rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise ValueError(f"{what} {list(axes)} contains duplicates")
    return out


def _dtype_from_code(code, what: str) -> np.dtype:
    if isinstance(code, (str, bytes)):
        # Cast-1 names the type as a string, e.g. "FLOAT".
        import onnx

        name = code.decode() if isinstance(code, bytes) else code
        try:
            code = onnx.TensorProto.DataType.Value(name.upper())
        except ValueError:
            raise ValueError(f"{what}: unknown element type name {name!r}") from None
    try:
        return ONNX_TO_NUMPY[int(code)]
    except KeyError:
        raise ValueError(f"{what}: unsupported element type code {code}") from None


def _normalise_indices(indices: np.ndarray, dim: int, what: str) -> np.ndarray:
    """Negative indices count from the end; anything outside [-dim, dim) is an error."""
    if indices.dtype.kind not in "iu":
        raise ValueError(f"{what}: indices must be integers, got {indices.dtype}")
    if indices.ndim == 0:  # (one index, as shape arithmetic gathers: no min / max passes)
        v = int(indices)
        if not -dim <= v < dim:
            raise ValueError(f"{what}: index out of range [{-dim}, {dim - 1}] (got {v}..{v})")
        return indices + dim if v < 0 else indices
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < -dim or hi >= dim:
            raise ValueError(f"{what}: index out of range [{-dim}, {dim - 1}] (got {lo}..{hi})")
        if lo < 0:
            indices = np.where(indices < 0, indices + dim, indices)
    return indices


# --------------------------------------------------------------------------- trivial


@kernel("Identity", since=1)
def identity(x):
    return x


@kernel("Constant", since=1)
def constant(
    *,
    value: np.ndarray | None = None,
    sparse_value=None,
    value_float: float | None = None,
    value_floats: tuple | None = None,
    value_int: int | None = None,
    value_ints: tuple | None = None,
    value_string: str | None = None,
    value_strings: tuple | None = None,
):
    given = {
        k: v
        for k, v in (
            ("value", value), ("sparse_value", sparse_value), ("value_float", value_float),
            ("value_floats", value_floats), ("value_int", value_int), ("value_ints", value_ints),
            ("value_string", value_string), ("value_strings", value_strings),
        )
        if v is not None
    }
    if len(given) != 1:
        raise ValueError(f"Constant needs exactly one value attribute, got {sorted(given) or 'none'}")
    if value is not None:
        return np.asarray(value)
    if sparse_value is not None:
        raise ValueError("Constant: sparse_value is not supported")
    if value_float is not None:
        return np.array(value_float, dtype=np.float32)
    if value_floats is not None:
        return np.array(value_floats, dtype=np.float32).reshape(-1)
    if value_int is not None:
        return np.array(value_int, dtype=np.int64)
    if value_ints is not None:
        return np.array(value_ints, dtype=np.int64).reshape(-1)
    if value_string is not None:
        out = np.empty((), dtype=object)
        out[()] = value_string.decode() if isinstance(value_string, bytes) else value_string
        return out
    strings = [s.decode() if isinstance(s, bytes) else s for s in value_strings]
    out = np.empty(len(strings), dtype=object)
    out[:] = strings
    return out


# Casts of at most this many elements between numpy's own number types take astype at once.
_SMALL_CAST = 4096


def _cast(x: np.ndarray, dtype: np.dtype, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    if x.dtype == dtype:
        return x
    if (x.size <= _SMALL_CAST and dtype.isbuiltin == 1 and x.dtype.isbuiltin == 1 and dtype.kind in "biuf"
            and x.dtype.kind in "biuf" and not (_native.available and _native.recording())):
        # a few of numpy's own numbers both sides (not narrow, not strings), outside a native-program
        # recording: astype, as the checks below end with for them (skipping the checks saves ~15 us
        # on the scalar casts of shape arithmetic)
        return x.astype(dtype)
    if dtype != object and x.dtype != object:
        narrow = _narrow.cast(x, dtype, saturate, round_mode)
        if narrow is not None:
            return narrow
    if dtype == object:
        x = _narrow.widen(x)
        # Numbers become their shortest repr, as onnxruntime prints them.
        out = np.empty(x.shape, dtype=object)
        if x.dtype.kind == "f":
            flat = [_float_str(v) for v in x.reshape(-1)]
        elif x.dtype == bool:
            flat = ["1" if v else "0" for v in x.reshape(-1).tolist()]
        else:
            flat = [str(v) for v in x.reshape(-1).tolist()]
        out.reshape(-1)[:] = flat
        return out
    if x.dtype == object or x.dtype.kind in "US":
        try:
            if dtype == bool:
                return np.array([float(s) != 0 for s in x.reshape(-1)], dtype=bool).reshape(x.shape)
            if dtype.kind in "iu":
                return np.array([int(s) for s in x.reshape(-1)], dtype=dtype).reshape(x.shape)
            return x.astype(dtype)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Cast: cannot parse string tensor as {dtype}: {exc}") from None
    if (_native.available and type(x) is np.ndarray and x.size and x.flags.c_contiguous
            and x.dtype.name in _native.CAST_CODES and dtype.name in _native.CAST_CODES
            and not (x.dtype.kind == "f" and dtype.name in ("uint8", "int8"))):
        # one native pass, which a program can replay (floats to 8-bit integers stay with numpy:
        # there the values past the type's range differ by platform)
        y = np.empty(x.shape, dtype=dtype)
        _native.cast(x, y)
        return _native.final(y)
    return x.astype(dtype)


def _float_str(v: np.floating) -> str:
    """Shortest round-trip text of a float in its own precision, without a trailing '.0'."""
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "INF" if v > 0 else "-INF"
    text = str(v)
    return text[:-2] if text.endswith(".0") else text


@kernel("Cast", since=1)
def cast(x, *, to=None, saturate: int = 1, round_mode: str = "up"):
    # saturate applies to float8 targets, round_mode to float8e8m0 (see minirt.kernels._narrow).
    if to is None:
        raise ValueError("Cast: the 'to' attribute is required")
    return _cast(x, _dtype_from_code(to, "Cast"), saturate, round_mode)


@kernel("CastLike", since=15)
def cast_like(x, target, *, saturate: int = 1, round_mode: str = "up"):
    return _cast(x, target.dtype, saturate, round_mode)


# --------------------------------------------------------------------------- shape ops


def _reshape(x: np.ndarray, shape: list[int], allowzero: int) -> np.ndarray:
    if not allowzero:
        # 0 copies the input dimension at the same position.
        shape = [x.shape[i] if s == 0 and i < x.ndim else s for i, s in enumerate(shape)]
        if any(s == 0 and i >= x.ndim for i, s in enumerate(shape)):
            raise ValueError(f"Reshape: 0 at position beyond input rank {x.ndim}")
    if shape.count(-1) > 1:
        raise ValueError(f"Reshape: more than one -1 in shape {shape}")
    try:
        return x.reshape(shape)
    except ValueError:
        raise ValueError(f"Reshape: cannot reshape {x.shape} into {shape}") from None


@kernel("Reshape", since=1)
def reshape_1(x, *, shape: tuple = (), consumed_inputs: tuple = ()):
    return _reshape(x, list(shape), 0)


@kernel("Reshape", since=5)
def reshape(x, shape, *, allowzero: int = 0):
    return _reshape(x, _ints(shape, "Reshape shape"), allowzero)


@kernel("Flatten", since=1)
def flatten(x, *, axis: int = 1):
    if not -x.ndim <= axis <= x.ndim:
        raise ValueError(f"Flatten: axis {axis} out of range for rank {x.ndim}")
    if axis < 0:
        axis += x.ndim
    outer = math.prod(x.shape[:axis])
    return x.reshape(outer, math.prod(x.shape[axis:]))


@kernel("Transpose", since=1, out=True)
def transpose(x, *, perm: tuple | None = None, out=None):
    if x.ndim == 0:
        return x.copy()  # (ascontiguousarray would turn a 0-d array into a 1-d one)
    if perm is not None and sorted(perm) != list(range(x.ndim)):
        raise ValueError(f"Transpose: perm {list(perm)} is not a permutation of rank {x.ndim}")
    view = x.transpose(perm)
    # Materialise so downstream kernels see contiguous memory (into the memory plan's buffer when it fits).
    y = copy_of_view(view, x, out)
    if y is not None:
        return y
    if (out is not None and out.shape == view.shape and out.dtype == x.dtype and out.flags.c_contiguous
            and type(x) is np.ndarray and not np.may_share_memory(x, out)):
        np.copyto(out, view)
        return out
    return np.ascontiguousarray(view)


def _concat(inputs, axis: int, out=None) -> np.ndarray:
    """np.concatenate with ONNX's errors; written into ``out`` (memory plan) when that is exactly the result's
    shape and dtype, C-contiguous, and overlaps no input."""
    arrays = [x for x in inputs if x is not None]
    if not arrays:
        raise ValueError("Concat needs at least one input")
    rank = arrays[0].ndim
    try:
        ax = _axis(axis, rank)
        if out is not None and _many_small(arrays, out):
            out = None  # one np.concatenate into a fresh array (see _many_small)
        if out is not None and out.flags.c_contiguous and all(
            type(x) is np.ndarray and x.dtype == out.dtype and x.ndim == rank for x in arrays
        ):
            shape = list(arrays[0].shape)
            shape[ax] = sum(x.shape[ax] for x in arrays)
            if tuple(shape) == out.shape and all(
                    x.shape[:ax] + x.shape[ax + 1:] == out.shape[:ax] + out.shape[ax + 1:] for x in arrays):
                pieces = _concat_pieces(arrays, ax, out)
                in_place = [x.ctypes.data == p.ctypes.data and x.flags.c_contiguous and p.flags.c_contiguous
                            for x, p in zip(arrays, pieces)]
                if not any(not here and np.may_share_memory(x, out) for x, here in zip(arrays, in_place)):
                    for x, piece, here in zip(arrays, pieces, in_place):
                        if not here:  # (an input the memory plan put at its piece is there already)
                            np.copyto(piece, x)
                    return out
        return np.concatenate(arrays, axis=ax)
    except ValueError as exc:
        raise ValueError(f"Concat: {exc}") from None


# A Concat of more inputs than this, with a result of at most _MANY_SMALL_BYTES, ignores the memory
# plan's buffer outside a native-program recording: placing each input in the buffer (a native row copy,
# or a piece view and its overlap checks) costs ~10 us an input in Python, one np.concatenate of the
# whole ~1 us an input (SSDlite's 90-way concats of per-class detections: 1.2 ms -> 0.1 ms).  While a
# program records, the native copies are kept: they are what a replay runs.
_MANY_INPUTS = 8
_MANY_SMALL_BYTES = 1 << 20


def _many_small(arrays, out) -> bool:
    return (len(arrays) > _MANY_INPUTS and out.nbytes <= _MANY_SMALL_BYTES
            and not (_native.available and _native.recording()))


def _concat_pieces(arrays, ax: int, out) -> list:
    """The views of ``out`` that each of ``arrays`` fills, one after the other along axis ``ax``."""
    pieces, start = [], 0
    for x in arrays:
        index = [slice(None)] * out.ndim
        index[ax] = slice(start, start + x.shape[ax])
        pieces.append(out[tuple(index)])
        start += x.shape[ax]
    return pieces


def _concat_native(inputs, axis: int, out) -> np.ndarray | None:
    """Concat of float32 C-contiguous arrays into ``out`` (the memory plan's buffer: C-contiguous,
    exactly the result, overlapping no input; or None: a new array) with one native row copy per
    input, or None.  Each input
    is rows of prod(shape[axis:]) values (one row per index of the axes before ``axis``), placed side
    by side in the result's rows."""
    if not _native.available or (out is not None and (out.dtype != np.float32 or not out.flags.c_contiguous)):
        return None
    arrays = [x for x in inputs if x is not None]
    if not arrays or any(type(x) is not np.ndarray or x.dtype != np.float32 or x.ndim != arrays[0].ndim
                         or not x.flags.c_contiguous for x in arrays):
        return None
    ax = axis + arrays[0].ndim if axis < 0 else axis
    if out is None:  # no planned buffer (a subgraph's output): a new one, filled the same way
        if not 0 <= ax < arrays[0].ndim:
            return None  # (the numpy path raises the error)
        shape = list(arrays[0].shape)
        shape[ax] = sum(x.shape[ax] for x in arrays)
        out = np.empty(shape, np.float32)
    if _many_small(arrays, out) or any(x.ndim != out.ndim for x in arrays):
        return None
    if not 0 <= ax < out.ndim or sum(x.shape[ax] for x in arrays) != out.shape[ax] or any(
            x.shape[:ax] + x.shape[ax + 1:] != out.shape[:ax] + out.shape[ax + 1:] for x in arrays):
        return None  # (the numpy path raises the error)
    rows = math.prod(out.shape[:ax])
    dst_ld = math.prod(out.shape[ax:])
    base = out.ctypes.data
    copies, offset = [], 0
    for x in arrays:
        cols = math.prod(x.shape[ax:])
        # an input the memory plan placed at its piece (one row: the axes before `ax` are all 1) is
        # there already (the arena's Concat in place); any other overlap goes the numpy way
        if not (rows == 1 and x.ctypes.data == base + offset * out.itemsize):
            if np.may_share_memory(x, out):
                return None
            copies.append((x, offset, cols))
        offset += cols
    for x, offset, cols in copies:
        _native.copy_rows(x, out, offset, rows, cols, cols, dst_ld)
    return out


@kernel("Concat", since=1, out=True)
def concat_1(*inputs, axis: int = 1, out=None):
    y = _concat_native(inputs, axis, out) if _native.available else None
    return _concat(inputs, axis, out) if y is None else _native.final(y)  # (a program may replay it)


@kernel("Concat", since=4, out=True)
def concat(*inputs, axis: int | None = None, out=None):
    if axis is None:
        raise ValueError("Concat: the 'axis' attribute is required")
    y = _concat_native(inputs, axis, out) if _native.available else None
    return _concat(inputs, axis, out) if y is None else _native.final(y)  # (a program may replay it)


def _split(x: np.ndarray, axis: int, sizes: list[int] | None, n_outputs: int, uneven: bool, final: bool = True) -> tuple:
    """``final``: the sizes are constants (attributes, constant inputs): the copies may be declared the
    node's results, which a native program replays."""
    axis = _axis(axis, x.ndim)
    dim = x.shape[axis]
    if sizes:
        if len(sizes) != n_outputs:
            raise ValueError(f"Split: {len(sizes)} split sizes for {n_outputs} outputs")
        if sum(sizes) != dim or min(sizes) < 0:
            raise ValueError(f"Split: sizes {sizes} do not sum to dimension {dim}")
    else:
        if uneven:
            # Opset 18: ceil-sized chunks, the last one takes the remainder.
            chunk = -(-dim // n_outputs)
            sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(n_outputs)]
        else:
            if dim % n_outputs:
                raise ValueError(f"Split: dimension {dim} is not divisible into {n_outputs} outputs")
            sizes = [dim // n_outputs] * n_outputs
    # views of x by basic slicing (numpy.split costs ~10 us of Python per call)
    index = [slice(None)] * x.ndim
    parts, start = [], 0
    for size in sizes:
        index[axis] = slice(start, start + size)
        parts.append(x[tuple(index)])
        start += size
    if all(p.flags.c_contiguous for p in parts):
        return tuple(parts)  # (parts of x's memory: a native program keeps them as views)
    # parts across the rows of x (channels of a batch, halves of a last axis): contiguous copies, each
    # one native call, so that a program can replay the node
    copies = tuple(p if p.size == 0 else copy_of_view(p, x, final=False) for p in parts)
    if any(c is None for c in copies):
        return tuple(parts)
    return _native.final(copies) if final else copies


@kernel("Split", since=1, context=True)
def split_1(x, split_input=None, /, *, axis: int = 0, split: tuple = (), ctx: NodeContext):
    # Opset 1 accepted the sizes either as the 'split' attribute or as a second input.
    sizes = _ints(split_input, "Split split") if split_input is not None else list(split)
    return _split(x, axis, sizes, ctx.n_outputs, False, is_constant(split_input))


@kernel("Split", since=2, context=True)
def split_2(x, *, axis: int = 0, split: tuple = (), ctx: NodeContext):
    return _split(x, axis, list(split), ctx.n_outputs, False)


@kernel("Split", since=13, context=True)
def split_13(x, split=None, /, *, axis: int = 0, ctx: NodeContext):
    return _split(x, axis, _ints(split, "Split split"), ctx.n_outputs, False, is_constant(split))


@kernel("Split", since=18, context=True)
def split_18(x, split=None, /, *, axis: int = 0, num_outputs: int | None = None, ctx: NodeContext):
    if split is not None and num_outputs is not None:
        raise ValueError("Split: give either the split input or num_outputs, not both")
    if num_outputs is not None and num_outputs != ctx.n_outputs:
        raise ValueError(f"Split: num_outputs={num_outputs} but node has {ctx.n_outputs} outputs")
    return _split(x, axis, _ints(split, "Split split"), ctx.n_outputs, True, is_constant(split))


def _squeeze(x: np.ndarray, axes: list[int]) -> np.ndarray:
    if not axes:
        return x.reshape([d for d in x.shape if d != 1])
    axes = _axes(axes, x.ndim)
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"Squeeze: dimension {a} has size {x.shape[a]}, not 1")
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


@kernel("Squeeze", since=1)
def squeeze_1(x, *, axes: tuple = ()):
    return _squeeze(x, list(axes))


@kernel("Squeeze", since=13)
def squeeze(x, axes=None, /):
    return _squeeze(x, _ints(axes, "Squeeze axes"))


def _unsqueeze(x: np.ndarray, axes: list[int]) -> np.ndarray:
    if not axes:
        raise ValueError("Unsqueeze: axes must not be empty")
    rank = x.ndim + len(axes)
    axes = sorted(_axes(axes, rank))
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return x.reshape(shape)


@kernel("Unsqueeze", since=1)
def unsqueeze_1(x, *, axes: tuple = ()):
    return _unsqueeze(x, list(axes))


@kernel("Unsqueeze", since=13)
def unsqueeze(x, axes):
    return _unsqueeze(x, _ints(axes, "Unsqueeze axes"))


@kernel("Shape", since=1)
def shape_1(x):
    return np.array(x.shape, dtype=np.int64)


@kernel("Shape", since=15)
def shape(x, *, start: int = 0, end: int | None = None):
    # Python slicing clamps out-of-range start/end exactly as ONNX specifies.
    return np.array(x.shape[start:end], dtype=np.int64)


@kernel("Size", since=1)
def size(x):
    return np.array(x.size, dtype=np.int64)


# --------------------------------------------------------------------------- gather / scatter


@kernel("Gather", since=1, out=True)
def gather(data, indices, *, axis: int = 0, out=None):
    axis = _axis(axis, data.ndim)
    y = gather_copy(data, indices, axis, out)  # (None: the numpy path, which also reports bad indices)
    if y is not None:
        return y
    indices = _normalise_indices(np.asarray(indices), data.shape[axis], "Gather")
    # (np.intp: numpy's index type, 32-bit on 32-bit ARM, where np.take refuses int64 indices)
    y = np.take(data, indices.astype(np.intp, copy=False), axis=axis)
    return y if type(y) is np.ndarray else np.asarray(y)  # (one element of a vector: numpy's scalar)


@kernel("GatherElements", since=11)
def gather_elements(data, indices, *, axis: int = 0):
    axis = _axis(axis, data.ndim)
    if indices.ndim != data.ndim:
        raise ValueError(f"GatherElements: indices rank {indices.ndim} != data rank {data.ndim}")
    indices = _normalise_indices(indices, data.shape[axis], "GatherElements")
    return _take_along(data, indices, axis)


def _take_along(data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    # Unlike np.take_along_axis, ONNX lets indices be smaller than data on
    # non-axis dimensions, so the index grid is built from indices' shape.
    return data[_element_index(indices, axis)]


def _element_index(indices: np.ndarray, axis: int) -> tuple:
    """Open-mesh index tuple addressing data[..., indices[...], ...] elementwise."""
    grid = []
    for d, n in enumerate(indices.shape):
        if d == axis:
            grid.append(indices)
        else:
            shape = [1] * indices.ndim
            shape[d] = n
            grid.append(np.arange(n).reshape(shape))
    return tuple(grid)


def _nd_index(data: np.ndarray, indices: np.ndarray, batch_dims: int, what: str):
    """Flatten GatherND/ScatterND indices into (batch, *coords) advanced-index arrays."""
    k = indices.shape[-1]
    if batch_dims + k > data.ndim:
        raise ValueError(f"{what}: index depth {k} + batch_dims {batch_dims} exceeds data rank {data.ndim}")
    idx = indices.reshape(-1, k).astype(np.int64, copy=False)
    dims = np.array(data.shape[batch_dims:batch_dims + k], dtype=np.int64)
    if idx.size and ((idx < -dims).any() or (idx >= dims).any()):
        raise ValueError(f"{what}: index out of range for data shape {data.shape}")
    idx = np.where(idx < 0, idx + dims, idx)
    return idx, k


@kernel("GatherND", since=11)
def gather_nd_11(data, indices):
    return gather_nd(data, indices, batch_dims=0)


@kernel("GatherND", since=12)
def gather_nd(data, indices, *, batch_dims: int = 0):
    if batch_dims == 0 and indices.ndim and indices.shape[-1] == 1 and data.ndim:
        # one index per row (a boolean mask's NonZero, transposed: detectors' score filters): a take
        # along axis 0, ~10x cheaper than the general advanced index below
        rows = _normalise_indices(indices[..., 0], data.shape[0], "GatherND")
        y = np.take(data, rows, axis=0)
        return y if type(y) is np.ndarray else np.asarray(y)  # (one element of a vector: numpy's scalar)
    batch_shape = data.shape[:batch_dims]
    if indices.shape[:batch_dims] != batch_shape:
        raise ValueError(f"GatherND: batch dims differ ({indices.shape} vs {data.shape})")
    nbatch = math.prod(batch_shape)
    flat_data = data.reshape((nbatch,) + data.shape[batch_dims:])
    idx, k = _nd_index(data, indices, batch_dims, "GatherND")
    per_batch = idx.shape[0] // nbatch if nbatch else 0
    batch_idx = np.repeat(np.arange(nbatch), per_batch)
    picked = flat_data[(batch_idx,) + tuple(idx.T)]
    out_shape = batch_shape + indices.shape[batch_dims:-1] + data.shape[batch_dims + k:]
    return picked.reshape(out_shape)


_REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter(out: np.ndarray, index: tuple, updates: np.ndarray, reduction: str, what: str) -> np.ndarray:
    if reduction == "none":
        out[index] = updates
        return out
    ufunc = _REDUCTIONS.get(reduction)
    if ufunc is None:
        raise ValueError(f"{what}: unknown reduction {reduction!r}")
    ufunc.at(out, index, updates)
    return out


def _rows_of(indices: np.ndarray, axis: int) -> np.ndarray | None:
    """``indices``' values along ``axis`` when they are the same along every other axis by construction
    (zero strides there: an Expand of a column), else None."""
    if indices.ndim < 2 or indices.size == 0:
        return None
    for d, (n, stride) in enumerate(zip(indices.shape, indices.strides)):
        if d != axis and n > 1 and stride != 0:
            return None
    return indices[tuple(slice(None) if d == axis else 0 for d in range(indices.ndim))]


def _scatter_elements(data, indices, updates, axis: int, reduction: str) -> np.ndarray:
    axis = _axis(axis, data.ndim)
    if indices.shape != updates.shape:
        raise ValueError(f"ScatterElements: indices shape {indices.shape} != updates shape {updates.shape}")
    if indices.ndim != data.ndim:
        raise ValueError(f"ScatterElements: indices rank {indices.ndim} != data rank {data.ndim}")
    for d, (n, size) in enumerate(zip(indices.shape, data.shape)):
        if d != axis and n > size:
            raise ValueError(f"ScatterElements: indices shape {indices.shape} exceeds data shape {data.shape} on "
                             f"axis {d}")
    if indices.size == 0:
        if reduction not in ("none", *_REDUCTIONS):
            raise ValueError(f"ScatterElements: unknown reduction {reduction!r}")
        return data  # nothing moves (values are immutable: the input itself is the result)
    rows = _rows_of(indices, axis)
    if rows is not None:
        # every element of updates' slice k along `axis` goes to the same data slice rows[k]: whole
        # slices move (out[:, rows[k], :] = updates[:, k, :] for axis 1), one fancy index on one axis
        rows = _normalise_indices(rows, data.shape[axis], "ScatterElements")
        if (reduction == "none" and rows.size == data.shape[axis] and indices.shape == data.shape
                and updates.dtype == data.dtype
                and np.array_equal(np.bincount(rows, minlength=rows.size), np.ones(rows.size, np.int64))):
            # a permutation of whole slices overwrites every element of data: the result is updates
            # reordered (slice rows[k] = updates' slice k), one gather, data never read
            return np.take(updates, np.argsort(rows), axis=axis)
        index = tuple(rows if d == axis else slice(0, n) for d, n in enumerate(indices.shape))
        return _scatter(data.copy(), index, updates, reduction, "ScatterElements")
    indices = _normalise_indices(indices, data.shape[axis], "ScatterElements")
    return _scatter(data.copy(), _element_index(indices, axis), updates, reduction, "ScatterElements")


@kernel("ScatterElements", since=11)
def scatter_elements_11(data, indices, updates, *, axis: int = 0):
    return _scatter_elements(data, indices, updates, axis, "none")


@kernel("ScatterElements", since=16)
def scatter_elements(data, indices, updates, *, axis: int = 0, reduction: str = "none"):
    return _scatter_elements(data, indices, updates, axis, reduction)


def _scatter_nd(data, indices, updates, reduction: str) -> np.ndarray:
    idx, k = _nd_index(data, indices, 0, "ScatterND")
    expected = indices.shape[:-1] + data.shape[k:]
    if updates.shape != expected:
        raise ValueError(f"ScatterND: updates shape {updates.shape}, expected {expected}")
    flat_updates = updates.reshape((idx.shape[0],) + data.shape[k:])
    return _scatter(data.copy(), tuple(idx.T), flat_updates, reduction, "ScatterND")


@kernel("ScatterND", since=11)
def scatter_nd_11(data, indices, updates):
    return _scatter_nd(data, indices, updates, "none")


@kernel("ScatterND", since=16)
def scatter_nd(data, indices, updates, *, reduction: str = "none"):
    return _scatter_nd(data, indices, updates, reduction)


# --------------------------------------------------------------------------- slicing / copying


def _slice(x: np.ndarray, starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int] | None,
           final: bool = True):
    """``final``: starts, ends, axes and steps are constants: a copy may be declared the node's result."""
    if len(starts) != len(ends):
        raise ValueError(f"Slice: {len(starts)} starts but {len(ends)} ends")
    axes = list(range(len(starts))) if not axes else _axes(axes, x.ndim, "Slice axes")
    steps = steps or [1] * len(starts)
    if len(axes) != len(starts) or len(steps) != len(starts):
        raise ValueError("Slice: starts, ends, axes and steps must have the same length")
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise ValueError("Slice: step must not be 0")
        # ONNX clamping of start/end matches Python slice semantics for every sign
        # of start, end and step, so a plain slice object is exact.
        index[a] = slice(s, e, st)
    view = x[tuple(index)]
    if view.flags.c_contiguous or view.size == 0:
        return view  # (a part of x's memory, as is)
    y = copy_of_view(view, x, final=final)  # rows of x: one native copy, which a program can replay
    return view if y is None else y


@kernel("Slice", since=1)
def slice_1(x, *, axes: tuple = (), ends: tuple = (), starts: tuple = ()):
    return _slice(x, list(starts), list(ends), list(axes), None)


@kernel("Slice", since=10)
def slice_(x, starts, ends, axes=None, steps=None, /):
    return _slice(
        x,
        _ints(starts, "Slice starts"),
        _ints(ends, "Slice ends"),
        _ints(axes, "Slice axes") if axes is not None else None,
        _ints(steps, "Slice steps") if steps is not None else None,
        is_constant(starts, ends, axes, steps),
    )


@kernel("Expand", since=8)
def expand(x, shape):
    target = _ints(shape, "Expand shape")
    try:
        out_shape = np.broadcast_shapes(x.shape, tuple(target))
    except ValueError:
        raise ValueError(f"Expand: shape {x.shape} cannot broadcast to {target}") from None
    check_alloc(out_shape, x.dtype, "Expand output")
    view = np.broadcast_to(x, out_shape)
    if _native.available and _native.recording():
        # a native program records: the copy through an index map is what a replay runs (declared the
        # node's result only for a constant shape)
        y = copy_of_view(view, x, final=is_constant(shape))
        if y is not None:
            return y
    # Otherwise a read-only view with zero strides along the broadcast axes, not a copy: consumers
    # that need contiguous memory copy it themselves (kernels never write into an input), and one that
    # can use the repetition does (ScatterElements with indices expanded from a column: torchvision's
    # MultiScaleRoIAlign, 150 x 12544 int64 indices built for nothing otherwise).  The session copies
    # a read-only result before returning it as an output.
    return view


@kernel("Tile", since=6)
def tile(x, repeats):
    reps = _ints(repeats, "Tile repeats")
    if len(reps) != x.ndim or min(reps, default=0) < 0:
        raise ValueError(f"Tile: repeats {reps} must be {x.ndim} non-negative values")
    check_alloc([d * r for d, r in zip(x.shape, reps)], x.dtype, "Tile output")
    y = tile_copy(x, reps, is_constant(repeats)) if min(reps, default=0) > 0 else None
    return np.tile(x, reps) if y is None else y


_NP_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad(x: np.ndarray, pads: list[int], mode: str, value, axes: list[int] | None, final: bool = True) -> np.ndarray:
    """``final``: pads, value and axes are constants: the native copy may be declared the node's result."""
    np_mode = _NP_PAD_MODES.get(mode)
    if np_mode is None:
        raise ValueError(f"Pad: unsupported mode {mode!r}")
    axes = list(range(x.ndim)) if axes is None else _axes(axes, x.ndim, "Pad axes")
    if len(pads) != 2 * len(axes):
        raise ValueError(f"Pad: expected {2 * len(axes)} pad values, got {len(pads)}")
    width = [[0, 0] for _ in range(x.ndim)]
    for i, a in enumerate(axes):
        width[a] = [pads[i], pads[i + len(axes)]]
    for d, (b, e) in enumerate(width):
        if x.shape[d] + b + e < 0:
            raise ValueError(f"Pad: pads {b} and {e} on axis {d} of size {x.shape[d]} would give a negative size")
    # Negative pads crop; crop first so reflect/edge/wrap read the kept data.
    crop = tuple(slice(max(-b, 0), x.shape[d] - max(-e, 0)) for d, (b, e) in enumerate(width))
    whole, x = x, x[crop]
    grow = [(max(b, 0), max(e, 0)) for b, e in width]
    check_alloc([n + b + e for n, (b, e) in zip(x.shape, grow)], x.dtype, "Pad output")
    if not any(b or e for b, e in grow):
        return x.copy()
    if np_mode != "constant":
        if x.size == 0:
            raise ValueError(f"Pad: mode {mode!r} needs a non-empty input")
        if np_mode == "reflect":
            for d, (b, e) in enumerate(grow):
                if (b or e) and max(b, e) >= x.shape[d]:
                    raise ValueError(f"Pad: reflect pad {max(b, e)} must be smaller than dimension {x.shape[d]}")
    if x.size:  # (one native copy from the uncropped input, which a program can replay)
        y = pad_copy(whole, [tuple(w) for w in width], np_mode, value, final)
        if y is not None:
            return y
    if np_mode == "constant":
        return np.pad(x, grow, mode="constant", constant_values=x.dtype.type(value))
    return np.pad(x, grow, mode=np_mode)


@kernel("Pad", since=2)
def pad_2(x, *, mode: str = "constant", pads: tuple = (), value: float = 0.0):
    return _pad(x, list(pads), mode, value, None)


def _pad_value(x: np.ndarray, constant_value):
    if constant_value is None or np.asarray(constant_value).size == 0:
        return 0
    return np.asarray(constant_value).reshape(-1)[0]


@kernel("Pad", since=11)
def pad_11(x, pads, constant_value=None, /, *, mode: str = "constant"):
    return _pad(x, _ints(pads, "Pad pads"), mode, _pad_value(x, constant_value), None,
                is_constant(pads, constant_value))


@kernel("Pad", since=18)
def pad(x, pads, constant_value=None, axes=None, /, *, mode: str = "constant"):
    # Opset 18 adds the axes input; opset 19 adds mode="wrap" (handled by _pad too).
    ax = _ints(axes, "Pad axes") if axes is not None else None
    return _pad(x, _ints(pads, "Pad pads"), mode, _pad_value(x, constant_value), ax,
                is_constant(pads, constant_value, axes))


@kernel("ConstantOfShape", since=9)
def constant_of_shape(shape, *, value: np.ndarray | None = None):
    dims = _ints(shape, "ConstantOfShape shape")
    if any(d < 0 for d in dims):
        raise ValueError(f"ConstantOfShape: negative dimension in {dims}")
    check_alloc(dims, np.float32 if value is None else np.asarray(value).dtype, "ConstantOfShape output")
    if value is None:
        return np.zeros(dims, dtype=np.float32)
    value = np.asarray(value)
    if value.size != 1:
        raise ValueError(f"ConstantOfShape: value must hold one element, got shape {value.shape}")
    if value.dtype.kind in "biuf" and not any(value.tobytes()):
        # all-zero bits (0, 0.0, False; not -0.0): calloc's pages, zeroed by the OS when first touched,
        # instead of writing every element now (Faster R-CNN's 7.5 MB RoI result, overwritten whole)
        return np.zeros(dims, dtype=value.dtype)
    return np.full(dims, value.reshape(()), dtype=value.dtype)


@kernel("Range", since=11)
def range_(start, limit, delta):
    dtype = np.asarray(start).dtype
    s, lim, d = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    if d == 0:
        raise ValueError("Range: delta must not be 0")
    if dtype.kind in "iu":
        n = max(-(-(int(lim) - int(s)) // int(d)), 0)
        check_alloc((n,), np.int64, "Range output")
        return (int(s) + np.arange(n, dtype=np.int64) * int(d)).astype(dtype)
    n = max(int(math.ceil((float(lim) - float(s)) / float(d))), 0)
    check_alloc((n,), dtype, "Range output")
    return (s + np.arange(n, dtype=dtype) * d).astype(dtype, copy=False)


@kernel("NonZero", since=9)
def non_zero(x):
    if x.ndim == 0:
        return np.zeros((0, int(bool(x))), dtype=np.int64)
    return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


def _topk_row(x: np.ndarray, k: int, largest: int) -> tuple | None:
    """TopK of one row of floats without NaN (else None): the k-th value by partition, then a stable sort
    of the candidates at or beyond it only (ties at the k-th value included, so the lower indices win
    as in the full sort).  -x orders the largest first with ties kept in index order."""
    key = -x if largest else x
    if k == 0 or np.isnan(key).any():
        return None
    kth = np.partition(key, k - 1)[k - 1]
    cand = np.flatnonzero(key <= kth)
    idx = cand[np.argsort(key[cand], kind="stable")[:k]]
    return x[idx], idx.astype(np.int64, copy=False)


def _topk(x: np.ndarray, k: int, axis: int, largest: int, sorted_: int) -> tuple:
    axis = _axis(axis, x.ndim)
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"TopK: k={k} outside [0, {n}]")
    if x.size == n and x.dtype.kind == "f" and 0 < k < n // 2:
        found = _topk_row(x.reshape(-1), k, largest)
        if found is not None:
            shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
            return found[0].reshape(shape), found[1].reshape(shape)
    # Stable sorts make ties come out in ascending index order, as onnxruntime does.
    if largest:
        rev = np.flip(x, axis)
        order = np.flip(np.argsort(rev, axis=axis, kind="stable"), axis)
        order = (n - 1) - order
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    values = np.take_along_axis(x, idx, axis=axis)
    # sorted=0 allows any order; sorted output is a valid choice.
    return values, idx.astype(np.int64, copy=False)


@kernel("TopK", since=1)
def topk_1(x, *, axis: int = -1, k: int | None = None):
    if k is None:
        raise ValueError("TopK: the 'k' attribute is required")
    return _topk(x, k, axis, 1, 1)


@kernel("TopK", since=10)
def topk_10(x, k, *, axis: int = -1):
    return _topk(x, _scalar_int(k, "TopK k"), axis, 1, 1)


@kernel("TopK", since=11)
def topk(x, k, *, axis: int = -1, largest: int = 1, sorted: int = 1):  # noqa: A002
    return _topk(x, _scalar_int(k, "TopK k"), axis, largest, sorted)


@kernel("OneHot", since=9)
def one_hot(indices, depth, values, *, axis: int = -1):
    d = np.asarray(depth).reshape(-1)
    if d.size != 1:
        raise ValueError("OneHot: depth must be a scalar or one-element tensor")
    depth_i = int(d[0])
    if depth_i < 1:
        raise ValueError(f"OneHot: depth must be positive, got {depth_i}")
    values = np.asarray(values).reshape(-1)
    if values.size != 2:
        raise ValueError("OneHot: values must be [off_value, on_value]")
    rank = indices.ndim + 1
    if not -rank <= axis < rank:
        raise ValueError(f"OneHot: axis {axis} out of range for output rank {rank}")
    axis = axis + rank if axis < 0 else axis
    out_shape = list(indices.shape)
    out_shape.insert(axis, depth_i)
    check_alloc(out_shape, values.dtype, "OneHot output")
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + depth_i, idx)  # out-of-range stays all off_value
    hot = np.expand_dims(idx, axis) == np.arange(depth_i).reshape([depth_i if i == axis else 1 for i in range(rank)])
    return np.where(hot, values[1], values[0]).astype(values.dtype, copy=False)


@kernel("CumSum", since=11)
def cum_sum(x, axis, *, exclusive: int = 0, reverse: int = 0):
    a = _axis(_scalar_int(axis, "CumSum axis"), x.ndim)
    src = np.flip(x, a) if reverse else x
    out = np.cumsum(src, axis=a, dtype=x.dtype)
    if exclusive:
        # Shift by one along the axis: out[i] = sum of elements before i.
        shifted = np.zeros_like(out)
        dst = [slice(None)] * x.ndim
        srcs = [slice(None)] * x.ndim
        dst[a], srcs[a] = slice(1, None), slice(None, -1)
        shifted[tuple(dst)] = out[tuple(srcs)]
        out = shifted
    return np.flip(out, a).copy() if reverse else out


@kernel("Trilu", since=14)
def trilu(x, k=None, /, *, upper: int = 1):
    if x.ndim < 2:
        raise ValueError(f"Trilu: input rank must be >= 2, got {x.ndim}")
    kk = 0 if k is None else _scalar_int(k, "Trilu k")
    return np.triu(x, kk) if upper else np.tril(x, kk)


@kernel("EyeLike", since=9)
def eye_like(x, *, dtype: int | None = None, k: int = 0):
    if x.ndim != 2:
        raise ValueError(f"EyeLike: input must be 2-D, got rank {x.ndim}")
    out_dtype = x.dtype if dtype is None else _dtype_from_code(dtype, "EyeLike")
    return np.eye(x.shape[0], x.shape[1], k, dtype=out_dtype)


def _depth_to_space(x: np.ndarray, blocksize: int, mode: str) -> np.ndarray:
    if x.ndim != 4:
        raise ValueError(f"DepthToSpace: input must be 4-D, got rank {x.ndim}")
    n, c, h, w = x.shape
    b = blocksize
    if b <= 0 or c % (b * b):
        raise ValueError(f"DepthToSpace: channels {c} not divisible by blocksize^2 ({b}^2)")
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"DepthToSpace: mode must be 'DCR' or 'CRD', got {mode!r}")
    shape = (n, c // (b * b), h * b, w * b)
    copy = copy_of_view(y, x, shape=shape)
    return y.reshape(shape) if copy is None else copy


@kernel("DepthToSpace", since=1)
def depth_to_space_1(x, *, blocksize: int = 0):
    return _depth_to_space(x, blocksize, "DCR")


@kernel("DepthToSpace", since=11)
def depth_to_space(x, *, blocksize: int = 0, mode: str = "DCR"):
    return _depth_to_space(x, blocksize, mode)


def _space_to_depth(x: np.ndarray, blocksize: int, mode: str) -> np.ndarray:
    if x.ndim != 4:
        raise ValueError(f"SpaceToDepth: input must be 4-D, got rank {x.ndim}")
    n, c, h, w = x.shape
    b = blocksize
    if b <= 0 or h % b or w % b:
        raise ValueError(f"SpaceToDepth: spatial dims {h}x{w} not divisible by blocksize {b}")
    y = x.reshape(n, c, h // b, b, w // b, b)
    if mode == "DCR":
        y = y.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        y = y.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"SpaceToDepth: mode must be 'DCR' or 'CRD', got {mode!r}")
    shape = (n, c * b * b, h // b, w // b)
    copy = copy_of_view(y, x, shape=shape)
    return y.reshape(shape) if copy is None else copy


@kernel("SpaceToDepth", since=1)
def space_to_depth_1(x, *, blocksize: int = 0):
    return _space_to_depth(x, blocksize, "DCR")


@kernel("SpaceToDepth", since=28)
def space_to_depth(x, *, blocksize: int = 0, mode: str = "DCR"):
    return _space_to_depth(x, blocksize, mode)


# --------------------------------------------------------------------------- Resize / Upsample
#
# Resize is separable: every ONNX mode (nearest, linear, cubic) computes an
# output element from input coordinates obtained independently per axis, so
# the kernel resizes one axis at a time.  Coordinates and weights are computed
# in float32 as onnxruntime does, so nearest-neighbour ties round identically.

_COORD_MODES = frozenset({
    "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
    "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize",
})
_NEAREST_MODES = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"})


def _original_coords(out_len: int, in_len: int, scale: np.float32, mode: str,
                     roi_start: float, roi_end: float) -> np.ndarray:
    """Input-space coordinate (float32) of every output index along one axis."""
    f = np.float32
    x = np.arange(out_len, dtype=f)
    if mode == "half_pixel":
        return (x + f(0.5)) / scale - f(0.5)
    if mode == "half_pixel_symmetric":
        adjustment = f(out_len) / (scale * f(in_len))
        offset = f(in_len) / f(2) * (f(1) - adjustment)
        return offset + (x + f(0.5)) / scale - f(0.5)
    if mode == "pytorch_half_pixel":
        return (x + f(0.5)) / scale - f(0.5) if out_len > 1 else np.zeros(out_len, dtype=f)
    if mode == "align_corners":
        # length_resized is in_len * scale: fractional when the output size
        # came from a scale that does not divide evenly (the ONNX reference
        # and conformance data use it so); equal to out_len for given sizes.
        length_resized = f(in_len) * scale
        if out_len == 1 or length_resized == f(1):
            return np.zeros(out_len, dtype=f)
        return x * (f(in_len - 1) / (length_resized - f(1)))
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + f(0.5)) / scale
    if mode == "tf_crop_and_resize":
        start, end = f(roi_start), f(roi_end)
        if out_len > 1:
            return start * f(in_len - 1) + x * ((end - start) * f(in_len - 1) / f(out_len - 1))
        return np.full(out_len, f(0.5) * (start + end) * f(in_len - 1), dtype=f)
    raise ValueError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _nearest_index(coords: np.ndarray, nearest_mode: str, downsample: bool) -> np.ndarray:
    if nearest_mode == "round_prefer_floor":
        idx = np.ceil(coords - np.float32(0.5))
    elif nearest_mode == "round_prefer_ceil":
        idx = np.floor(coords + np.float32(0.5))
    elif nearest_mode == "floor":
        idx = np.floor(coords)
    elif nearest_mode == "ceil":
        idx = np.ceil(coords)
    else:  # "simple": opset-10 Resize and Upsample (ceil when shrinking, truncate otherwise)
        idx = np.ceil(coords) if downsample else np.trunc(coords)
    return idx.astype(np.int64)


def _cubic_weights(s: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic weights for the 4 taps at offsets -1, 0, 1, 2 from floor(x); shape (n, 4)."""
    f = np.float32
    a = f(a)
    d = np.stack([s + 1, s, 1 - s, 2 - s], axis=1).astype(f)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, far)


def _along(w: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """Reshape a per-output-index vector so it broadcasts along ``axis``."""
    shape = [1] * ndim
    shape[axis] = w.shape[0]
    return w.reshape(shape)


def _resize_axis(x: np.ndarray, axis: int, out_len: int, scale: np.float32, mode: str, coord_mode: str,
                 nearest_mode: str, cubic_a: float, exclude_outside: int, extrapolation_value: float,
                 roi: tuple[float, float], antialias: int) -> np.ndarray:
    in_len = x.shape[axis]
    coords = _original_coords(out_len, in_len, scale, coord_mode, roi[0], roi[1])
    if out_len == 0 or in_len == 0:
        shape = list(x.shape)
        shape[axis] = out_len
        return np.zeros(shape, dtype=x.dtype)
    if mode == "nearest":
        idx = np.clip(_nearest_index(coords, nearest_mode, scale < 1), 0, in_len - 1)
        y = np.take(x, idx.astype(np.intp, copy=False), axis=axis)
    elif antialias and scale < 1:
        y = _resize_axis_antialias(x, axis, coords, scale, mode, cubic_a, exclude_outside)
    elif mode == "linear":
        c = coords if coord_mode == "tf_crop_and_resize" else np.clip(coords, 0, in_len - 1)
        lo = np.floor(c)
        w1 = (c - lo).astype(np.float32)
        i0 = np.clip(lo.astype(np.intp), 0, in_len - 1)  # (np.intp: what np.take takes on 32-bit numpy too)
        i1 = np.clip(i0 + 1, 0, in_len - 1)
        xf = x if x.dtype.kind == "f" else x.astype(np.float32)
        w1 = _along(w1.astype(xf.dtype), axis, x.ndim)
        a0 = np.take(xf, i0, axis=axis)
        y = a0 + (np.take(xf, i1, axis=axis) - a0) * w1
    elif mode == "cubic":
        lo = np.floor(coords)
        w = _cubic_weights(coords - lo, cubic_a)
        taps = lo.astype(np.intp)[:, None] + np.arange(-1, 3, dtype=np.intp)[None, :]
        if exclude_outside:
            w = np.where((taps >= 0) & (taps < in_len), w, np.float32(0))
            w = w / w.sum(axis=1, keepdims=True)
        taps = np.clip(taps, 0, in_len - 1)
        xf = x if x.dtype.kind == "f" else x.astype(np.float32)
        w = w.astype(xf.dtype)
        y = sum(np.take(xf, taps[:, j], axis=axis) * _along(w[:, j], axis, x.ndim) for j in range(4))
    else:
        raise ValueError(f"Resize: unknown mode {mode!r}")
    if coord_mode == "tf_crop_and_resize":
        outside = (coords < 0) | (coords > in_len - 1)
        if outside.any():
            y = np.where(_along(outside, axis, x.ndim), np.asarray(extrapolation_value, dtype=y.dtype), y)
    return y


def _resize_axis_antialias(x: np.ndarray, axis: int, coords: np.ndarray, scale: np.float32, mode: str,
                           cubic_a: float, exclude_outside: int) -> np.ndarray:
    """Downsampling with the interpolation filter stretched by 1/scale (antialias=1).

    The filter support grows with the downscale factor, so each output mixes
    many inputs; the weights form a dense (out, in) matrix applied as a matmul.
    Taps past the border are clamped to the edge sample (or dropped with
    exclude_outside=1), and every row of weights is normalised to sum to 1.
    """
    in_len = x.shape[axis]
    reach = int(math.ceil((1.0 if mode == "linear" else 2.0) / float(scale))) + 1
    taps = np.arange(-reach, in_len + reach)
    dist = np.abs((taps[None, :] - coords.astype(np.float64)[:, None]) * float(scale))
    if mode == "linear":
        w = np.maximum(0.0, 1.0 - dist)
    else:
        a = float(cubic_a)
        w = np.where(dist <= 1, ((a + 2) * dist - (a + 3)) * dist * dist + 1,
                     np.where(dist < 2, ((a * dist - 5 * a) * dist + 8 * a) * dist - 4 * a, 0.0))
    if exclude_outside:
        w = np.where((taps >= 0) & (taps < in_len), w, 0.0)
    total = w.sum(axis=1, keepdims=True)
    w = w / np.where(total == 0, 1.0, total)
    # Fold the virtual border taps onto the edge samples.
    dense = np.zeros((coords.shape[0], in_len))
    np.add.at(dense.T, np.clip(taps, 0, in_len - 1), w.T)
    xf = x if x.dtype.kind == "f" else x.astype(np.float32)
    moved = np.moveaxis(xf, axis, -1)
    return np.moveaxis(moved @ dense.T.astype(xf.dtype), -1, axis)


_U64_PAIR = np.uint64(0x100000001)


@functools.lru_cache(maxsize=256)
def _repeat_factors(in_shape: tuple, out_shape: tuple, scales: tuple, coord_mode: str,
                    nearest_mode: str) -> tuple[int, int] | None:
    """(fh, fw) when nearest resizing ``in_shape`` -> ``out_shape`` is plain repetition of the last two axes.

    That is: every other axis is unchanged, the last two grow by integer
    factors (not both 1), and the nearest index the general code computes
    along each of them is exactly ``i // factor`` (e.g. 2x asymmetric/floor,
    the FPN upsampling of detection models), so repeating is bit-identical to
    the general path.  None otherwise.  A pure function of its (hashable)
    arguments, computed once per geometry.
    """
    nd = len(in_shape)
    if nd < 2 or 0 in in_shape:
        return None
    if any(out_shape[a] != in_shape[a] or scales[a] != 1 for a in range(nd - 2)):
        return None
    factors = []
    for a in (nd - 2, nd - 1):
        i_len, o_len = in_shape[a], out_shape[a]
        if o_len < i_len or o_len % i_len:
            return None
        f = o_len // i_len
        if f > 1:
            scale = np.float32(scales[a])
            coords = _original_coords(o_len, i_len, scale, coord_mode, 0.0, 1.0)
            idx = np.clip(_nearest_index(coords, nearest_mode, scale < 1), 0, i_len - 1)
            if not np.array_equal(idx, np.arange(o_len) // f):
                return None
        elif scales[a] != 1:
            return None
        factors.append(f)
    return None if factors == [1, 1] else (factors[0], factors[1])


def _repeat(x: np.ndarray, out_shape: tuple, fh: int, fw: int, out=None) -> np.ndarray:
    """``x`` with every pixel of its last two axes repeated fh x fw times: a fresh array, or ``out`` (the
    memory plan's buffer) on the native float32 path when it fits exactly and overlaps ``x`` nowhere.

    The caller has checked ``out_shape`` against the allocation limit.

    float32 goes through one native pass (``mrt_upsample_nearest_f32``: each
    output row built once, then copied); otherwise columns are doubled with
    one integer multiply (a 4-byte value v becomes the 8-byte pair (v, v)) or
    ``np.repeat``, and rows by one broadcast copy.
    """
    if x.dtype == np.float32 and _native.available:
        if (out is not None and out.shape == out_shape and out.dtype == np.float32 and out.flags.c_contiguous
                and not np.may_share_memory(x, out)):
            y = out
        else:
            y = np.empty(out_shape, dtype=np.float32)
        _native.upsample_nearest(np.ascontiguousarray(x), y, fh, fw)
        return y
    h, w = x.shape[-2:]
    if fw == 1:
        row = x
    elif fw == 2 and x.dtype.itemsize == 4:
        xc = np.ascontiguousarray(x)
        row = (xc.view(np.uint32).astype(np.uint64) * _U64_PAIR).view(x.dtype)
    else:
        row = np.repeat(x, fw, axis=-1)
    if fh == 1:
        return row if row is not x else x.copy()
    y = np.empty(x.shape[:-2] + (h, fh, w * fw), dtype=x.dtype)
    y[...] = row[..., :, None, :]
    return y.reshape(out_shape)


def _resize(x: np.ndarray, out_shape: list[int], scales: list[float], *, mode: str, coord_mode: str,
            nearest_mode: str, cubic_a: float = -0.75, exclude_outside: int = 0,
            extrapolation_value: float = 0.0, roi: list[tuple[float, float]] | None = None,
            antialias: int = 0, out=None) -> np.ndarray:
    """``out``: the memory plan's buffer, which the repeat path's native pass fills when it fits."""
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"Resize: mode must be nearest, linear or cubic, got {mode!r}")
    if coord_mode not in _COORD_MODES:
        raise ValueError(f"Resize: unknown coordinate_transformation_mode {coord_mode!r}")
    if nearest_mode not in _NEAREST_MODES:
        raise ValueError(f"Resize: unknown nearest_mode {nearest_mode!r}")
    if mode == "nearest" and not antialias and coord_mode != "tf_crop_and_resize":
        # Refuse a hostile size before the coordinate arrays or the output are allocated.
        check_alloc(out_shape, x.dtype, "Resize output")
        check_alloc((max(out_shape[-2:], default=0),), np.float64, "Resize coordinates")
        factors = _repeat_factors(x.shape, tuple(out_shape), tuple(scales), coord_mode, nearest_mode)
        if factors is not None:
            return _repeat(x, tuple(out_shape), *factors, out)
    # float16 is interpolated in float32 and rounded once at the end, as onnxruntime does.
    y = x.astype(np.float32) if x.dtype == np.float16 and mode != "nearest" else x
    for axis in range(x.ndim):
        same = out_shape[axis] == x.shape[axis] and scales[axis] == 1
        if same and coord_mode != "tf_crop_and_resize":
            continue  # every other transformation is the identity at scale 1
        r = roi[axis] if roi else (0.0, 1.0)
        step_shape = list(y.shape)
        step_shape[axis] = out_shape[axis]
        check_alloc(step_shape, y.dtype if mode == "nearest" else np.result_type(y.dtype, np.float32), "Resize output")
        check_alloc((out_shape[axis],), np.float64, "Resize coordinates")
        y = _resize_axis(y, axis, out_shape[axis], np.float32(scales[axis]), mode, coord_mode, nearest_mode,
                         cubic_a, exclude_outside, extrapolation_value, r, antialias)
    if y.dtype != x.dtype and x.dtype.kind == "f":
        y = y.astype(x.dtype)
    elif y.dtype != x.dtype:
        # Integer images: truncate the float interpolation (as onnxruntime does)
        # and saturate to the type's range.
        info = np.iinfo(x.dtype)
        y = np.clip(np.trunc(y), info.min, info.max).astype(x.dtype)
    return y if y is not x else x.copy()


def _shape_from_scales(x: np.ndarray, scales: list[float]) -> list[int]:
    if len(scales) != x.ndim:
        raise ValueError(f"Resize: {len(scales)} scales for input rank {x.ndim}")
    if not all(s > 0 and math.isfinite(s) for s in scales):  # (a NaN fails s > 0)
        raise ValueError(f"Resize: scales must be positive and finite, got {scales}")
    # onnxruntime truncates float32(in_dim) * scale.
    with np.errstate(over="ignore"):
        sizes = [np.float32(d) * np.float32(s) for d, s in zip(x.shape, scales)]
    if not all(map(math.isfinite, sizes)):
        raise ValueError(f"Resize: scales {scales} on input shape {list(x.shape)} overflow float32")
    return [int(v) for v in sizes]


def _floats(value) -> list[float]:
    return [] if value is None else [float(v) for v in np.asarray(value, dtype=np.float32).reshape(-1)]


# Resize nodes that turned out to be plain repetition (_repeat_factors), by everything that decided it:
# (input shape, dtype, scales, sizes, axes, policy, coordinate mode, nearest mode) -> (output shape, fh, fw).
# A hit skips resolving the scales/sizes inputs again: on small tensors that Python work cost more
# than the copy itself.  Bounded: cleared when full (shapes may vary from run to run).
_REPEAT_PLANS: dict = {}
_REPEAT_PLANS_MAX = 256


def _plan_key_part(value):
    """A hashable stand-in for a scales/sizes input (its exact bytes), or None when absent."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value.dtype.str, value.shape, value.tobytes()
    return tuple(np.asarray(value).reshape(-1).tolist())


def _resize_from_inputs(x, roi, scales, sizes, *, axes, policy: str, out=None, **kw) -> np.ndarray:
    """Resolve roi/scales/sizes (optionally restricted to ``axes``) and resize (into ``out`` on the
    repeat path's native pass, see :func:`_repeat`)."""
    key = None
    if kw["mode"] == "nearest" and not kw.get("antialias") and kw["coord_mode"] != "tf_crop_and_resize":
        key = (x.shape, x.dtype.str, _plan_key_part(scales), _plan_key_part(sizes),
               None if axes is None else tuple(axes), policy, kw["coord_mode"], kw["nearest_mode"])
        plan = _REPEAT_PLANS.get(key)
        if plan is not None:
            out_shape, fh, fw = plan
            check_alloc(out_shape, x.dtype, "Resize output")
            # (every caller returns it as is: with its one native pass (float32), a program may replay it)
            return _native.final(_repeat(x, out_shape, fh, fw, out))
    out_shape, full_scales, roi_pairs = _resolve_resize_inputs(x, roi, scales, sizes, axes, policy, kw["coord_mode"])
    y = _resize(x, out_shape, full_scales, roi=roi_pairs, out=out, **kw)
    if key is not None:
        # _resize succeeded (attributes valid); the factors are cached by geometry, so this is a lookup
        factors = _repeat_factors(x.shape, tuple(out_shape), tuple(full_scales), kw["coord_mode"], kw["nearest_mode"])
        if factors is not None:
            if len(_REPEAT_PLANS) >= _REPEAT_PLANS_MAX:
                _REPEAT_PLANS.clear()
            _REPEAT_PLANS[key] = (tuple(out_shape),) + factors
            # (y came from _repeat, as the later calls' does: on float32 one native pass, replayable)
            return _native.final(y) if x.dtype == np.float32 and _native.available else y
    return y


def _resolve_resize_inputs(x, roi, scales, sizes, axes, policy: str, coord_mode: str):
    """(output shape, scale per axis, roi pairs or None) from Resize's roi/scales/sizes inputs."""
    rank = x.ndim
    axes_l = list(range(rank)) if not axes else _axes(list(axes), rank, "Resize axes")
    k = len(axes_l)
    scales_l, sizes_l = _floats(scales), _ints(sizes, "Resize sizes")
    if bool(scales_l) == bool(sizes_l):
        raise ValueError("Resize: exactly one of scales and sizes must be given")
    full_scales = [1.0] * rank
    out_shape = list(x.shape)
    if scales_l:
        if len(scales_l) != k:
            raise ValueError(f"Resize: {len(scales_l)} scales for {k} axes")
        for a, s in zip(axes_l, scales_l):
            full_scales[a] = s
        out_shape = _shape_from_scales(x, full_scales)
    else:
        if len(sizes_l) != k:
            raise ValueError(f"Resize: {len(sizes_l)} sizes for {k} axes")
        if min(sizes_l) < 1:  # (onnxruntime: a size of 0 is a scale of 0, which it refuses too)
            raise ValueError(f"Resize: sizes {sizes_l} must be positive")
        if policy == "stretch":
            for a, s in zip(axes_l, sizes_l):
                out_shape[a] = s
                full_scales[a] = float(np.float32(s) / np.float32(x.shape[a]))
        elif policy in ("not_larger", "not_smaller"):
            ratios = [np.float32(s) / np.float32(x.shape[a]) for a, s in zip(axes_l, sizes_l)]
            common = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes_l:
                out_shape[a] = int(math.floor(float(common) * x.shape[a] + 0.5))
                full_scales[a] = float(common)
        else:
            raise ValueError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
    roi_pairs = None
    if coord_mode == "tf_crop_and_resize":
        r = _floats(roi)
        if len(r) != 2 * k:
            raise ValueError(f"Resize: roi needs {2 * k} values for tf_crop_and_resize, got {len(r)}")
        roi_pairs = [(0.0, 1.0)] * rank
        for i, a in enumerate(axes_l):
            roi_pairs[a] = (r[i], r[i + k])
    return out_shape, full_scales, roi_pairs


@kernel("Resize", since=10)
def resize_10(x, scales, *, mode: str = "nearest"):
    # Opset 10 has no coordinate_transformation_mode: coordinates are asymmetric
    # and nearest uses the historical "simple" rounding.
    return _resize(x, _shape_from_scales(x, _floats(scales)), _floats(scales), mode=mode,
                   coord_mode="asymmetric", nearest_mode="simple")


@kernel("Resize", since=11, out=True)
def resize_11(x, roi=None, scales=None, sizes=None, /, *, coordinate_transformation_mode: str = "half_pixel",
              cubic_coeff_a: float = -0.75, exclude_outside: int = 0, extrapolation_value: float = 0.0,
              mode: str = "nearest", nearest_mode: str = "round_prefer_floor", out=None):
    if coordinate_transformation_mode == "half_pixel_symmetric":
        raise ValueError("Resize: half_pixel_symmetric needs opset 19")
    return _resize_from_inputs(
        x, roi, scales, sizes, axes=None, policy="stretch", out=out, mode=mode,
        coord_mode=coordinate_transformation_mode, nearest_mode=nearest_mode, cubic_a=cubic_coeff_a,
        exclude_outside=exclude_outside, extrapolation_value=extrapolation_value)


def _resize_18(x, roi, scales, sizes, antialias, axes, coordinate_transformation_mode, cubic_coeff_a,
               exclude_outside, extrapolation_value, keep_aspect_ratio_policy, mode, nearest_mode, out=None):
    return _resize_from_inputs(
        x, roi, scales, sizes, axes=axes, policy=keep_aspect_ratio_policy, out=out, mode=mode,
        coord_mode=coordinate_transformation_mode, nearest_mode=nearest_mode, cubic_a=cubic_coeff_a,
        exclude_outside=exclude_outside, extrapolation_value=extrapolation_value, antialias=antialias)


@kernel("Resize", since=18, out=True)
def resize_18(x, roi=None, scales=None, sizes=None, /, *, antialias: int = 0, axes: tuple | None = None,
              coordinate_transformation_mode: str = "half_pixel", cubic_coeff_a: float = -0.75,
              exclude_outside: int = 0, extrapolation_value: float = 0.0,
              keep_aspect_ratio_policy: str = "stretch", mode: str = "nearest",
              nearest_mode: str = "round_prefer_floor", out=None):
    if coordinate_transformation_mode == "half_pixel_symmetric":
        raise ValueError("Resize: half_pixel_symmetric needs opset 19")
    return _resize_18(x, roi, scales, sizes, antialias, axes, coordinate_transformation_mode, cubic_coeff_a,
                      exclude_outside, extrapolation_value, keep_aspect_ratio_policy, mode, nearest_mode, out)


@kernel("Resize", since=19, out=True)
def resize_19(x, roi=None, scales=None, sizes=None, /, *, antialias: int = 0, axes: tuple | None = None,
              coordinate_transformation_mode: str = "half_pixel", cubic_coeff_a: float = -0.75,
              exclude_outside: int = 0, extrapolation_value: float = 0.0,
              keep_aspect_ratio_policy: str = "stretch", mode: str = "nearest",
              nearest_mode: str = "round_prefer_floor", out=None):
    return _resize_18(x, roi, scales, sizes, antialias, axes, coordinate_transformation_mode, cubic_coeff_a,
                      exclude_outside, extrapolation_value, keep_aspect_ratio_policy, mode, nearest_mode, out)


def _upsample(x: np.ndarray, scales: list[float], mode: str) -> np.ndarray:
    # Upsample is Resize with asymmetric coordinates; "bilinear" is an alias of linear.
    mode = "linear" if mode == "bilinear" else mode
    if mode not in ("nearest", "linear"):
        raise ValueError(f"Upsample: mode must be nearest or linear, got {mode!r}")
    if any(s < 1 for s in scales):
        raise ValueError(f"Upsample: scales must be >= 1, got {scales}")
    return _resize(x, _shape_from_scales(x, scales), scales, mode=mode, coord_mode="asymmetric",
                   nearest_mode="simple")


@kernel("Upsample", since=7)
def upsample_7(x, *, mode: str = "nearest", scales: tuple = ()):
    return _upsample(x, [float(s) for s in scales], mode)


@kernel("Upsample", since=9)
def upsample(x, scales, *, mode: str = "nearest"):
    return _upsample(x, _floats(scales), mode)
