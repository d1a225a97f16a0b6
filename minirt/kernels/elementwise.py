"""Elementwise kernels: arithmetic, math functions, comparisons, logic, activations.

Conventions shared by every kernel here:

* Results keep the ONNX output dtype.  Scalar attributes (Python floats) are
  converted with ``x.dtype.type(v)`` before they meet an array so float32
  inputs never promote to float64.
* float16 inputs of transcendental functions are computed in float32 and
  rounded back (as onnxruntime does), which keeps the error at half-precision
  rounding rather than accumulating float16 error inside the formula.
* Opsets before 7 used an explicit ``broadcast``/``axis`` scheme for binary ops
  and a ``consumed_inputs`` attribute on many ops; the ``since=1`` entries
  accept those attributes (``consumed_inputs`` is a memory-planning hint with no
  effect on values, so it is ignored).
"""
from __future__ import annotations

import math

import numpy as np

from minirt import native as _native
from minirt.kernels import _limits
from minirt.kernels._native_broadcast import broadcast_op
from minirt.kernels.registry import is_constant, kernel

# --------------------------------------------------------------------------- helpers


def _as_array(value, dtype: np.dtype) -> np.ndarray:
    """``value`` as an ndarray of ``dtype`` (numpy ufuncs on 0-d arrays return scalars)."""
    if isinstance(value, np.ndarray) and value.dtype == dtype:
        return value
    return np.asarray(value, dtype=dtype)


def _float_compute(x: np.ndarray, fn) -> np.ndarray:
    """Apply ``fn`` to ``x``; float16 is widened to float32 for the computation."""
    if x.dtype == np.float16:
        return _as_array(fn(x.astype(np.float32)), np.float16)
    return _as_array(fn(x), x.dtype)


def _legacy_broadcast(a: np.ndarray, b: np.ndarray, broadcast: int, axis: int | None) -> np.ndarray:
    """Reshape ``b`` for the opset<7 broadcast rule and return it.

    With ``broadcast=1`` the shape of B must be a contiguous run of A's shape
    starting at ``axis`` (default: aligned to the trailing dimensions).  With
    ``broadcast=0`` the shapes must match exactly.
    """
    if not broadcast:
        if a.shape != b.shape:
            raise ValueError(f"shapes {a.shape} and {b.shape} differ and broadcast=0")
        return b
    if axis is None or b.ndim == 0:
        return b  # suffix alignment is exactly numpy broadcasting
    if axis < 0:
        axis += a.ndim
    trailing = a.ndim - axis - b.ndim
    if axis < 0 or trailing < 0:
        raise ValueError(f"cannot broadcast shape {b.shape} into {a.shape} at axis {axis}")
    return b.reshape(b.shape + (1,) * trailing)


def _check_same_dtype(op: str, a: np.ndarray, b: np.ndarray) -> None:
    if a.dtype != b.dtype:
        raise ValueError(f"{op}: input dtypes differ ({a.dtype} vs {b.dtype})")


# --------------------------------------------------------------------------- binary arithmetic


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C-style integer division (truncate toward zero), as onnxruntime does."""
    if not np.all(b):
        raise ValueError("integer division by zero")
    if a.dtype.kind == "u":
        return np.floor_divide(a, b)
    q = np.floor_divide(a, b)
    # floor and trunc differ where the division is inexact and the signs differ.
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def _add(a, b):
    return np.add(a, b)


def _sub(a, b):
    return np.subtract(a, b)


def _mul(a, b):
    return np.multiply(a, b)


def _div(a, b):
    if a.dtype.kind in "iu":
        return _int_div(a, b)
    return np.divide(a, b)


def _fits_out(out, x: np.ndarray, shape: tuple) -> bool:
    """Whether a float result of ``shape`` in ``x``'s dtype may be written into ``out``."""
    return (
        out is not None and out.shape == shape and out.dtype == x.dtype and x.dtype.kind == "f"
        and x.dtype.itemsize >= 4 and out.flags.c_contiguous
    )


_F32 = np.dtype(np.float32)


