"""Linear-algebra kernels: Gemm, MatMul, MatMulInteger, Einsum.

Everything funnels into numpy's BLAS-backed ``matmul``/``einsum`` so large
products run at BLAS speed; results keep the ONNX output dtype (float32 in,
float32 out; Python-float ``alpha``/``beta`` are converted to the data dtype
before they touch an array so nothing is promoted to float64).
"""
from __future__ import annotations

import functools

import numpy as np

from minirt.kernels import _narrow
from minirt.kernels.registry import kernel

# --------------------------------------------------------------------------- Gemm


def _scaled(y: np.ndarray, factor: float) -> np.ndarray:
    """``y * factor`` in ``y``'s dtype (``y`` is a fresh array, so in place)."""
    if factor == 1.0:
        return y
    if y.dtype.kind == "f":
        y *= y.dtype.type(factor)
        return y
    # Integer Gemm with a fractional alpha/beta: compute in float64, truncate.
    return (y * factor).astype(y.dtype)


def _gemm(a, b, c, alpha, beta, trans_a, trans_b, exact_c):
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"Gemm: A and B must be 2-D, got shapes {a.shape} and {b.shape}")
    if trans_a:
        a = a.T
    if trans_b:
        b = b.T
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"Gemm: inner dimensions differ: A' is {a.shape}, B' is {b.shape} (transA={trans_a}, transB={trans_b})"
        )
    half = a.dtype == np.float16
    if half:
        # No half-precision BLAS in numpy: compute in float32, round once.
        a, b = a.astype(np.float32), b.astype(np.float32)
        c = None if c is None else c.astype(np.float32)
    y = _scaled(np.matmul(a, b), alpha)
    if c is not None and beta != 0.0:
        y = _add_c(y, c, beta, exact_c)
    return y.astype(np.float16) if half else y


def _add_c(y, c, beta, exact_c):
    if exact_c and c.shape != y.shape:
        raise ValueError(f"Gemm: broadcast=0 requires C of shape {y.shape}, got {c.shape}")
    if c.ndim > 2:
        raise ValueError(f"Gemm: C must have rank <= 2, got shape {c.shape}")
    try:
        # C broadcasts unidirectionally into (M, N): the in-place add keeps y's shape.
        if beta == 1.0:
            y += c
        else:
            y += _scaled(c.copy(), beta) if c.dtype.kind != "f" else c * c.dtype.type(beta)
    except ValueError:
        raise ValueError(f"Gemm: C of shape {c.shape} does not broadcast to the output shape {y.shape}") from None
    return y


@kernel("Gemm", since=1)
def gemm_1(a, b, c=None, /, *, alpha=1.0, beta=1.0, broadcast=0, transA=0, transB=0):
    return _gemm(a, b, c, alpha, beta, transA, transB, exact_c=not broadcast)


