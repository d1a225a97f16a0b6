"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
QLinearMatMul, QLinearConv, ConvInteger.

Quantized types: the integer types numpy holds natively (uint8, int8,
uint16, int16, int32) and, through ml_dtypes, int4/uint4/int2/uint2 (clamped
to their range), the float8 family (round to nearest even; ``saturate``
clamps out-of-range values to the largest finite value) and float4e2m1
(always saturating).  Scales may be
per-tensor (scalar), per-axis (1-D along ``axis``) or blocked (same rank as
the input, ``block_size`` elements per scale along ``axis``).
"""
from __future__ import annotations

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY
from minirt.kernels import _narrow
from minirt.kernels.registry import kernel, lookup

_INT_RANGE = {np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max) for t in (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.uint32)}


def _expand(param: np.ndarray, x_shape: tuple, axis: int, block_size: int) -> np.ndarray:
    """Broadcast a scale / zero point against an input of shape ``x_shape``."""
    p = np.asarray(param)
    nd = len(x_shape)
    if p.ndim == 0 or (p.size == 1 and block_size <= 0):
        return p.reshape(())
    ax = axis + nd if axis < 0 else axis
    if block_size > 0:
        if p.ndim != nd:
            raise ValueError(f"blocked quantization: scale rank {p.ndim} != input rank {nd}")
        rep = np.repeat(p, block_size, axis=ax)
        return np.take(rep, np.arange(x_shape[ax]), axis=ax)
    if p.ndim != 1 or p.shape[0] != x_shape[ax]:
        raise ValueError(f"per-axis quantization: scale shape {p.shape} does not match axis {axis} of {x_shape}")
    shape = [1] * nd
    shape[ax] = p.shape[0]
    return p.reshape(shape)


def _saturate_cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    lo, hi = _INT_RANGE[np.dtype(dtype)]
    with np.errstate(invalid="ignore"):  # (NaN: a NaN scale's values; numpy casts it as C does)
        return np.clip(values, lo, hi).astype(dtype)


def _supported_output(dt: np.dtype) -> bool:
    return dt in _INT_RANGE or _narrow.is_subbyte_int(dt) or dt.name in _narrow.FLOAT8_NAMES \
        or dt.name == _narrow.FLOAT4_NAME


def _output_dtype(zero_point, output_dtype: int) -> np.dtype:
    if zero_point is not None:
        dt = np.asarray(zero_point).dtype
    elif output_dtype:
        dt = ONNX_TO_NUMPY.get(int(output_dtype))
        if dt is None:
            raise ValueError(f"QuantizeLinear: output_dtype {output_dtype} is not supported")
    else:
        return np.dtype(np.uint8)
    if not _supported_output(dt):
        raise ValueError(f"QuantizeLinear: cannot quantize to {dt}")
    return dt


def _compute_type(*dtypes) -> np.dtype:
    """float32 at least; float64 if any participant is float64 (narrow floats count as float32)."""
    wide = [np.dtype(np.float32) if _narrow.is_narrow_float(d) else np.dtype(d) for d in dtypes]
    return np.result_type(*wide, np.float32)


def _quantize(x, scale, zero_point, axis, block_size, out_dtype, saturate=1, precision=0):
    x = _narrow.widen(np.asarray(x))
    scale = _narrow.widen(np.asarray(scale))
    if precision:
        ctype = _compute_type(ONNX_TO_NUMPY.get(int(precision), np.float32))
    else:
        ctype = _compute_type(x.dtype, scale.dtype)
    s = _expand(scale, x.shape, axis, block_size).astype(ctype)
    with np.errstate(divide="ignore", invalid="ignore"):  # (a zero scale: +-inf, saturated below, as onnxruntime)
        q = x.astype(ctype) / s
    float_out = out_dtype.name in _narrow.FLOAT8_NAMES or out_dtype.name == _narrow.FLOAT4_NAME
    if not float_out:
        q = np.rint(q)  # round half to even
    if zero_point is not None:
        zp = _narrow.widen(np.asarray(zero_point))
        q = q + _expand(zp, x.shape, axis, block_size).astype(ctype)
    if float_out:
        # float4e2m1 has no overflow encoding: it always saturates.
        return _narrow.to_float8(q, out_dtype, saturate or out_dtype.name == _narrow.FLOAT4_NAME)
    if _narrow.is_subbyte_int(out_dtype):
        return _narrow.to_subbyte_int(q, out_dtype)
    return _saturate_cast(q, out_dtype)


@kernel("QuantizeLinear", since=10)
def quantize_linear(x, y_scale, y_zero_point=None, /, *, axis=1, block_size=0, output_dtype=0, saturate=1,
                    precision=0):
    return _quantize(x, y_scale, y_zero_point, axis, block_size, _output_dtype(y_zero_point, output_dtype),
                     saturate, precision)


@kernel("DequantizeLinear", since=10)
def dequantize_linear(x, x_scale, x_zero_point=None, /, *, axis=1, block_size=0, output_dtype=0):
    x = np.asarray(x)
    scale = np.asarray(x_scale)
    out_dt = ONNX_TO_NUMPY.get(int(output_dtype)) if output_dtype else scale.dtype
    if _narrow.is_float_like(x.dtype):
        # float8 / float4 codes: the value itself (exact in float32)
        v = _narrow.widen(x).astype(np.float64)
    else:
        v = _narrow.widen(x).astype(np.int64)
    if x_zero_point is not None:
        zp = _narrow.widen(np.asarray(x_zero_point))
        v = v - _expand(zp, x.shape, axis, block_size).astype(v.dtype)
    ctype = _compute_type(scale.dtype)
    y = v.astype(ctype) * _expand(_narrow.widen(scale), x.shape, axis, block_size).astype(ctype)
    return y.astype(out_dt)


@kernel("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x):
    x = np.asarray(x, dtype=np.float32)
    x_min = np.float32(min(0.0, float(x.min()) if x.size else 0.0))
    x_max = np.float32(max(0.0, float(x.max()) if x.size else 0.0))
    scale = np.float32((x_max - x_min) / np.float32(255.0))
    if scale == 0:
        zp = np.uint8(0)
        y = np.zeros(x.shape, np.uint8)
    else:
        zp = _saturate_cast(np.rint(np.float32(0) - x_min / scale), np.uint8)
        y = _saturate_cast(np.rint(x / scale) + np.float32(zp), np.uint8)
    return y, np.array(scale, np.float32), np.array(zp, np.uint8)


def _requantize(acc: np.ndarray, multiplier: np.ndarray, y_zero_point, out_dtype) -> np.ndarray:
    y = np.rint(acc.astype(np.float64) * multiplier)
    if y_zero_point is not None:
        y = y + np.asarray(y_zero_point).astype(np.float64)
    return _saturate_cast(y, out_dtype)


def _as_rows(p, ndim_matrix: int):
    """Per-row parameter of A ([M]) -> column vector that broadcasts over [.., M, K]."""
    p = np.asarray(p)
    return p.reshape(-1, 1) if p.ndim == 1 and p.size > 1 else p.reshape(p.shape if p.ndim > 1 else ())


@kernel("QLinearMatMul", since=10)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    a = np.asarray(a).astype(np.int64) - _as_rows(a_zero_point, 2).astype(np.int64)
    bz = np.asarray(b_zero_point)
    b = np.asarray(b).astype(np.int64) - (bz.reshape(1, -1) if bz.ndim == 1 and bz.size > 1 else bz).astype(np.int64)
    acc = np.matmul(a, b)
    a_s = _as_rows(a_scale, 2).astype(np.float64)
    bs = np.asarray(b_scale).astype(np.float64)
    b_s = bs.reshape(1, -1) if bs.ndim == 1 and bs.size > 1 else bs
    mult = a_s * b_s / np.asarray(y_scale).astype(np.float64)
    return _requantize(acc, mult, y_zero_point, np.asarray(y_zero_point).dtype)


def _int_conv(x, w, x_zero_point, w_zero_point, attrs) -> np.ndarray:
    """Exact integer convolution of (x - x_zp) and (w - w_zp), as int64 values in float64."""
    conv = lookup("", "Conv", 11).fn
    xf = np.asarray(x).astype(np.float64)
    if x_zero_point is not None:
        xf = xf - np.asarray(x_zero_point).astype(np.float64).reshape(())
    wf = np.asarray(w).astype(np.float64)
    if w_zero_point is not None:
        wz = np.asarray(w_zero_point).astype(np.float64)
        if wz.ndim == 1 and wz.size > 1:
            wz = wz.reshape((-1,) + (1,) * (wf.ndim - 1))
        wf = wf - wz
    return np.rint(conv(xf, wf, None, **attrs))


def _conv_attrs(auto_pad, dilations, group, kernel_shape, pads, strides) -> dict:
    return dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)


@kernel("ConvInteger", since=10)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, auto_pad="NOTSET", dilations=(), group=1,
                 kernel_shape=(), pads=(), strides=()):
    acc = _int_conv(x, w, x_zero_point, w_zero_point, _conv_attrs(auto_pad, dilations, group, kernel_shape, pads, strides))
    return acc.astype(np.int32)


@kernel("QLinearConv", since=10)
def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None,
                 auto_pad="NOTSET", dilations=(), group=1, kernel_shape=(), pads=(), strides=()):
    acc = _int_conv(x, w, x_zero_point, w_zero_point, _conv_attrs(auto_pad, dilations, group, kernel_shape, pads, strides))
    if B is not None:
        acc = acc + np.asarray(B).astype(np.float64).reshape((1, -1) + (1,) * (acc.ndim - 2))
    ws = np.asarray(w_scale).astype(np.float64)
    if ws.ndim == 1 and ws.size > 1:
        ws = ws.reshape((1, -1) + (1,) * (acc.ndim - 2))
    mult = np.asarray(x_scale).astype(np.float64) * ws / np.asarray(y_scale).astype(np.float64)
    out_dtype = np.asarray(y_zero_point).dtype if y_zero_point is not None else np.dtype(np.uint8)
    return _requantize(acc, mult, y_zero_point, out_dtype)
