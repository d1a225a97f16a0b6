"""Kernels of minirt's own operator domain ``com.minirt`` (opset 1).

These ops only come out of the builder's optimizer (``builder/passes``); they
are documented in ``docs/fused_ops.md``.  Every one is a composition of
standard ONNX kernels, looked up through the registry and called in order,
so the math lives in one place: a fused node computes exactly what the
unfused nodes would, minus the intermediate values and per-node overhead.

Activations are named by the ``activation`` string attribute with their
parameters in ``activation_params`` (floats); the names and parameter counts
are the vocabulary's (``minirt.vocabulary.ACTIVATIONS``)::

    ""            identity                 ()
    "Relu"        max(x, 0)                ()
    "LeakyRelu"   x if x >= 0 else a*x     (alpha,)
    "Clip"        min(max(x, lo), hi)      (lo, hi)         # Relu6 is Clip(0, 6)
    "Sigmoid"     1 / (1 + exp(-x))        ()
    "Tanh"        tanh(x)                  ()
    "HardSigmoid" max(0, min(1, a*x + b))  (alpha, beta)
    "HardSwish"   x * HardSigmoid(x, 1/6, 1/2)  ()
    "SiLU"        x * sigmoid(x)           ()
    "Gelu"        0.5x(1 + erf(x/sqrt 2))  ()
    "GeluTanh"    tanh-approximated Gelu   ()
"""
from __future__ import annotations

import functools

import numpy as np

from minirt.kernels.registry import NodeContext, kernel, lookup
from minirt import native as _native
from minirt import vocabulary
from minirt.kernels import elementwise, linalg, nn

DOMAIN = vocabulary.MINIRT_DOMAIN


@functools.lru_cache(maxsize=None)
def _std(op_type: str, opset: int = 21):
    entry = lookup("", op_type, opset)
    if entry is None:
        raise NotImplementedError(f"com.minirt fused op needs the standard kernel {op_type} (opset {opset})")
    return entry.fn


def _hard_swish(x):
    return _std("HardSwish")(x)


def _silu(x):
    return _std("Mul")(x, _std("Sigmoid")(x))


def _clip(x, lo, hi):
    return _std("Clip")(x, np.asarray(lo, dtype=x.dtype), np.asarray(hi, dtype=x.dtype))


# name -> fn(x, *params): one for every activation of the vocabulary, no other (a missing one fails
# the import below; tests/test_vocabulary.py checks both directions and the parameter counts).
_FUNCTIONS = {
    "": lambda x: x,
    "Relu": lambda x: _std("Relu")(x),
    "LeakyRelu": lambda x, a: _std("LeakyRelu")(x, alpha=a),
    "Clip": _clip,
    "Sigmoid": lambda x: _std("Sigmoid")(x),
    "Tanh": lambda x: _std("Tanh")(x),
    "HardSigmoid": lambda x, a, b: _std("HardSigmoid")(x, alpha=a, beta=b),
    "HardSwish": _hard_swish,
    "SiLU": _silu,
    "Gelu": lambda x: _std("Gelu")(x, approximate="none"),
    "GeluTanh": lambda x: _std("Gelu")(x, approximate="tanh"),
}
# name -> (number of params, fn(x, *params)), in the vocabulary's order
ACTIVATIONS = {name: (a.params, _FUNCTIONS[name]) for name, a in vocabulary.ACTIVATIONS.items()}


def apply_activation(y: np.ndarray, activation: str, params) -> np.ndarray:
    try:
        n, fn = ACTIVATIONS[activation]
    except KeyError:
        raise ValueError(f"unknown fused activation {activation!r}; known: {sorted(ACTIVATIONS)}") from None
    params = tuple(params or ())
    if len(params) != n:
        raise ValueError(f"activation {activation!r} takes {n} parameter(s), got {list(params)}")
    return fn(y, *params)


def _add_residual(y: np.ndarray, z) -> np.ndarray:
    if z is None:
        return y
    if z.shape == y.shape and z.dtype == y.dtype and y.flags.writeable and y.flags.owndata:
        y += z  # y is the fresh result of the kernel above: safe to update in place
        _native.modified(y)  # (numpy work after that kernel's native calls: no longer their result)
        return y
    return _std("Add")(y, z)


