"""Elementwise ops with any numpy broadcast, by one native call (``mrt_broadcast``; broadcast_impl.h).

The float32 fast paths of ``elementwise.py`` (same shapes, a row-broadcast operand) cover the
convolution graphs; masks, indices and shape arithmetic (BERT's attention mask, one-hot by Equal,
Where over a mask, int64 Add / Mul of positions) take other types and broadcasts.  Here each such op
is one native call a program can replay: :func:`broadcast_op` returns the result, declared final, or
None when the native path does not apply (no native module, another dtype, an input that is not a
C-contiguous array, integer division, more than ``INDEX_MAX_RANK`` axes after merging) or does not
pay (a result below ``_NATIVE_MIN_BYTES`` outside a native-program recording); the caller then takes
numpy, which also raises the op's errors.
"""
from __future__ import annotations

import numpy as np

from minirt import native as _native
from minirt.kernels import _limits

# op type -> the mrt_ew_op member (without MRT_EW_)
OPS = {"Add": "ADD", "Sub": "SUB", "Mul": "MUL", "Div": "DIV", "Equal": "EQUAL", "Less": "LESS",
       "LessOrEqual": "LESS_EQUAL", "Greater": "GREATER", "GreaterOrEqual": "GREATER_EQUAL", "And": "AND",
       "Or": "OR", "Xor": "XOR", "Not": "NOT", "Where": "WHERE", "Max": "MAX", "Min": "MIN", "Sqrt": "SQRT",
       "Reciprocal": "RECIPROCAL", "Neg": "NEG", "Abs": "ABS", "Exp": "EXP", "Log": "LOG", "Floor": "FLOOR",
       "Ceil": "CEIL", "Pow": "POW"}
_FLOAT_ONLY = frozenset({"Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Floor", "Ceil"})
_BOOL_RESULT = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not"})
_LOGICAL = frozenset({"And", "Or", "Xor", "Not"})
# operand dtypes the kernel computes in (ONNX codes of mrt_cast); bool is read as uint8
_TYPES = {"float32": 1, "float64": 11, "int32": 6, "int64": 7, "uint8": 2, "bool": 2}

_maps: dict = {}
_MAPS_MAX = 2048
# Outside a native-program recording, results smaller than this take numpy: the native call costs
# ~6 us against numpy's ~2 us for a few thousand elements (Greater of 3234 floats), and without a
# recording nothing replays it (detectors' per-class score filters: 90 a run, never in a program).
_NATIVE_MIN_BYTES = 1 << 20


def _strides(operand_shape, out_shape):
    """Element strides of a C-contiguous operand read at the output's indices (0 where it broadcasts)."""
    rank = len(out_shape)
    shape = (1,) * (rank - len(operand_shape)) + tuple(operand_shape)
    strides, step = [0] * rank, 1
    for a in range(rank - 1, -1, -1):
        strides[a] = step if shape[a] == out_shape[a] and shape[a] != 1 else 0
        step *= shape[a]
    return strides


def _map(op, type_code, shapes, out_shape):
    strides = [_strides(s, out_shape) for s in shapes]
    # drop the axes of size 1, then merge neighbours that every operand reads as one run
    axes = [a for a, n in enumerate(out_shape) if n != 1] or [len(out_shape) - 1] if out_shape else []
    if not out_shape:
        return _native.broadcast_map(op, type_code, [1], [[0] for _ in strides])
    shape = [out_shape[a] for a in axes]
    rows = [[s[a] for a in axes] for s in strides]
    merged_shape, merged = [shape[-1]], [[r[-1]] for r in rows]
    for i in range(len(shape) - 2, -1, -1):
        n_in = merged_shape[0]
        if all(r[i] == m[0] * n_in for r, m in zip(rows, merged)):
            merged_shape[0] *= shape[i]
            continue
        merged_shape.insert(0, shape[i])
        for r, m in zip(rows, merged):
            m.insert(0, r[i])
    if len(merged_shape) > _native.INDEX_MAX_RANK:
        return None
    return _native.broadcast_map(op, type_code, merged_shape, merged)


def broadcast_op(op_type: str, *operands, out=None):
    """``op_type`` (a key of :data:`OPS`) of the operands with numpy broadcasting, by one native call,
    into ``out`` when it fits (the memory plan's buffer); or None.  Where: (condition, x, y).

    The checks and the map are made once per op and operand dtypes and shapes (:data:`_maps`): a call
    in the steady state is one lookup, the result's allocation and the call."""
    if not _native.available:
        return None
    for a in operands:
        if type(a) is not np.ndarray or not a.flags.c_contiguous:
            return None
    key = (op_type, *[(a.dtype, a.shape) for a in operands])
    entry = _maps.get(key)
    if entry is None:
        if len(_maps) >= _MAPS_MAX:
            _maps.clear()
        entry = _maps[key] = _entry(op_type, operands)
    if entry is False:
        return None
    m, shape, y_dtype, nbytes = entry
    if nbytes > _limits.current_limit():  # (the memory guard: the entry is cached across sessions)
        _limits.check_alloc(shape, y_dtype, f"{op_type} output (its inputs broadcast together)")
    if not _native.recording() and nbytes < _NATIVE_MIN_BYTES:
        return None  # (small, and nothing replays it: numpy's ufunc, see _NATIVE_MIN_BYTES)
    y = out if (out is not None and out.shape == shape and out.dtype == y_dtype and out.flags.c_contiguous
                and not any(np.may_share_memory(out, a) for a in operands)) else np.empty(shape, y_dtype)
    a, b, c = (operands + (None, None))[:3]
    _native.broadcast(m, a, b, c, y)
    return _native.final(y)


def _entry(op_type: str, operands) -> tuple | bool:
    """(map, result shape, result dtype, result bytes) of ``op_type`` over operands of these dtypes and
    shapes, or False when the native path does not apply to them."""
    values = operands[1:] if op_type == "Where" else operands
    dtype = values[0].dtype
    code = _TYPES.get(dtype.name)
    if code is None or any(v.dtype != dtype for v in values):
        return False
    if op_type == "Where" and operands[0].dtype != np.bool_:
        return False
    if op_type in _LOGICAL and dtype != np.bool_ or op_type in _FLOAT_ONLY and dtype.kind != "f":
        return False
    if op_type in ("Add", "Sub", "Mul", "Max", "Min") and dtype == np.bool_:  # (numpy's bool arithmetic is logical)
        return False
    try:
        shape = np.broadcast_shapes(*(a.shape for a in operands))
    except ValueError:
        return False
    if 0 in shape:
        return False
    m = _map(OPS[op_type], code, [a.shape for a in operands], shape)
    if m is None:
        return False
    y_dtype = np.dtype(bool) if op_type in _BOOL_RESULT else dtype
    return m, shape, y_dtype, int(np.prod(shape, dtype=np.int64)) * y_dtype.itemsize
