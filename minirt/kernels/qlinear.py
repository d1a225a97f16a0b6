"""Quantized compute ops: minirt's own ``com.minirt::QConv`` / ``QMatMul`` and
onnxruntime's ``com.microsoft`` QOperator extras (QGemm, QLinearAdd, ...).

``QConv`` and ``QMatMul`` come out of the builder's quantizer
(``builder/quantize``, docs/fused_ops.md).  They take *float* activations and
*int8* weights with per-output-channel scales, so quantized layers slot into
an otherwise float graph without Quantize/Dequantize nodes between them::

    xq = saturate(rint(x / x_scale) + x_zero_point)        # static: calibrated scale
       (dynamic when x_scale is absent: uint8 over [min(x, 0), max(x, 0)])
    y  = activation(sum_k (xq - x_zero_point) * w[m, k] * x_scale * w_scale[m] + bias + z)

The numpy implementation below computes exactly that with float32 BLAS on the
integer-valued operands (every product is an integer <= 255 * 127, so sums are
exact up to K ~ 500 and within float32 rounding beyond), i.e. it is as fast as
the float layer plus one pass to quantize x, not faster.  When the native
extension provides an int8 GEMM (``minirt.native.qgemm_u8s8``) the integer
product runs there instead; see docs/decisions.md (quantization).
"""
from __future__ import annotations

import functools

import numpy as np

from minirt.kernels.registry import kernel, lookup

DOMAIN = "com.minirt"
MS = "com.microsoft"


@functools.lru_cache(maxsize=None)
def _fn(domain: str, op_type: str, opset: int):
    entry = lookup(domain, op_type, opset)
    if entry is None:  # pragma: no cover - the families are always registered
        raise NotImplementedError(f"quantized op needs the kernel {domain or 'ai.onnx'}::{op_type}")
    return entry.fn


def _quant_params(x: np.ndarray, x_scale, x_zero_point, per_channel_ok: bool = False):
    """(scale, zero point, lo, hi) for x: static when x_scale is given, else dynamic uint8.

    A 1-D ``x_scale`` of C > 1 elements quantizes each channel (axis 1) with
    its own scale and zero point; only depthwise QConv accepts that.
    """
    if x_scale is not None and np.asarray(x_scale).size > 1:
        xs = np.asarray(x_scale, dtype=np.float32)
        if not per_channel_ok or xs.ndim != 1 or x.ndim < 2 or xs.shape[0] != x.shape[1]:
            raise ValueError(f"per-channel x_scale {xs.shape} needs a depthwise QConv and an input with "
                             f"{xs.size} channels (got input shape {x.shape})")
        shape = (1, -1) + (1,) * (x.ndim - 2)
        if x_zero_point is None:
            return xs.reshape(shape), np.zeros(shape, np.float32), 0, 255
        zp_arr = np.asarray(x_zero_point)
        info = np.iinfo(zp_arr.dtype)
        return xs.reshape(shape), zp_arr.astype(np.float32).reshape(shape), int(info.min), int(info.max)
    if x_scale is not None:
        s = float(np.asarray(x_scale).reshape(()))
        if x_zero_point is None:
            return s, 0, 0, 255
        zp_arr = np.asarray(x_zero_point)
        info = np.iinfo(zp_arr.dtype)
        return s, int(zp_arr.reshape(())), int(info.min), int(info.max)
    lo = min(0.0, float(x.min())) if x.size else 0.0
    hi = max(0.0, float(x.max())) if x.size else 0.0
    s = float(np.float32((hi - lo) / 255.0))
    if s == 0.0:
        return 1.0, 0, 0, 255
    zp = int(np.clip(np.rint(-lo / s), 0, 255))
    return s, zp, 0, 255


def fake_quantize(x: np.ndarray, scale: float, zero_point: int, lo: int, hi: int) -> np.ndarray:
    """``(saturate(rint(x / scale) + zp) - zp) * scale`` in float32: x as the integer kernel sees it."""
    scale = np.asarray(scale, dtype=np.float32)
    zp = np.asarray(zero_point, dtype=np.float32)
    t = np.divide(np.asarray(x, dtype=np.float32), scale)
    np.rint(t, out=t)
    # Clip in the shifted domain: saturate(q + zp) - zp == clip(q, lo - zp, hi - zp).
    np.clip(t, np.float32(lo) - zp, np.float32(hi) - zp, out=t)
    t *= scale
    return t


def _dequant_weight(w: np.ndarray, w_scale: np.ndarray, axis: int) -> np.ndarray:
    ws = np.asarray(w_scale, dtype=np.float32)
    if ws.size == 1:
        return w.astype(np.float32) * ws.reshape(())
    shape = [1] * w.ndim
    shape[axis] = ws.size
    return w.astype(np.float32) * ws.reshape(shape)


@kernel("QConv", since=1, domain=DOMAIN)
def qconv(
    x, x_scale=None, x_zero_point=None, w=None, w_scale=None, b=None, z=None, /, *, auto_pad="NOTSET", dilations=(),
    group=1, kernel_shape=(), pads=(), strides=(), activation="", activation_params=(),
):
    """activation(Conv(quant(x), int8 w * w_scale[m]) + b + z); float in, float out."""
    if w is None or w_scale is None:
        raise ValueError("QConv: inputs W and W_scale are required")
    if w.dtype != np.int8:
        raise ValueError(f"QConv: W must be int8, got {w.dtype}")
    depthwise = x.ndim >= 2 and w.shape[1] == 1 and group == x.shape[1] == w.shape[0]
    s, zp, lo, hi = _quant_params(x, x_scale, x_zero_point, per_channel_ok=depthwise)
    xq = fake_quantize(x, s, zp, lo, hi)
    wf = _dequant_weight(w, w_scale, 0)
    return _fn(DOMAIN, "FusedConv", 1)(
        xq, wf, b, z, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
        strides=strides, activation=activation, activation_params=activation_params,
    )