@kernel("FusedConv", since=1, domain=DOMAIN, context=True, out=True)
def fused_conv(
    x, w, b=None, z=None, /, *, auto_pad="NOTSET", dilations=(), group=1, kernel_shape=(), pads=(), strides=(),
    activation="", activation_params=(), out=None, ctx=None,
):
    """activation(Conv(x, w, b) + z).  ``out``: a result buffer (native path only)."""
    # Native path: bias, residual and activation applied in the conv's own pass
    # (None when it cannot: no native module, not 2-D float32, other activations).
    y = nn.conv_fused_native(
        x, w, b, z, activation=activation, activation_params=activation_params, auto_pad=auto_pad,
        dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides, out=out,
        memo=None if ctx is None else ctx.memo,
    )
    if y is not None:
        return y
    y = _std("Conv", 11)(
        x, w, b, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
        strides=strides,
    )
    return apply_activation(_add_residual(y, z), activation, activation_params)


@kernel("FusedConvTranspose", since=1, domain=DOMAIN, out=True)
def fused_conv_transpose(
    x, w, b=None, /, *, auto_pad="NOTSET", dilations=(), group=1, kernel_shape=(), output_padding=(), output_shape=(),
    pads=(), strides=(), activation="", activation_params=(), out=None,
):
    """activation(ConvTranspose(x, w, b)); the stride == kernel path applies it in its GEMM epilogue.
    ``out``: the result buffer (memory plan), used by that path when it fits."""
    y, activated = nn.conv_transpose_act(
        x, w, b, nn.native_act(activation, activation_params), auto_pad=auto_pad, dilations=dilations, group=group,
        kernel_shape=kernel_shape, output_padding=output_padding, output_shape=output_shape, pads=pads,
        strides=strides, dst=out,
    )
    if activated or not activation:
        return y
    _native.modified(y)  # (numpy work after the native call: no longer its result alone)
    return apply_activation(y, activation, activation_params)


@kernel("FusedGemm", since=1, domain=DOMAIN, context=True, out=True)
def fused_gemm(
    a, b, c=None, z=None, /, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation="", activation_params=(), out=None,
    ctx=None,
):
    """activation(Gemm(a, b, c) + z).  ``ctx``: the node's context, whose memo keeps the native product
    prepared per shape of ``a`` (linalg.prepared_product)."""
    memo = None if ctx is None else ctx.memo
    prepared = linalg.prepared_product(memo, a, b, c, z)
    if prepared is not None:
        return _native.final(prepared.run(a, out))  # (a program may replay it)
    spec = nn.native_act(activation, activation_params)
    if spec is not None and alpha == 1.0 and a.ndim == 2 and b.ndim == 2 and (z is None or z.ndim == 2):
        bias = None
        if c is not None and beta != 0.0:
            n = b.shape[0] if transB else b.shape[1]
            bias = c.reshape(n) if beta == 1.0 and c.shape in ((n,), (1, n)) else False
        if bias is not False:
            y = linalg.matmul_native(a.T if transA else a, b.T if transB else b, bias, z, *spec, out=out, memo=memo,
                                     inputs=None if transA else (b, c))
            if y is not None:
                return y
    y = _std("Gemm", 13)(a, b, c, alpha=alpha, beta=beta, transA=transA, transB=transB)
    return apply_activation(_add_residual(y, z), activation, activation_params)


@kernel("FusedMatMul", since=1, domain=DOMAIN, context=True, out=True)
def fused_matmul(a, b, bias=None, z=None, /, *, activation="", activation_params=(), out=None, ctx=None):
    """activation(MatMul(a, b) + bias + z).  ``ctx``: the node's context, whose memo keeps a float32
    product with a 2-D ``b`` (and no ``z``) prepared per shape of ``a``, as MatMul and Gemm do."""
    memo = None if ctx is None else ctx.memo
    prepared = linalg.prepared_product(memo, a, b, bias, z)
    if prepared is not None:
        return _native.final(prepared.run(a, out))  # (a program may replay it)
    spec = nn.native_act(activation, activation_params)
    if spec is not None:
        y = linalg.matmul_native(a, b, bias, z, *spec, out=out, memo=memo, inputs=(b, bias))
        if y is not None:
            return y
    y = _std("MatMul", 13)(a, b)
    if bias is not None:
        y = _add_residual(y, bias) if bias.shape == y.shape else _std("Add")(y, bias)
    return apply_activation(_add_residual(y, z), activation, activation_params)


@kernel("Activation", since=1, domain=DOMAIN, out=True)
def activation_op(x, /, *, activation="", activation_params=(), out=None):
    """A standalone activation of the table above (recognised from decomposed forms).  A float32
    contiguous input and an activation the native epilogues compute: one native call
    (mrt_activation_f32) into ``out`` (the memory plan's buffer) when it fits."""
    if activation:  # (the identity returns x itself, as the numpy path does)
        spec = nn.native_act(activation, activation_params)
        if spec is not None:
            y = elementwise._native_activation(x, out, activation, spec[1], spec[2])
            if y is not None:
                return y
    return apply_activation(x, activation, activation_params)