@kernel("Gemm", since=7)
def gemm_7(a, b, c=None, /, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    # Covers opsets 7/9/11/13: 9 and 13 only widened the type list, 11 made C optional.
    return _gemm(a, b, c, alpha, beta, transA, transB, exact_c=False)


# --------------------------------------------------------------------------- MatMul


@kernel("MatMul", since=1)
def matmul(a, b, /):
    try:
        if a.dtype == np.float16 and b.dtype == np.float16:
            # No half-precision BLAS in numpy: compute in float32, round once.
            y = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
        elif _narrow.is_narrow_float(a.dtype) and a.dtype == b.dtype:
            # bfloat16 / float8 (ml_dtypes): float32 products and sums, rounded once.
            y = np.asarray(np.matmul(a.astype(np.float32), b.astype(np.float32))).astype(a.dtype)
        else:
            y = np.matmul(a, b)
    except ValueError:
        raise ValueError(f"MatMul: shapes {a.shape} and {b.shape} are not compatible (numpy.matmul rules)") from None
    # 1-D @ 1-D gives a numpy scalar; ONNX wants a 0-d tensor.
    return y if isinstance(y, np.ndarray) else np.asarray(y)


def _zero_point(name: str, zp: np.ndarray, shape: tuple, row: bool) -> np.ndarray:
    """``zp`` reshaped to broadcast against its operand.

    A scalar (or one-element) zero point is per tensor.  Otherwise A's is per
    row: ``(M,)`` or ``(..., M, 1)``; B's is per column: ``(N,)`` or ``(..., 1, N)``.
    """
    if zp.size == 1:
        return zp.reshape(()).astype(np.float64)
    if len(shape) >= 2:
        if row:
            m = shape[-2]
            if zp.shape == (m,):
                return zp.reshape(m, 1).astype(np.float64)
            if zp.ndim >= 2 and zp.shape[-2:] == (m, 1):
                return zp.astype(np.float64)
            expected = f"scalar, ({m},) or (..., {m}, 1)"
        else:
            n = shape[-1]
            if zp.shape == (n,) or (zp.ndim >= 2 and zp.shape[-2:] == (1, n)):
                return zp.astype(np.float64)
            expected = f"scalar, ({n},) or (..., 1, {n})"
    else:
        expected = "scalar (1-D operand)"
    raise ValueError(f"MatMulInteger: {name} shape {zp.shape} must be {expected} for an operand of shape {shape}")


@kernel("MatMulInteger", since=10)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None, /):
    for name, t in (("A", a), ("B", b)):
        if t.dtype not in (np.int8, np.uint8):
            raise ValueError(f"MatMulInteger: {name} must be int8 or uint8, got {t.dtype}")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"MatMulInteger: inputs must have rank >= 1, got shapes {a.shape} and {b.shape}")
    # (a - za) @ (b - zb) through float64 BLAS: every product is at most 255*255
    # in magnitude, so sums are exact far beyond any realistic K (2^53 / 2^16),
    # and dgemm is much faster than numpy's integer matmul loop.
    af = a.astype(np.float64)
    bf = b.astype(np.float64)
    if a_zero_point is not None:
        if a_zero_point.dtype != a.dtype:
            raise ValueError(f"MatMulInteger: a_zero_point dtype {a_zero_point.dtype} differs from A's {a.dtype}")
        af -= _zero_point("a_zero_point", a_zero_point, a.shape, row=True)
    if b_zero_point is not None:
        if b_zero_point.dtype != b.dtype:
            raise ValueError(f"MatMulInteger: b_zero_point dtype {b_zero_point.dtype} differs from B's {b.dtype}")
        bf -= _zero_point("b_zero_point", b_zero_point, b.shape, row=False)
    try:
        y = np.matmul(af, bf)
    except ValueError:
        raise ValueError(f"MatMulInteger: shapes {a.shape} and {b.shape} are not compatible") from None
    return np.asarray(y, dtype=np.float64).astype(np.int32)


# --------------------------------------------------------------------------- Einsum


@functools.lru_cache(maxsize=512)
def _einsum_path(equation: str, shapes: tuple) -> list:
    # Only shapes matter to the path search, so zero-stride dummies stand in
    # for the operands; the result is cached per (equation, shapes).
    dummies = [np.broadcast_to(np.empty((), dtype=np.float32), s) for s in shapes]
    return np.einsum_path(equation, *dummies, optimize="greedy")[0]


@kernel("Einsum", since=12)
def einsum(*inputs, equation=""):
    eq = equation.replace(" ", "")
    if not eq:
        raise ValueError("Einsum: the equation attribute is required")
    if inputs and any(_narrow.is_narrow_float(x.dtype) for x in inputs):
        # bfloat16 / float8: contract in float32, round the result once
        out_dt = inputs[0].dtype
        return einsum(*(_narrow.widen(x) for x in inputs), equation=equation).astype(out_dt)
    try:
        if len(inputs) < 2:
            y = np.einsum(eq, *inputs)
        else:
            # The contraction order (and the use of BLAS tensordot for each
            # pairwise step) comes from a cached path.
            y = np.einsum(eq, *inputs, optimize=_einsum_path(eq, tuple(x.shape for x in inputs)))
    except ValueError as exc:
        shapes = ", ".join(str(x.shape) for x in inputs)
        raise ValueError(f"Einsum: equation {equation!r} does not fit inputs of shapes {shapes}: {exc}") from None
    return y if isinstance(y, np.ndarray) else np.asarray(y)
