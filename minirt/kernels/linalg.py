"""Linear-algebra kernels: Gemm, MatMul, MatMulInteger, Einsum.

Everything funnels into numpy's BLAS-backed ``matmul``/``einsum`` so large
products run at BLAS speed; results keep the ONNX output dtype (float32 in,
float32 out; Python-float ``alpha``/``beta`` are converted to the data dtype
before they touch an array so nothing is promoted to float64).
"""
from __future__ import annotations

import functools

import numpy as np

from minirt import native as _native
from minirt.kernels import _narrow
from minirt.kernels.registry import is_constant, kernel, remember

# --------------------------------------------------------------------------- native float32 GEMM

# Below this many rows per matrix the product is a matrix-vector one: the native gemv
# (native.sgemv) reads b in place without packing it (our GEMM packs all of b first).
_NATIVE_MIN_ROWS = 4
# ... unless B is packed once (a constant weight, _PreparedProduct): then 1-3 rows take our GEMM too
# (see _PreparedProduct.run).
_F32 = np.dtype(np.float32)


def _as_rhs(b: np.ndarray):
    """(array to pass, transb, ldb) for the (..., K, N) operand b, without copying when possible."""
    if b.flags.c_contiguous:
        return b, 0, b.shape[-1]
    bt = np.swapaxes(b, -1, -2)
    if bt.flags.c_contiguous:  # a transposed view (Gemm transB, K^T): read it as stored
        return bt, 1, b.shape[-2]
    return np.ascontiguousarray(b), 0, b.shape[-1]


class _PreparedProduct:
    """A 2-D float32 product ``act(a @ b + bias[n])`` of one node for one shape of ``a`` (kept in the
    node's memo under it): the node's own ``B`` and ``C`` inputs it was made for (the arrays
    themselves: other objects are validated again), the result shape, the operand as the native
    GEMM reads it and the epilogue.  Running it costs the product and the epilogue only."""

    __slots__ = ("b", "c", "z", "k", "n", "rows", "y_shape", "rhs", "bias", "epilogue", "pack_b", "bpack", "native")

    def fits(self, a, b, c, z) -> bool:
        """Whether this is the product for these node inputs (``a`` has the shape it was made for; ``z``
        None, or the row-broadcast residual this product folded into its bias)."""
        return (self.b is b and self.c is c and z is self.z and a.dtype == _F32
                and _native.available)  # (tests turn it off)

    def run(self, a, out):
        rows, k, n = self.rows, self.k, self.n
        y = _product_buffer(out, self.y_shape, a, self.rhs[0], None)
        a2 = np.ascontiguousarray(a)
        rhs, transb, ldb, _ = self.rhs
        if self.pack_b:  # B packed once (see matmul_native), again after select_isa changed the layout
            bpack = self.bpack
            if bpack is None or bpack[0] != _native.isa:
                # (cached under the node's own B, the model's weight array: the builder's packed
                # weights are seeded under it at load, minirt/session.py)
                bpack = self.bpack = _native.sgemm_pack_b(rhs, transb, ldb, k, n, owner=self.b)
            _native.sgemm_pb_call(self.native, a2, bpack, y)
        elif rows < _NATIVE_MIN_ROWS:
            _small_rows_product(a2, rows, k, n, self.rhs, y, self.bias, None, self.epilogue)
        else:
            _native.sgemm_batch(1, rows, n, k, a2, k, 0, rhs, ldb, 0, transb, y, n, rows * n, self.bias, None, n,
                                rows * n, *self.epilogue)
        return y


def _small_rows_product(a2, rows, k, n, rhs, y, bias, z, epilogue) -> None:
    """y (rows x n, C-contiguous) = act(a2 @ b + bias[n] + z) for fewer than _NATIVE_MIN_ROWS rows (a
    matrix-vector product, bound by reading b): the native gemv reads ``b`` in place, threads over the
    columns, with bias and activation fused when there is no residual ``z``.  ``rhs``:
    ``_as_rhs(b) + (b,)``."""
    bb, transb, ldb, _ = rhs
    y2 = y.reshape(rows, n)
    if z is None:
        _native.sgemv(a2, rows, n, k, bb, ldb, transb, y2, bias, *epilogue)
        return
    _native.sgemv(a2, rows, n, k, bb, ldb, transb, y2)
    _column_epilogue(y2, bias, z, *epilogue)


def _column_epilogue(y2, bias, z, act, a0, a1) -> None:
    """In place on the C-contiguous (rows, n) product ``y2``: ``act(y2 + bias[n] + z)``, in that order
    (as the GEMM's epilogue).  The bias per column by numpy, the activation by the native row pass over
    the whole array (``native.bias_act`` takes a bias per row of planes: with one-value planes it would
    loop per element)."""
    if bias is not None:
        y2 += bias
    if z is not None:
        y2 += z.reshape(y2.shape)  # (z has the product's shape, y2 is it as rows x n)
    if act:
        _native.bias_act(y2.reshape(1, 1, -1), None, None, act, a0, a1)