def _binary_out(out, a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a op b`` may be written into ``out``: exactly its shape and (float) dtype.

    Overlap between an input and ``out`` is allowed when the input has the
    result's shape (numpy ufuncs give the same result as without overlap);
    a broadcast input must not overlap ``out``."""
    if a.dtype != b.dtype:
        return False
    if a.shape == b.shape:
        return _fits_out(out, a, a.shape)
    if b.size == 1 and b.ndim <= a.ndim:  # (np.broadcast_shapes costs more than a small op)
        shape = a.shape
    elif a.size == 1 and a.ndim <= b.ndim:
        shape = b.shape
    else:
        shape = np.broadcast_shapes(a.shape, b.shape)
    if not _fits_out(out, a, shape):
        return False
    return all(x.shape == shape or not np.may_share_memory(x, out) for x in (a, b))


def _row_form(full: np.ndarray, small: np.ndarray):
    """How ``small`` broadcasts over ``full`` in one pass of mrt_binary_rows_f32, or None.

    ``small`` padded on the left with 1s to ``full``'s rank must read (1, ..., 1, full[j:k], 1, ..., 1):
    leading 1s, then a run of ``full``'s own sizes, then trailing 1s.  With trailing 1s its values
    follow the rows of prod(full[k:]) values (a scalar: j == k, per channel (1, C, 1, 1), per image
    and channel (N, C, 1, 1)): (rows, length, bmod, False); without, it runs along the columns
    (a bias over the last axes): (rows, length, None, True).  Same shapes are the caller's case."""
    if small.size == 1:
        return 1, full.size, 1, False
    nd = full.ndim
    if small.ndim > nd:
        return None
    padded = (1,) * (nd - small.ndim) + small.shape
    k = nd
    while padded[k - 1] == 1:
        k -= 1
    j = 0
    while padded[j] == 1:
        j += 1
    if padded[j:k] != full.shape[j:k]:
        return None
    if k == nd:
        return full.size // small.size, small.size, None, True
    length = math.prod(full.shape[k:])
    return full.size // length, length, small.size, False


def _same_or_apart(x: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``out`` is exactly ``x``'s memory (an in-place result) or overlaps none of it."""
    return not np.may_share_memory(x, out) or (x.ctypes.data == out.ctypes.data and x.nbytes == out.nbytes)


def _native_binary(op: int, a, b, out):
    """``a op b`` by one native call into ``out`` (or a fresh array when None), declared final; None
    when it is not one: both float32 C-contiguous, of one shape or one of them broadcast in a row
    form (:func:`_row_form`), the output the full operand's shape.  The caller checked ``out``
    (:func:`_binary_out`: a broadcast operand never overlaps it)."""
    if not (type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == _F32 and b.dtype == _F32
            and a.flags.c_contiguous and b.flags.c_contiguous and (out is None or out.flags.c_contiguous)):
        return None
    if out is not None and not (_same_or_apart(a, out) and _same_or_apart(b, out)):
        return None  # (numpy buffers a partial overlap; the C loops read each value once, in order)
    if a.shape == b.shape:
        y = np.empty(a.shape, _F32) if out is None else out
        if y.size:
            _native.binary(op, a, b, y)
        return _native.final(y)
    if a.size >= b.size and a.ndim >= b.ndim:
        full, small, reversed_ = a, b, False
    else:
        full, small, reversed_ = b, a, True
    if not full.size or full.ndim < small.ndim or (out is not None and out.shape != full.shape):
        return None  # (a small operand of higher rank adds leading dimensions: not the full one's shape)
    form = _row_form(full, small)
    if form is None:
        return None
    rows, length, bmod, columns = form
    y = np.empty(full.shape, _F32) if out is None else out
    _native.binary_rows(op, full, small, y, rows, length, bmod or 1, reversed_, columns)
    return _native.final(y)


# ufunc by op for the out= path (float division is a plain ufunc too)
_BINARY_UFUNC = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


def _make_binary(op: str, fn, out_bool: bool = False):
    """Register ``op`` at since 1 (legacy broadcast attrs) and 7 (numpy broadcasting).

    Add/Sub/Mul/Div at since 7 take an ``out`` buffer (float results only)."""
    ufunc = _BINARY_UFUNC.get(op)

    native_op = _native.BINARY_OPS.get(op)

    if ufunc is None:
        def modern(a, b):
            _check_same_dtype(op, a, b)
            y = broadcast_op(op, a, b)  # (one native call a program may replay, or None)
            if y is not None:
                return y
            _limits.check_broadcast(op, a, b)
            out = fn(a, b)
            return _as_array(out, np.dtype(bool) if out_bool else a.dtype)
    else:
        def modern(a, b, *, out=None):
            _check_same_dtype(op, a, b)
            if out is not None and _binary_out(out, a, b):
                if _native.available:
                    # one native pass (the same IEEE operation as the ufunc, value for value), the
                    # node's whole work: a program may replay it
                    y = _native_binary(native_op, a, b, out)
                    if y is None:
                        y = broadcast_op(op, a, b, out=out)
                    if y is not None:
                        return y
                ufunc(a, b, out=out)
                return out
            if _native.available and a.dtype == _F32:
                # no buffer from the memory plan (a graph output, or a composite kernel's step: those
                # that update the result in place say so with native.modified)
                y = _native_binary(native_op, a, b, None)
                if y is not None:
                    return y
            y = broadcast_op(op, a, b)  # (other types and broadcasts: one native call, or None)
            if y is not None:
                return y
            _limits.check_broadcast(op, a, b)
            return _as_array(fn(a, b), a.dtype)

    def legacy(a, b, *, broadcast: int = 0, axis: int | None = None, consumed_inputs: tuple = ()):
        b = _legacy_broadcast(a, b, broadcast, axis)
        return modern(a, b)

    modern.__name__ = modern.__qualname__ = f"{op.lower()}_7"
    legacy.__name__ = legacy.__qualname__ = f"{op.lower()}_1"
    kernel(op, since=1)(legacy)
    kernel(op, since=7, out=ufunc is not None)(modern)


_make_binary("Add", _add)
_make_binary("Sub", _sub)
_make_binary("Mul", _mul)
_make_binary("Div", _div)
_make_binary("Equal", np.equal, out_bool=True)
_make_binary("Less", np.less, out_bool=True)
_make_binary("Greater", np.greater, out_bool=True)
_make_binary("And", np.logical_and, out_bool=True)
_make_binary("Or", np.logical_or, out_bool=True)
_make_binary("Xor", np.logical_xor, out_bool=True)


@kernel("LessOrEqual", since=12)
def less_or_equal(a, b):
    _check_same_dtype("LessOrEqual", a, b)
    y = broadcast_op("LessOrEqual", a, b)
    if y is not None:
        return y
    return _as_array(np.less_equal(a, b), np.dtype(bool))


@kernel("GreaterOrEqual", since=12)
def greater_or_equal(a, b):
    _check_same_dtype("GreaterOrEqual", a, b)
    y = broadcast_op("GreaterOrEqual", a, b)
    if y is not None:
        return y
    return _as_array(np.greater_equal(a, b), np.dtype(bool))


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # Result dtype is the base dtype (opset 12+ allows a different exponent dtype).
    if a.dtype.kind == "f":
        if a.dtype != np.float16:
            # one native call (float32 / float64, any broadcast), which a program can replay
            y = broadcast_op("Pow", a, b.astype(a.dtype, copy=False))
            if y is not None:
                return y
        if a.dtype == np.float16:
            return _as_array(np.power(a.astype(np.float32), b.astype(np.float32)), np.float16)
        return _as_array(np.power(a, b.astype(a.dtype, copy=False)), a.dtype)
    # Integer base: numpy refuses negative integer exponents, and a float
    # exponent needs a real power; compute in float64 and truncate like a C cast.
    if b.dtype.kind in "iu" and (b.size == 0 or b.min() >= 0):
        return _as_array(np.power(a, b.astype(a.dtype, copy=False)), a.dtype)
    return _as_array(np.trunc(np.power(a.astype(np.float64), b.astype(np.float64))), a.dtype)


@kernel("Pow", since=1)
def pow_1(a, b, *, broadcast: int = 0, axis: int | None = None):
    return _pow(a, _legacy_broadcast(a, b, broadcast, axis))


@kernel("Pow", since=7)
def pow_7(a, b):
    return _pow(a, b)


def _mod(a: np.ndarray, b: np.ndarray, fmod: int, float_floor_ok: bool) -> np.ndarray:
    _check_same_dtype("Mod", a, b)
    if a.dtype.kind == "f":
        if not fmod and not float_floor_ok:
            raise ValueError("Mod: fmod must be 1 for floating point inputs before opset 28")
        out = np.fmod(a, b) if fmod else np.mod(a, b)
        return _as_array(out, a.dtype)
    if not np.all(b):
        raise ValueError("Mod: integer division by zero")
    # fmod=1: result has the sign of the dividend (C fmod); fmod=0: sign of the divisor.
    out = np.fmod(a, b) if fmod else np.mod(a, b)
    return _as_array(out, a.dtype)


@kernel("Mod", since=10)
def mod_10(a, b, *, fmod: int = 0):
    return _mod(a, b, fmod, float_floor_ok=False)


@kernel("Mod", since=28)
def mod_28(a, b, *, fmod: int = 0):
    return _mod(a, b, fmod, float_floor_ok=True)


def _bit_shift(a, b, direction):
    _check_same_dtype("BitShift", a, b)
    if a.dtype.kind not in "iu":
        raise ValueError(f"BitShift: integer inputs required, got {a.dtype}")
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    # Shift amounts outside [0, bits) give what the sign extension alone
    # produces: -1 for a right shift of a negative value, 0 otherwise.
    bits = a.dtype.itemsize * 8
    valid = (b < bits) if a.dtype.kind == "u" else ((b >= 0) & (b < bits))
    amount = np.where(valid, b, b.dtype.type(0))
    if direction == "LEFT":
        out = np.left_shift(a, amount)
        fill = a.dtype.type(0)
    else:
        out = np.right_shift(a, amount)  # arithmetic (sign-extending) for signed types
        fill = np.where(a < 0, a.dtype.type(-1), a.dtype.type(0)) if a.dtype.kind == "i" else a.dtype.type(0)
    return _as_array(np.where(valid, out, fill), a.dtype)


@kernel("BitShift", since=11)
def bit_shift(a, b, *, direction: str = ""):
    if a.dtype.kind != "u":
        raise ValueError(f"BitShift: only unsigned integer inputs are allowed before opset 28, got {a.dtype}")
    return _bit_shift(a, b, direction)


@kernel("BitShift", since=28)
def bit_shift_28(a, b, *, direction: str = ""):
    return _bit_shift(a, b, direction)


def _make_bitwise(op: str, fn):
    def bitwise(a, b):
        _check_same_dtype(op, a, b)
        if a.dtype.kind not in "iub":
            raise ValueError(f"{op}: integer inputs required, got {a.dtype}")
        return _as_array(fn(a, b), a.dtype)

    bitwise.__name__ = bitwise.__qualname__ = op.lower()
    kernel(op, since=18)(bitwise)


_make_bitwise("BitwiseAnd", np.bitwise_and)
_make_bitwise("BitwiseOr", np.bitwise_or)
_make_bitwise("BitwiseXor", np.bitwise_xor)


@kernel("BitwiseNot", since=18)
def bitwise_not(x):
    return _as_array(np.invert(x), x.dtype)


# --------------------------------------------------------------------------- variadic


def _fold(op: str, inputs, fn) -> np.ndarray:
    arrays = [x for x in inputs if x is not None]
    if not arrays:
        raise ValueError(f"{op}: needs at least one input")
    out = arrays[0]
    for x in arrays[1:]:
        _check_same_dtype(op, arrays[0], x)
        _limits.check_broadcast(op, out, x)
        out = fn(out, x)
    return out


@kernel("Max", since=1)
def max_(*inputs, consumed_inputs: tuple = ()):
    y = broadcast_op("Max", *inputs) if len(inputs) == 2 else None  # (one native call, or None)
    if y is not None:
        return y
    out = _fold("Max", inputs, np.maximum)
    return _as_array(out, inputs[0].dtype)


@kernel("Min", since=1)
def min_(*inputs, consumed_inputs: tuple = ()):
    y = broadcast_op("Min", *inputs) if len(inputs) == 2 else None  # (one native call, or None)
    if y is not None:
        return y
    out = _fold("Min", inputs, np.minimum)
    return _as_array(out, inputs[0].dtype)


@kernel("Sum", since=1)
def sum_(*inputs, consumed_inputs: tuple = ()):
    # A single operand is copied so the output never aliases a caller's array.
    out = _fold("Sum", inputs, np.add)
    return _as_array(out, inputs[0].dtype).copy() if out is inputs[0] else _as_array(out, inputs[0].dtype)


@kernel("Mean", since=1)
def mean(*inputs, consumed_inputs: tuple = ()):
    dtype = inputs[0].dtype
    out = _fold("Mean", inputs, np.add)
    n = len([x for x in inputs if x is not None])
    return _as_array(out / dtype.type(n), dtype)


# --------------------------------------------------------------------------- unary math


# unary ops mrt_broadcast computes for float32 / float64 (_native_broadcast.OPS)
_NATIVE_UNARY = frozenset({"Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Floor", "Ceil"})


def _make_unary(op: str, fn, sinces: tuple, float_only: bool = True):
    """Register a stateless unary op; the since=1 entry accepts ``consumed_inputs``."""

    def unary(x):
        if float_only and x.dtype.kind != "f":
            raise ValueError(f"{op}: floating point input required, got {x.dtype}")
        if op in _NATIVE_UNARY and type(x) is np.ndarray and x.dtype.kind == "f":
            y = broadcast_op(op, x)  # (float32 / float64: one native call a program may replay, or None)
            if y is not None:
                return y
        return _float_compute(x, fn)

    def unary_legacy(x, *, consumed_inputs: tuple = ()):
        return unary(x)

    unary.__name__ = unary.__qualname__ = op.lower()
    unary_legacy.__name__ = unary_legacy.__qualname__ = op.lower() + "_1"
    for since in sinces:
        kernel(op, since=since)(unary_legacy if since == 1 else unary)


def _reciprocal(x):
    return np.divide(x.dtype.type(1), x)


_make_unary("Neg", np.negative, (1,), float_only=False)
_make_unary("Abs", np.abs, (1,), float_only=False)
_make_unary("Reciprocal", _reciprocal, (1,))
_make_unary("Sqrt", np.sqrt, (1,))
_make_unary("Exp", np.exp, (1,))
_make_unary("Log", np.log, (1,))
_make_unary("Floor", np.floor, (1,))
_make_unary("Ceil", np.ceil, (1,))
_make_unary("Round", np.round, (11,))  # np.round rounds half to even, as ONNX requires
_make_unary("Sign", np.sign, (9,), float_only=False)
_make_unary("Sin", np.sin, (7,))
_make_unary("Cos", np.cos, (7,))
_make_unary("Tan", np.tan, (7,))
_make_unary("Asin", np.arcsin, (7,))
_make_unary("Acos", np.arccos, (7,))
_make_unary("Atan", np.arctan, (7,))
_make_unary("Sinh", np.sinh, (9,))
_make_unary("Cosh", np.cosh, (9,))
_make_unary("Asinh", np.arcsinh, (9,))
_make_unary("Acosh", np.arccosh, (9,))
_make_unary("Atanh", np.arctanh, (9,))


@kernel("Tanh", since=1)
def tanh_1(x, *, consumed_inputs: tuple = ()):
    return tanh(x)


@kernel("Tanh", since=6, out=True)
def tanh(x, *, out=None):
    y = _native_activation(x, out, "Tanh")
    if y is not None:
        return y
    if x.dtype.kind != "f":
        raise ValueError(f"Tanh: floating point input required, got {x.dtype}")
    return _float_compute(x, np.tanh)


# erf without scipy.  For |x| < 0.5 the Maclaurin series is summed (terms decay
# by x^2/n, so 12 terms reach float64 rounding); elsewhere the Chebyshev-fitted
# erfc approximation from Numerical Recipes ("erfcc", fractional error below
# 1.2e-7 for all x) is used, giving |erf error| < 2.4e-7 in float64.
_ERFC_COEFFS = (
    -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
    0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277,
)
_ERF_SERIES = tuple(
    (-1.0) ** n / (math.factorial(n) * (2 * n + 1)) * 2.0 / math.sqrt(math.pi) for n in range(12)
)


def _erf64(x: np.ndarray) -> np.ndarray:
    """erf of a float64 array."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = _ERFC_COEFFS[-1]
    for c in _ERFC_COEFFS[-2::-1]:  # Horner, highest degree first
        poly = poly * t + c
    erfc = t * np.exp(-z * z + poly)
    out = np.copysign(1.0 - erfc, x)
    small = z < 0.5
    if small.any():
        xs = x[small]
        x2 = xs * xs
        acc = np.full_like(xs, _ERF_SERIES[-1])
        for c in _ERF_SERIES[-2::-1]:
            acc = acc * x2 + c
        out[small] = acc * xs
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    return _as_array(_erf64(np.asarray(x, dtype=np.float64)), x.dtype)


@kernel("Erf", since=9)
def erf(x):
    if x.dtype.kind != "f":
        # Integer inputs are allowed by the schema; erf of an integer rounds to -1/0/1.
        return _as_array(np.rint(_erf64(x.astype(np.float64))), x.dtype)
    return _erf(x)


@kernel("IsNaN", since=9)
def is_nan(x):
    return _as_array(np.isnan(x), np.dtype(bool))


@kernel("IsInf", since=10)
def is_inf(x, *, detect_negative: int = 1, detect_positive: int = 1):
    if detect_negative and detect_positive:
        out = np.isinf(x)
    elif detect_negative:
        out = np.isneginf(x)
    elif detect_positive:
        out = np.isposinf(x)
    else:
        out = np.zeros(x.shape, dtype=bool)
    return _as_array(out, np.dtype(bool))


@kernel("Not", since=1)
def not_(x):
    y = broadcast_op("Not", x) if type(x) is np.ndarray and x.dtype == np.bool_ else None
    if y is not None:
        return y
    return _as_array(np.logical_not(x), np.dtype(bool))


@kernel("Where", since=9)
def where(cond, x, y):
    _check_same_dtype("Where", x, y)
    result = broadcast_op("Where", cond, x, y)
    if result is not None:
        return result
    _limits.check_broadcast("Where", cond, x, y)
    return _as_array(np.where(cond, x, y), x.dtype)


# --------------------------------------------------------------------------- activations


def _native_activation(x, out, activation: str, a0: float = 0.0, a1: float = 0.0, replayable: bool = True):
    """``activation`` (a name of ``minirt.vocabulary.ACTIVATIONS``) of ``x`` by one native call
    (mrt_activation_f32: the fused epilogues' code), declared final; None when it is not one:
    float32 C-contiguous input, an activation the epilogues compute.  The result goes into ``out``
    when it fits (shape, dtype, C-contiguous) and is ``x`` itself or overlaps nothing of it, else
    into a fresh array.  ``replayable`` False: a0 / a1 come from the data (Clip's bounds as inputs), which a
    program would replay with this run's values: the result is not declared final."""
    if not (_native.available and type(x) is np.ndarray and x.dtype == _F32 and x.flags.c_contiguous):
        return None
    code = _native.ACTIVATION_CODES.get(activation)
    if code is None:
        return None
    if out is not None and not (
            type(out) is np.ndarray and out.shape == x.shape and out.dtype == _F32 and out.flags.c_contiguous
            and (not np.may_share_memory(x, out) or (out.ctypes.data == x.ctypes.data))):
        out = None
    y = np.empty(x.shape, _F32) if out is None else out
    if y.size:
        _native.activation(code, a0, a1, x, y)
    return _native.final(y) if replayable else y



@kernel("Relu", since=1)
def relu_1(x, *, consumed_inputs: tuple = ()):
    return relu(x)


@kernel("Relu", since=6, out=True)
def relu(x, *, out=None):
    y = _native_activation(x, out, "Relu")
    if y is not None:
        return y
    if out is not None and _fits_out(out, x, x.shape):  # same shape: a ufunc handles any overlap
        np.maximum(x, x.dtype.type(0), out=out)
        return out
    return _as_array(np.maximum(x, x.dtype.type(0)), x.dtype)


@kernel("LeakyRelu", since=1)
def leaky_relu_1(x, *, alpha: float = 0.01, consumed_inputs: tuple = ()):
    return leaky_relu(x, alpha=alpha)


@kernel("LeakyRelu", since=6, out=True)
def leaky_relu(x, *, alpha: float = 0.01, out=None):
    y = _native_activation(x, out, "LeakyRelu", alpha)
    if y is not None:
        return y
    return _as_array(np.where(x < 0, x * x.dtype.type(alpha), x), x.dtype)


@kernel("PRelu", since=1)
def prelu_1(x, slope, *, consumed_inputs: tuple = ()):
    # Before opset 7 the slope was per channel (shape [C]) or a single value.
    if slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1]:
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    return prelu(x, slope)


@kernel("PRelu", since=7)
def prelu(x, slope):
    # Opset 7+: slope is unidirectionally broadcastable to x.
    return _as_array(np.where(x < 0, x * slope.astype(x.dtype, copy=False), x), x.dtype)


@kernel("Elu", since=1)
def elu_1(x, *, alpha: float = 1.0, consumed_inputs: tuple = ()):
    return elu(x, alpha=alpha)


@kernel("Elu", since=6)
def elu(x, *, alpha: float = 1.0):
    return _float_compute(x, lambda v: np.where(v > 0, v, v.dtype.type(alpha) * np.expm1(v)))


def _selu(x: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    def fn(v):
        t = v.dtype.type
        return t(gamma) * np.where(v > 0, v, t(alpha) * np.expm1(v))

    return _float_compute(x, fn)


@kernel("Selu", since=1)
def selu_1(x, *, alpha: float = 1.6732, gamma: float = 1.0507, consumed_inputs: tuple = ()):
    return _selu(x, alpha, gamma)


@kernel("Selu", since=6)
def selu(x, *, alpha: float = 1.67326319217681884765625, gamma: float = 1.05070102214813232421875):
    return _selu(x, alpha, gamma)


@kernel("Celu", since=12)
def celu(x, *, alpha: float = 1.0):
    def fn(v):
        a = v.dtype.type(alpha)
        return np.maximum(v, 0) + np.minimum(0, a * np.expm1(v / a))

    return _float_compute(x, fn)


def _clip(x: np.ndarray, lo, hi, dst=None, bounds_fixed: bool = True) -> np.ndarray:
    # Applied as max-then-min so that lo > hi yields hi, as ONNX specifies.  bounds_fixed: the bounds are
    # attributes or constants (else a native program must not keep them: _native_activation's replayable).
    if x.dtype == _F32 and not (lo is not None and np.isnan(lo)) and not (hi is not None and np.isnan(hi)):
        # (the epilogue's clip is max-then-min too; a NaN bound stays with numpy's semantics)
        y = _native_activation(x, dst, "Clip", -math.inf if lo is None else float(lo),
                               math.inf if hi is None else float(hi), replayable=bounds_fixed)
        if y is not None:
            return y
    if dst is not None and _fits_out(dst, x, x.shape) and (dst is x or not np.may_share_memory(x, dst)):
        if lo is None and hi is None:
            np.copyto(dst, x)
        elif lo is None:
            np.minimum(x, hi, out=dst)
        else:
            np.maximum(x, lo, out=dst)
            if hi is not None:
                np.minimum(dst, hi, out=dst)
        return dst
    out = x
    if lo is not None:
        out = np.maximum(out, lo)
    if hi is not None:
        out = np.minimum(out, hi)
    return x.copy() if out is x else _as_array(out, x.dtype)


@kernel("Clip", since=1)
def clip_1(x, *, min: float | None = None, max: float | None = None, consumed_inputs: tuple = ()):  # noqa: A002
    return _clip(x, None if min is None else _bound(x, min), None if max is None else _bound(x, max))


def _bound(x: np.ndarray, value: float):
    """A float attribute bound in x's dtype, saturated to its finite range (FLT_MAX defaults vs float16)."""
    if x.dtype.kind == "f":
        info = np.finfo(x.dtype)
        value = min(max(value, float(info.min)), float(info.max))
    return x.dtype.type(value)


@kernel("Clip", since=6, out=True)
def clip_6(x, *, min: float = -3.4028234663852886e38, max: float = 3.4028234663852886e38, out=None):  # noqa: A002
    return _clip(x, _bound(x, min), _bound(x, max), out)


@kernel("Clip", since=11, out=True)
def clip_11(x, min=None, max=None, /, *, out=None):  # noqa: A002  (ONNX input names)
    # min/max are optional scalar *inputs* from opset 11 (positional, not attributes).
    lo = None if min is None else x.dtype.type(np.asarray(min).reshape(()))
    hi = None if max is None else x.dtype.type(np.asarray(max).reshape(()))
    return _clip(x, lo, hi, out, bounds_fixed=is_constant(min, max))


def _sigmoid(v: np.ndarray, out=None) -> np.ndarray:
    # exp(-|x|) never overflows; for x<0, sigmoid(x) = e/(1+e) keeps relative precision.
    e = np.exp(-np.abs(v))
    return np.divide(np.where(v >= 0, v.dtype.type(1), e), 1 + e, out=out)


@kernel("Sigmoid", since=1)
def sigmoid_1(x, *, consumed_inputs: tuple = ()):
    return sigmoid(x)


@kernel("Sigmoid", since=6, out=True)
def sigmoid(x, *, out=None):
    y = _native_activation(x, out, "Sigmoid")
    if y is not None:
        return y
    if out is not None and _fits_out(out, x, x.shape) and not np.may_share_memory(x, out):
        return _sigmoid(x, out)
    return _float_compute(x, _sigmoid)


@kernel("HardSigmoid", since=1)
def hard_sigmoid_1(x, *, alpha: float = 0.2, beta: float = 0.5, consumed_inputs: tuple = ()):
    return hard_sigmoid(x, alpha=alpha, beta=beta)


@kernel("HardSigmoid", since=6, out=True)
def hard_sigmoid(x, *, alpha: float = 0.2, beta: float = 0.5, out=None):
    y = _native_activation(x, out, "HardSigmoid", alpha, beta)
    if y is not None:
        return y

    def fn(v):
        t = v.dtype.type
        return np.clip(t(alpha) * v + t(beta), t(0), t(1))

    return _float_compute(x, fn)


@kernel("HardSwish", since=14, out=True)
def hard_swish(x, *, out=None):
    y = _native_activation(x, out, "HardSwish")
    if y is not None:
        return y

    def fn(v):
        t = v.dtype.type
        return v * np.clip(v * t(1.0 / 6.0) + t(0.5), t(0), t(1))

    return _float_compute(x, fn)


def _softplus(v: np.ndarray) -> np.ndarray:
    # log(1 + exp(x)) without overflow for large x.
    return np.logaddexp(v.dtype.type(0), v)


@kernel("Softplus", since=1)
def softplus(x):
    return _float_compute(x, _softplus)


@kernel("Softsign", since=1)
def softsign(x):
    return _float_compute(x, lambda v: v / (1 + np.abs(v)))


@kernel("Gelu", since=20, out=True)
def gelu(x, *, approximate: str = "none", out=None):
    if approximate in ("none", "tanh"):
        y = _native_activation(x, out, "Gelu" if approximate == "none" else "GeluTanh")
        if y is not None:
            return y
    if approximate == "none":
        def fn(v):
            t = v.dtype.type
            return t(0.5) * v * (1 + _erf(v * t(1.0 / math.sqrt(2.0))))
    elif approximate == "tanh":
        def fn(v):
            t = v.dtype.type
            inner = t(math.sqrt(2.0 / math.pi)) * (v + t(0.044715) * v * v * v)
            return t(0.5) * v * (1 + np.tanh(inner))
    else:
        raise ValueError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _float_compute(x, fn)


@kernel("Mish", since=18)
def mish(x):
    return _float_compute(x, lambda v: v * np.tanh(_softplus(v)))


@kernel("ThresholdedRelu", since=10)
def thresholded_relu(x, *, alpha: float = 1.0):
    return _as_array(np.where(x > x.dtype.type(alpha), x, x.dtype.type(0)), x.dtype)


@kernel("Shrink", since=9)
def shrink(x, *, bias: float = 0.0, lambd: float = 0.5):
    # Integer inputs are allowed; the attributes are compared/subtracted in x's dtype
    # after conversion, matching onnxruntime's static_cast.
    if x.dtype.kind == "f":
        b, lam = x.dtype.type(bias), x.dtype.type(lambd)
    else:
        b, lam = x.dtype.type(int(bias)), lambd
    out = np.where(x < -lam, x + b, np.where(x > lam, x - b, x.dtype.type(0)))
    return _as_array(out, x.dtype)