@kernel("QMatMul", since=1, domain=DOMAIN)
def qmatmul(a, a_scale=None, a_zero_point=None, b=None, b_scale=None, bias=None, z=None, /, *, transB=0,
            activation="", activation_params=()):
    """activation(quant(a) @ (int8 b * b_scale[n]) (b transposed when transB) + bias + z)."""
    if b is None or b_scale is None:
        raise ValueError("QMatMul: inputs B and B_scale are required")
    if b.dtype != np.int8 or b.ndim != 2:
        raise ValueError(f"QMatMul: B must be a 2-D int8 matrix, got {b.dtype} {b.shape}")
    s, zp, lo, hi = _quant_params(a, a_scale, a_zero_point)
    aq = fake_quantize(a, s, zp, lo, hi)
    bf = _dequant_weight(b, b_scale, 0 if transB else 1)
    y = np.matmul(aq, bf.T if transB else bf)
    for extra in (bias, z):
        if extra is None:
            continue
        if np.broadcast_shapes(y.shape, extra.shape) == y.shape:
            y += extra
        else:
            y = y + extra
    if activation:
        y = _fn(DOMAIN, "Activation", 1)(y, activation=activation, activation_params=activation_params)
    return y


# --------------------------------------------------------------------------- com.microsoft QOperator extras
# onnxruntime's quantization tool emits these in QOperator format.  Each is
# dequantize -> float op -> quantize, computed once in float32/64 (reference
# semantics, not speed).


def _dq(x, scale, zp):
    v = np.asarray(x).astype(np.float64)
    if zp is not None:
        zp = np.asarray(zp)
        v = v - (zp.reshape(-1, *([1] * (v.ndim - 1))) if zp.ndim == 1 and zp.size > 1 and v.ndim > 1 else zp).astype(np.float64)
    s = np.asarray(scale).astype(np.float64)
    return v * s


def _q(y, scale, zp, dtype=None):
    dt = np.asarray(zp).dtype if zp is not None else np.dtype(dtype or np.uint8)
    info = np.iinfo(dt)
    q = np.rint(np.asarray(y, dtype=np.float64) / float(np.asarray(scale).reshape(())))
    if zp is not None:
        q = q + float(np.asarray(zp).reshape(()))
    return np.clip(q, info.min, info.max).astype(dt)


@kernel("QGemm", since=1, domain=MS)
def ms_qgemm(a, a_scale, a_zp, b, b_scale, b_zp, c=None, y_scale=None, y_zp=None, /, *, alpha=1.0, transA=0, transB=0):
    """com.microsoft QGemm: int32 C bias; float output when y_scale is absent."""
    af = np.asarray(a).astype(np.float64) - np.asarray(a_zp).astype(np.float64).reshape(())
    if transA:
        af = af.T
    bf = np.asarray(b).astype(np.float64)
    if transB:
        bf = bf.T  # (K, N); zero points and scales are per tensor or per column N
    bz = np.asarray(b_zp).astype(np.float64)
    bs = np.asarray(b_scale).astype(np.float64)
    bf = bf - (bz.reshape(1, -1) if bz.size > 1 else bz.reshape(()))
    bs_b = bs.reshape(1, -1) if bs.size > 1 else bs.reshape(())
    acc = af @ bf
    if c is not None:
        acc = acc + np.asarray(c).astype(np.float64)
    y = acc * float(np.asarray(a_scale).reshape(())) * bs_b * float(alpha)
    if y_scale is None:
        return y.astype(np.float32)
    return _q(y, y_scale, y_zp)


def _binary(op):
    def fn(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp=None, /):
        return _q(op(_dq(a, a_scale, a_zp), _dq(b, b_scale, b_zp)), c_scale, c_zp)

    return fn


kernel("QLinearAdd", since=1, domain=MS)(_binary(np.add))
kernel("QLinearMul", since=1, domain=MS)(_binary(np.multiply))


@kernel("QLinearSigmoid", since=1, domain=MS)
def ms_qlinear_sigmoid(x, x_scale, x_zp, y_scale, y_zp=None, /):
    return _q(1.0 / (1.0 + np.exp(-_dq(x, x_scale, x_zp))), y_scale, y_zp)


@kernel("QLinearLeakyRelu", since=1, domain=MS)
def ms_qlinear_leaky_relu(x, x_scale, x_zp, y_scale, y_zp=None, /, *, alpha=0.01):
    v = _dq(x, x_scale, x_zp)
    return _q(np.where(v >= 0, v, alpha * v), y_scale, y_zp)


@kernel("QLinearGlobalAveragePool", since=1, domain=MS)
def ms_qlinear_gap(x, x_scale, x_zp, y_scale, y_zp=None, /, *, channels_last=0):
    v = _dq(x, x_scale, x_zp)
    axes = tuple(range(1, v.ndim - 1)) if channels_last else tuple(range(2, v.ndim))
    return _q(v.mean(axis=axes, keepdims=True), y_scale, y_zp)


@kernel("QLinearConcat", since=1, domain=MS)
def ms_qlinear_concat(y_scale, y_zp, *rest, axis=0):
    if len(rest) % 3:
        raise ValueError("QLinearConcat: inputs after Y_scale, Y_zero_point come in (X, X_scale, X_zero_point) triples")
    parts = [_dq(rest[i], rest[i + 1], rest[i + 2]) for i in range(0, len(rest), 3)]
    return _q(np.concatenate(parts, axis=axis), y_scale, y_zp)