def _product_buffer(out, shape, a, b, z):
    """``out`` when it has exactly the result's ``shape`` (float32, C-contiguous) and overlaps no
    operand, else a new array."""
    if (out is not None and out.shape == shape and out.dtype == _F32 and out.flags.c_contiguous
            and not np.may_share_memory(a, out) and not np.may_share_memory(b, out)
            and (z is None or not np.may_share_memory(z, out))):
        return out
    return np.empty(shape, dtype=np.float32)


def prepared_product(memo, a, b, c, z) -> _PreparedProduct | None:
    """The product a Gemm-like node prepared in its ``memo`` for these inputs (``a`` of the same
    shape, its ``B`` / ``C`` the same objects, no residual), or None."""
    prepared = memo.get(a.shape) if memo is not None else None
    return prepared if prepared is not None and prepared.fits(a, b, c, z) else None


def matmul_native(a, b, bias=None, z=None, act=0, a0=0.0, a1=0.0, out=None, memo=None, inputs=None):
    """``act(a @ b + bias[n] + z)`` for float32 through ``mrt_sgemm``, or ``None`` when it does not apply.

    ``a`` (..., M, K); ``b`` (K, N) or (..., K, N) with batch dimensions that
    broadcast (numpy.matmul rules) and may be a transposed view; ``bias`` (N,)
    or None; ``z`` exactly the output's shape or None.  Runs on the session's
    thread pool (BLAS is not involved); a 2-D ``b`` with fewer than
    ``_NATIVE_MIN_ROWS`` rows in ``a`` takes the matrix-vector product
    (:func:`_small_rows_product`), with the same epilogue.  ``out``: a
    buffer for the result, used when it has exactly its shape and dtype, is
    C-contiguous and overlaps no input.

    ``memo`` / ``inputs``: the calling node's memo and its own ``(B, C)`` inputs (``a`` being its
    ``A`` input as is): a 2-D product without residual is then kept prepared in the memo under
    ``a``'s shape (:func:`prepared_product`), valid while the node's B and C are these objects.
    """
    if not _native.available or a.dtype != _F32 or b.dtype != _F32 or a.ndim < 2 or b.ndim < 2:
        return None
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if b.shape[-2] != k or m < _NATIVE_MIN_ROWS and b.ndim > 2 or not a.size or not b.size:
        return None
    if bias is not None and (bias.dtype != _F32 or bias.shape != (n,)):
        return None
    z_in = z  # the node's Z: a row-broadcast one is folded into the bias below (kept with it by identity)
    if b.ndim == 2:
        rows = a.size // k
        out_shape = a.shape[:-1] + (n,)
        batch, sa, sb, mm = 1, 0, 0, rows
    else:
        bshape = a.shape[:-2]
        if b.shape[:-2] != bshape:  # (equal batch shapes, attention's case, skip numpy's ~1.3 us)
            try:
                bshape = np.broadcast_shapes(bshape, b.shape[:-2])
            except ValueError:
                return None
        batch = 1
        for d in bshape:
            batch *= d
        out_shape = bshape + (m, n)
        sa = m * k if a.shape[:-2] == bshape else (0 if a.size == m * k else None)
        sb = k * n if b.shape[:-2] == bshape else (0 if b.size == k * n else None)
        if sa is None or sb is None:
            return None
        mm = m
    if z is not None:
        if z.dtype != _F32:
            return None
        if z.shape != out_shape:
            if z.size != n or z.ndim > len(out_shape) or z.shape[-1] != n:
                return None
            # a residual that broadcasts along the rows is a bias per column
            zb = z.reshape(n)
            bias, z = (zb if bias is None else bias + zb), None
        else:
            z = np.ascontiguousarray(z)
    if bias is not None:
        bias = np.ascontiguousarray(bias)
    # kept when the node's B / C / Z decide the product: constants (read-only; a computed B may be
    # refilled in place) and no full-size residual (a per-call value)
    keep = memo is not None and inputs is not None and z is None and is_constant(*inputs, z_in)
    if b.ndim == 2 and z is None:
        prepared = _PreparedProduct()
        prepared.b, prepared.c = inputs if inputs is not None else (None, None)
        prepared.z = z_in
        prepared.k, prepared.n, prepared.rows, prepared.y_shape = k, n, rows, out_shape
        prepared.rhs = _as_rhs(b) + (b,)
        prepared.bias, prepared.epilogue = bias, (act, a0, a1)
        # A constant B (read-only: the node's weight; kept products only) is packed once, as the GEMM
        # would pack it on every call, from the first run (every run gives the same sums).  Packed, the
        # GEMM also beats BLAS on 2-3 rows (1024 x 128: 9.6 against 30-45 us), and one row takes its
        # several-panels gemv (FN(sgemv_pb_task); 1024 x 128: 5.0 against 7.9 us; 512 x 1000: 20-23
        # against 17-20 for BLAS and ~24 for the in-place native.sgemv, all bound by reading B), which
        # gives the GEMM's bits and is a recorded native call: a classifier head runs in a native
        # program (D32: MobileNet-style 1.18x -> 1.07x onnxruntime).
        prepared.pack_b = keep
        prepared.bpack = None
        # (the packed product's native structs, made once: a kept product runs many times)
        prepared.native = _native.sgemm_pb_prepare(rows, n, k, bias, act, a0, a1) if keep else None
        if keep and np.may_share_memory(prepared.rhs[0], b):  # (not a copy of b: it would miss changes)
            remember(memo, a.shape, prepared)
            # (later calls run the kept product as this one does: a program may replay it)
            return _native.final(prepared.run(a, out))
        return prepared.run(a, out)
    y = _product_buffer(out, out_shape, a, b, z)
    a2 = np.ascontiguousarray(a)
    if b.ndim == 2 and rows < _NATIVE_MIN_ROWS:
        _small_rows_product(a2, rows, k, n, _as_rhs(b) + (b,), y, bias, z, (act, a0, a1))
        return y
    bb, transb, ldb = _as_rhs(b)
    _native.sgemm_batch(batch, mm, n, k, a2, k, sa, bb, ldb, sb, transb, y, n, mm * n, bias, z, n, mm * n,
                        act, a0, a1)
    return _native.final(y)  # (one native call: a program may replay it when it reads no fresh copy)


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