@kernel("LayerNormalization", since=1, domain=DOMAIN, out=True)
def layer_normalization(x, scale=None, bias=None, /, *, axis=-1, epsilon=1e-5, out=None):
    """ONNX LayerNormalization (opset 17) for models of any opset; one output."""
    if scale is None:
        scale = np.ones(x.shape[axis:], dtype=x.dtype)
    ctx = NodeContext("LayerNormalization", "LayerNormalization", 1, (x.dtype,), 17)
    return _std("LayerNormalization", 17)(x, scale, bias, axis=axis, epsilon=epsilon, ctx=ctx, out=out)


@kernel("ScaledDotProductAttention", since=1, domain=DOMAIN, out=True)
def scaled_dot_product_attention(q, k, v, mask=None, /, *, scale=1.0, transpose_k=1, out=None):
    """Softmax(q @ k^T * scale + mask) @ v over the last two axes.

    With ``transpose_k=0``, ``k`` is already transposed (``... x d x n``).  Float32 operands of the same
    leading axes go to one native call (:func:`_sdpa_native`: the scores of a block of queries stay in
    cache between the products, the same results); the others run the composed kernels.
    """
    y = _sdpa_native(q, k, v, mask, scale, transpose_k, out)
    if y is not None:
        return y
    kt = np.swapaxes(k, -1, -2) if transpose_k else k
    s = _std("MatMul", 13)(q, kt)
    if scale != 1.0:
        if s.flags.writeable and s.flags.owndata and not _native.recording():
            s *= s.dtype.type(scale)  # s is the fresh MatMul result: scale in place (a recording: a call)
            _native.modified(s)
        else:
            s = _std("Mul")(s, np.asarray(scale, dtype=s.dtype))
    if mask is not None:
        s = _add_residual(s, mask) if mask.dtype == s.dtype else _std("Add")(s, mask)
    p = _std("Softmax", 13)(s, axis=-1)
    return _std("MatMul", 13)(p, v)


def _sdpa_mask_strides(mask, batch: tuple, sq: int, sk: int):
    """(stride per flattened leading index, stride per query row) of a float32 C-contiguous mask that
    broadcasts to ``batch + (sq, sk)`` with one row per query or one for all, and one matrix per leading
    index or one for all; None for any other mask (the composed kernels broadcast it)."""
    if mask.dtype != np.float32 or not mask.flags.c_contiguous or mask.ndim > len(batch) + 2 or mask.ndim < 1:
        return None
    shape = (1,) * (len(batch) + 2 - mask.ndim) + mask.shape
    if shape[-1] != sk or shape[-2] not in (1, sq):
        return None
    rows = shape[-2]
    if all(d == 1 for d in shape[:-2]):
        per_batch = 0
    elif shape[:-2] == batch:
        per_batch = rows * sk
    else:
        return None
    return per_batch, (sk if rows == sq and sq > 1 else 0)


def _sdpa_native(q, k, v, mask, scale, transpose_k, out):
    """The attention as one native call (minirt/native/sdpa_impl.h) into ``out`` (the memory plan's buffer)
    when it fits, or None: float32 C-contiguous q (..., sq, d), k (..., sk, d) (``transpose_k``) or
    (..., d, sk), v (..., sk, dv) with the same leading axes, at least one key and one feature, and a mask
    that :func:`_sdpa_mask_strides` takes.  (The composed kernels of the other cases compute the result
    with numpy between native calls: a model holding such an attention runs node by node.)"""
    if not _native.available or not all(
            isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim >= 2 and a.flags.c_contiguous
            for a in (q, k, v)):
        return None
    batch = q.shape[:-2]
    if k.shape[:-2] != batch or v.shape[:-2] != batch:
        return None
    sq, d = q.shape[-2:]
    sk, kd = (k.shape[-2], k.shape[-1]) if transpose_k else (k.shape[-1], k.shape[-2])
    if kd != d or v.shape[-2] != sk or sk < 1 or d < 1:
        return None
    strides = (0, 0)
    if mask is not None:
        if not isinstance(mask, np.ndarray):
            return None
        strides = _sdpa_mask_strides(mask, batch, sq, sk)
        if strides is None:
            return None
    y = nn._out_buffer(out, batch + (sq, v.shape[-1]))
    _native.sdpa(q, k, v, mask, y, float(scale), bool(transpose_k), strides)
    return _native.final(y)