def _gemm(a, b, c, alpha, beta, trans_a, trans_b, exact_c, out=None, memo=None):
    """``memo``: the node's memo, where the native product is kept prepared (:func:`prepared_product`)."""
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"Gemm: A and B must be 2-D, got shapes {a.shape} and {b.shape}")
    inputs = None if trans_a else (b, c)  # (the prepared product runs on the node's A as is)
    if trans_a:
        a = a.T
    if trans_b:
        b = b.T
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"Gemm: inner dimensions differ: A' is {a.shape}, B' is {b.shape} (transA={trans_a}, transB={trans_b})"
        )
    if alpha == 1.0 and a.dtype == _F32 and not (exact_c and c is not None and c.shape != (a.shape[0], b.shape[1])):
        fast = _gemm_native(a, b, c, beta, out, memo, inputs)
        if fast is not None:
            return fast
    half = a.dtype == np.float16
    if half:
        # No half-precision BLAS in numpy: compute in float32, round once.
        a, b = a.astype(np.float32), b.astype(np.float32)
        c = None if c is None else c.astype(np.float32)
    y = _scaled(np.matmul(a, b), alpha)
    if c is not None and beta != 0.0:
        y = _add_c(y, c, beta, exact_c)
    return y.astype(np.float16) if half else y


def _gemm_native(a, b, c, beta, out=None, memo=None, inputs=None):
    """``a @ b + beta * c`` (a, b already transposed views) on the native GEMM, or None.
    ``memo`` / ``inputs``: see :func:`matmul_native`."""
    if c is None or beta == 0.0:
        return matmul_native(a, b, out=out, memo=memo, inputs=inputs)
    if beta == 1.0 and c.dtype == _F32:
        n = b.shape[1]
        if c.shape in ((n,), (1, n)):
            return matmul_native(a, b, bias=c.reshape(n), out=out, memo=memo, inputs=inputs)
        if c.shape == (a.shape[0], n):
            return matmul_native(a, b, z=c, out=out)
    return None


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


@kernel("Gemm", since=7, context=True, out=True)
def gemm_7(a, b, c=None, /, *, alpha=1.0, beta=1.0, transA=0, transB=0, out=None, ctx=None):
    # Covers opsets 7/9/11/13: 9 and 13 only widened the type list, 11 made C optional.
    memo = None if ctx is None else ctx.memo
    prepared = prepared_product(memo, a, b, c, None)
    if prepared is not None:
        return _native.final(prepared.run(a, out))  # (a program may replay it)
    return _gemm(a, b, c, alpha, beta, transA, transB, exact_c=False, out=out, memo=memo)


# --------------------------------------------------------------------------- MatMul


@kernel("MatMul", since=1, context=True, out=True)
def matmul(a, b, /, *, out=None, ctx=None):
    """``ctx``: the node's context, whose memo keeps a 2-D float32 product prepared per shape of ``a``."""
    memo = None if ctx is None else ctx.memo
    prepared = prepared_product(memo, a, b, None, None)
    if prepared is not None:
        return _native.final(prepared.run(a, out))  # (a program may replay it)
    try:
        if a.dtype == np.float16 and b.dtype == np.float16:
            # No half-precision BLAS in numpy: compute in float32, round once.
            y = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
        elif _narrow.is_narrow_float(a.dtype) and a.dtype == b.dtype:
            # bfloat16 / float8 (ml_dtypes): float32 products and sums, rounded once.
            y = np.asarray(np.matmul(a.astype(np.float32), b.astype(np.float32))).astype(a.dtype)
        else:
            y = matmul_native(a, b, out=out, memo=memo, inputs=(b, None))
            if y is not None:
                return y
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
