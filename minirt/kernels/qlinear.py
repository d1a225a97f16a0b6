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

from minirt import native as _native
from minirt.kernels import fused, nn, tensor
from minirt.kernels.registry import is_constant, kernel, lookup, remember
from minirt.vocabulary import MINIRT_DOMAIN as DOMAIN

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
    return _dynamic_params(x, 255)


def _dynamic_params(x: np.ndarray, levels: int):
    """(scale, zero point, 0, levels) of ``x`` quantized dynamically into [0, levels] (255: uint8, as
    DynamicQuantizeLinear) over [min(x, 0), max(x, 0)]; the native q_dynamic_params computes the same."""
    lo = min(0.0, float(x.min())) if x.size else 0.0
    hi = max(0.0, float(x.max())) if x.size else 0.0
    s = float(np.float32((hi - lo) / float(levels)))
    if s == 0.0:
        return 1.0, 0, 0, levels
    zp = int(np.clip(np.rint(-lo / s), 0, levels))
    return s, zp, 0, levels


def _dynamic_quant(x: np.ndarray, w_scale: np.ndarray, levels: int = 255) -> tuple:
    """(scale, zero point, scale * w_scale as float32) of ``x`` quantized dynamically into [0, levels]
    (255: uint8, as the native kernels' own dynamic quantization, so that both give the same products)."""
    sc, zp_u8, _, _ = _dynamic_params(x, levels)
    return sc, zp_u8, (np.float32(sc) * w_scale).astype(np.float32)


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


def _dequant_weight(w: np.ndarray, w_scale: np.ndarray, axis: int, out: np.ndarray | None = None) -> np.ndarray:
    """float32 ``w * w_scale`` (one scale, or one per index of ``axis``), into ``out`` when given."""
    ws = np.asarray(w_scale, dtype=np.float32)
    if ws.size != 1:
        shape = [1] * w.ndim
        shape[axis] = ws.size
        ws = ws.reshape(shape)
    else:
        ws = ws.reshape(())
    if out is None:
        return w.astype(np.float32) * ws
    _assign(out, w)
    out *= ws
    return out


def _assign(out: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``out`` holding ``w``'s values as float32."""
    np.copyto(out, w, casting="unsafe")
    return out


# --------------------------------------------------------------------------- native int8 fast paths


def _native_ready() -> bool:
    from minirt import native

    return native.available


def qconv_native(xq, x_zero, w, w_scale_eff, bias, z, out, k, s, d, pb, group, act=0, a0=0.0, a1=0.0):
    """Float ``act(scale[m] * conv(xq - x_zero, w) + bias[m] + z)`` with the native int8 GEMM.

    ``xq`` uint8 (N, C, H, W) contiguous, ``w`` int8 (M, C/group, KH, KW) with zero
    point 0, ``w_scale_eff`` float32 (M,) (x_scale * w_scale[m], or whatever
    multiplier the caller wants), ``bias`` float32 (M,) or None, ``z`` float32
    like the output or None.  Returns float32 (N, M, OH, OW).
    """
    from minirt import native

    n, c, h, wd = xq.shape
    m, cg = w.shape[:2]
    kk = k[0] * k[1]
    p = out[0] * out[1]
    mg = m // group
    y = np.empty((n, m) + tuple(out), dtype=np.float32)
    yv = y.reshape(n, group, mg, p)
    zv = None if z is None else np.ascontiguousarray(z, dtype=np.float32).reshape(n, group, mg, p)
    w2 = w.reshape(group, mg, cg * kk)
    scale = np.ascontiguousarray(w_scale_eff, dtype=np.float32)
    bias = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    direct = kk == 1 and tuple(s) == (1, 1) and tuple(pb) == (0, 0) and tuple(out) == (h, wd)
    cols = None if direct else np.empty((c * kk, p), dtype=np.uint8)
    for i in range(n):
        if direct:
            xi = xq[i].reshape(group, cg, p)
        else:
            native.im2col_u8(xq[i], cols, k, s, d, pb, out, x_zero)
            xi = cols.reshape(group, cg * kk, p)
        for g in range(group):
            packed = native.qpack(w2[g], owner=w, tag=g)
            sl = slice(g * mg, (g + 1) * mg)
            native.qgemm(packed, mg, cg * kk, xi[g], x_zero, scale[sl], yv[i, g],
                         None if bias is None else bias[sl], None if zv is None else zv[i, g], act, a0, a1)
    return y


class _QConvPlan:
    """Everything a native QConv call needs that does not depend on the input values,
    for one (weights, input shape, attributes): geometry, packed weights, scales."""

    __slots__ = ("w_ref", "keep", "out_shape", "sc", "zp_u8", "lo", "dynamic", "args", "pool")


_F32, _U8 = np.dtype(np.float32), np.dtype(np.uint8)

# (id(w), id(w_scale), id(x_scale), id(x_zero_point), id(b), x.shape, attributes..., z) -> _QConvPlan or False
_QCONV_PLANS: dict = {}


def _result_buffer(out, shape, dtype, x, z):
    """``out`` (the memory plan's buffer) when it fits the result exactly and overlaps no input, else a new array."""
    return nn._out_buffer(nn._free_out(out, x, z), shape, dtype)


class _QDwPlan:
    """The constant arguments of a native int8 depthwise conv (``native.qdwconv2d_prepare``)
    for one (weights, input shape, attributes)."""

    __slots__ = ("w_ref", "keep", "out_shape", "args")


# (id(w), id(w_scale), id(x_scale), id(x_zero_point), id(b), x.shape, attributes..., z) -> _QDwPlan or False
_QDW_PLANS: dict = {}


def _qdwconv_fast(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, kernel_shape, pads, strides,
                  activation, activation_params, post, y_q, out):
    """A depthwise QConv (group == C == M, one input channel per group) on the native int8
    depthwise kernel, or None when it does not apply (dynamic quantization, no native module,
    more taps than float32 sums exactly): exact integer sums, the fused epilogue
    ``post[0] * act(scale * acc + b + z) + post[1]``, float or uint8 (``y_q``) output."""
    if not _native.available or x_scale is None or x_zero_point is None:
        return None
    if y_q is not None and not isinstance(y_q[0], float):
        return None  # per-channel requantization: the numpy path
    key = (id(w), id(w_scale), id(x_scale), id(x_zero_point), id(b), x.shape, auto_pad, dilations, kernel_shape,
           pads, strides, activation, activation_params, post, None if z is None else (z.shape, z.dtype))
    constant = is_constant(w, w_scale, x_scale, x_zero_point, b)  # (else: derived anew, never cached)
    plan = _QDW_PLANS.get(key) if constant else None
    if plan is None or (plan is not False and plan.w_ref() is not w):
        plan = _qdw_plan(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, kernel_shape, pads,
                         strides, activation, activation_params, post)
        if plan is not False:
            import weakref

            plan.w_ref = weakref.ref(w, lambda _r, key=key: _QDW_PLANS.pop(key, None))
        if constant and (plan is not False or len(_QDW_PLANS) < 4096):
            _QDW_PLANS[key] = plan
    if plan is False:
        return None
    y = _result_buffer(out, plan.out_shape, _F32 if y_q is None else _U8, x, z)
    residual = None if z is None else np.ascontiguousarray(z)
    _native.qdwconv2d_call(plan.args, np.ascontiguousarray(x), y, residual, y_q)
    return _native.final(y)  # (the node is that one call: a program replays it)


def _qdw_plan(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, kernel_shape, pads, strides,
              activation, activation_params, post):
    n, c = x.shape[:2]
    k = w.shape[2:]
    if k[0] * k[1] > _native.QDW_MAX_TAPS or (z is not None and z.dtype != np.float32):
        return False
    geometry = nn._fused_conv_geometry(x.shape, w.shape, None if b is None else np.shape(b),
                                       None if z is None else z.shape, activation, activation_params, auto_pad,
                                       dilations, c, kernel_shape, pads, strides)
    if geometry is False:
        return False
    act, a0, a1, k, st, dl, out, pb = geometry
    sc, zp, lo, hi = _quant_params(x, x_scale, x_zero_point, per_channel_ok=True)
    if (lo, hi) != (0, 255):
        return False  # int8 activations: the numpy path
    xs = np.ascontiguousarray(np.broadcast_to(np.asarray(sc, np.float32).reshape(-1), (c,)))
    xz = np.ascontiguousarray(np.broadcast_to(np.asarray(zp, np.float32).reshape(-1), (c,)))
    ws = np.asarray(w_scale, dtype=np.float32).reshape(-1)
    scale = np.ascontiguousarray(xs * (ws if ws.size == c else np.full(c, ws.reshape(()), np.float32)))
    bias = None if b is None else np.ascontiguousarray(b, dtype=np.float32)
    wf = np.ascontiguousarray(w.reshape(c, k[0], k[1]), dtype=np.float32)  # the int8 values, exact as floats
    plan = _QDwPlan()
    plan.out_shape = (n, c) + tuple(out)
    plan.keep = (x_scale, x_zero_point, w_scale, b)
    plan.args = _native.qdwconv2d_prepare(x.shape, k, st, dl, pb, out, xs, xz, wf, scale, bias, act, a0, a1,
                                          post)
    return plan


class _PreparedQConv:
    """A QConv node's native call for one input shape (kept in the node's memo under it): the
    constant inputs it was validated for (the arrays themselves: another object is validated
    again), the input dtype and residual shape, the layer's :class:`_QConvPlan` and the node's
    per-call arguments (requantization, post affine map).  Running it costs the native call only."""

    __slots__ = ("w", "w_scale", "x_scale", "x_zero_point", "b", "x_dtype", "z_shape", "plan", "y_dtype", "y_q",
                 "post")

    def fits(self, x, x_scale, x_zero_point, w, w_scale, b, z) -> bool:
        """Whether this is the call for these inputs (``x`` has the input shape it was made for)."""
        return (self.w is w and self.w_scale is w_scale and self.x_scale is x_scale
                and self.x_zero_point is x_zero_point and self.b is b and x.dtype == self.x_dtype
                and _native.available  # (tests turn it off)
                and (self.z_shape is None if z is None else z.shape == self.z_shape and z.dtype == _F32))

    def run(self, x, z, out):
        plan = self.plan
        # (dynamic: x_scale 0 has the native call quantize x by its own range, with the prepared per-row
        # scales, which are the weights' then (plan.sc 1): one call, replayable by a program, D146)
        sc, zp_u8 = (0.0, 0) if plan.dynamic else (plan.sc, plan.zp_u8)
        y = _result_buffer(out, plan.out_shape, self.y_dtype, x, z)
        residual = None if z is None else np.ascontiguousarray(z)
        if plan.pool is None:
            _native.qconv2d_call(plan.args, np.ascontiguousarray(x), sc, zp_u8, y, residual, self.y_q, self.post)
        else:
            _native.qconv2d_pool_call(plan.args, np.ascontiguousarray(x), sc, zp_u8, *plan.pool, y, residual)
        return y


def _qconv_fast(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, group, kernel_shape, pads, strides,
                activation, activation_params, y_q=None, pool=None, out=None, post=(1.0, 0.0), memo=None):
    """QConv on the native int8 kernels (one C call per layer), or None when it does not apply.
    ``x`` float32 or uint8 (already quantized); ``y_q = (scale, zero point)``: uint8 output
    (a float and an int, or tuples of one per output channel);
    ``pool = (kernel, strides)``: the float result max-pooled in the conv's output stage;
    ``out``: the result buffer (memory plan), used when it has exactly the result's shape and dtype;
    ``post = (a, b)``: the result is ``a * y + b`` (never with ``pool``: the caller refuses that);
    ``memo``: the node's NodeContext.memo, where the prepared call (:class:`_PreparedQConv`) is kept
    per input shape, or None."""
    xdt = x.dtype
    # (dtype objects of equal types are not always the same object: `is` first, then ==)
    u8 = False
    if not (xdt is _F32 or xdt == _F32):
        u8 = xdt is _U8 or xdt == _U8
        if not u8:
            return None
    if not _native.available or x.ndim != 4 or w.ndim != 4:
        return None
    if w.shape[1] == 1 and group == x.shape[1] == w.shape[0] > 1 and pool is None:
        return _qdwconv_fast(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, kernel_shape, pads,
                             strides, activation, activation_params, post, y_q, out)
    plan = _qconv_plan_cached(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, group, kernel_shape,
                              pads, strides, activation, activation_params, pool)
    if plan is False:
        return None
    if u8 and (plan.dynamic or plan.lo != 0):
        return None  # a uint8 input needs its static uint8 zero point
    if plan.pool is not None and y_q is not None:
        return None  # pooled uint8 output: the numpy path (the quantizer never chains a pooled QConv)
    prepared = _PreparedQConv()
    prepared.w, prepared.w_scale, prepared.x_scale, prepared.x_zero_point, prepared.b = (
        w, w_scale, x_scale, x_zero_point, b)
    prepared.x_dtype = xdt
    prepared.z_shape = None if z is None else z.shape
    prepared.plan = plan
    prepared.y_dtype = _F32 if y_q is None else _U8
    prepared.y_q = None if y_q is None else getattr(y_q, "arrays", y_q)
    prepared.post = post
    if is_constant(w, w_scale, x_scale, x_zero_point, b):  # (computed inputs: prepared anew per call)
        remember(memo, x.shape, prepared)
    return prepared.run(x, z, out)


def _qconv_plan_cached(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, group, kernel_shape, pads,
                       strides, activation, activation_params, pool):
    """The native plan of a QConv (or False: no native path), cached process-wide by its inputs' identities,
    the input shape and the attributes (dropped with the weights)."""
    key = (id(w), id(w_scale), id(x_scale), id(x_zero_point), id(b), x.shape, auto_pad, dilations, group,
           kernel_shape, pads, strides, activation, activation_params, None if z is None else (z.shape, z.dtype),
           pool)  # post is a per-call argument of the native call, not part of the plan
    if not is_constant(w, w_scale, x_scale, x_zero_point, b):  # computed inputs: derived anew, never cached
        return _qconv_plan(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, group, kernel_shape,
                           pads, strides, activation, activation_params, pool)
    plan = _QCONV_PLANS.get(key)
    if plan is None or (plan is not False and plan.w_ref() is not w):
        plan = _qconv_plan(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, group, kernel_shape,
                           pads, strides, activation, activation_params, pool)
        if plan is False:
            if len(_QCONV_PLANS) < 4096:
                _QCONV_PLANS[key] = False
            return False
        import weakref

        try:
            plan.w_ref = weakref.ref(w, lambda _r, key=key: _QCONV_PLANS.pop(key, None))
        except TypeError:  # pragma: no cover - numpy arrays are weak-referenceable
            return False
        _QCONV_PLANS[key] = plan
    return plan


class _Requant(tuple):
    """QConv's output requantization ``(scale, zero point)``: a float and an int, or tuples of one
    per output channel; ``.arrays`` holds them as the float32 / int32 arrays (one value per
    channel) that the native GEMM epilogue takes."""

    arrays: tuple


# (id(output_scale), id(output_zero_point), channels) -> (the two attribute values, kept alive, _Requant)
_REQUANT: dict = {}


def _requant_attrs(output_scale, output_zero_point, m: int) -> _Requant:
    """The validated requantization of QConv's ``output_scale`` / ``output_zero_point`` attributes,
    made once per attribute objects (a session binds the same ones on every run)."""
    key = (id(output_scale), id(output_zero_point), m)
    hit = _REQUANT.get(key)
    if hit is not None and hit[0] is output_scale and hit[1] is output_zero_point:
        return hit[2]
    per_channel = isinstance(output_scale, (tuple, list))
    scales = np.asarray(output_scale, np.float64).reshape(-1)
    zeros = np.broadcast_to(np.asarray(output_zero_point).reshape(-1), scales.shape)
    if not ((scales > 0).all() and ((zeros >= 0) & (zeros <= 255)).all()):
        raise ValueError(f"QConv: output_scale must be > 0 and output_zero_point in [0, 255], got "
                         f"{(output_scale, output_zero_point)}")
    if per_channel and scales.size != m:
        raise ValueError(f"QConv: {scales.size} output scales for {m} output channels")
    if per_channel:
        req = _Requant((tuple(float(v) for v in scales), tuple(int(v) for v in zeros)))
    else:
        req = _Requant((float(scales[0]), int(zeros[0])))
    req.arrays = (np.ascontiguousarray(np.broadcast_to(scales.astype(np.float32), (m,))),
                  np.ascontiguousarray(np.broadcast_to(zeros.astype(np.int32), (m,))))
    if len(_REQUANT) < 4096:
        _REQUANT[key] = (output_scale, output_zero_point, req)
    return req


def _qconv_plan(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, group, kernel_shape, pads, strides,
                activation, activation_params, pool):
    if w.ndim != 4:
        return False
    if x_scale is not None and np.asarray(x_scale).size != 1:
        return False  # per-channel activation scale (depthwise): float path
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    if cg == 1 and group == c > 1:
        return False  # depthwise: its own kernel (_qdwconv_fast) or the float path
    if z is not None and z.dtype != np.float32:
        return False
    geometry = nn._fused_conv_geometry(x.shape, w.shape, None if b is None else np.shape(b),
                                       None if z is None else z.shape, activation, activation_params, auto_pad,
                                       dilations, group, kernel_shape, pads, strides)
    if geometry is False:
        return False  # malformed or not native: the float path (or its error message)
    act, a0, a1, k, st, dl, out, pb = geometry
    plan = _QConvPlan()
    plan.dynamic = x_scale is None
    plan.lo = 0
    if plan.dynamic:
        sc, zp_u8 = 1.0, 0
    else:
        sc, zp, lo, hi = _quant_params(x, x_scale, x_zero_point)
        if (lo, hi) not in ((0, 255), (-128, 127)):
            return False
        zp_u8 = zp + 128 if lo == -128 else zp  # int8 activations: shift by 128 (same integers minus zero point)
        plan.lo = lo
    packed = _native.qpack(w.reshape(m, -1), owner=w, tag="conv")
    ws = np.asarray(w_scale, dtype=np.float32).reshape(-1)
    ws = ws if ws.size == m else np.full(m, ws.reshape(()), np.float32)
    plan.sc, plan.zp_u8 = sc, zp_u8
    scale = (np.float32(sc) * ws).astype(np.float32)  # (dynamic: sc 1, the weights' scales; D146)
    bias = None if b is None else np.ascontiguousarray(b, dtype=np.float32)
    plan.out_shape = (n, m) + tuple(out)
    plan.pool = pool
    if pool is not None:
        pooled = _pooled_size(out, *pool)
        if pooled is None:
            return False  # the numpy path (which raises MaxPool's error for a window that does not fit)
        plan.out_shape = (n, m) + pooled
    # x_scale, x_zero_point, w_scale and b stay alive with the plan, so their ids in the key stay theirs
    plan.keep = (x_scale, x_zero_point, w_scale, b)
    plan.args = _native.qconv2d_prepare(x.shape, packed, m, group, k, st, dl, pb, out, scale, bias, act, a0, a1,
                                         w=w)
    return plan


def _pooled_size(size, kernel, strides) -> tuple | None:
    """Output size of a MaxPool without padding (floor rounding) over ``size``, or None when
    the window does not fit."""
    if any(n < k for n, k in zip(size, kernel)):
        return None
    return tuple((n - k) // s + 1 for n, k, s in zip(size, kernel, strides))


def _pool_attrs(kernel_shape, strides) -> tuple | None:
    """(kernel, strides) of QConv's fused max pooling as int tuples, None when absent."""
    if not kernel_shape:
        if strides:
            raise ValueError("QConv: pool_strides needs pool_kernel_shape")
        return None
    kernel = tuple(int(v) for v in kernel_shape)
    strides = tuple(int(v) for v in strides) if strides else (1,) * len(kernel)
    if len(kernel) != 2 or len(strides) != 2 or min(kernel + strides) < 1:
        raise ValueError(f"QConv: pool_kernel_shape {list(kernel)} and pool_strides {list(strides)} must be "
                         f"two positive integers each")
    return kernel, strides


def _add_upsampled(x, x_up, x_mul, f, x_scale, x_zero_point):
    """QConv's input with X_up: ``x * x_mul + Resize(x_up)`` (x_mul optional; the Resize nearest,
    asymmetric, floor, scale f on both spatial axes of a 4-D x_up: each value repeated f x f times;
    Mul and Add broadcast as ONNX's).  When x has exactly the upsampled shape, x_mul is one value per
    (image, channel) and this node quantizes statically per tensor to uint8, the result is quantized
    by one native pass that never writes it out (uint8); else float32."""
    if x.dtype != np.float32 or x_up.dtype != np.float32 or (x_mul is not None and x_mul.dtype != np.float32):
        raise ValueError(f"QConv: X, X_up and X_mul must be float32, got {x.dtype}, {x_up.dtype} and "
                         f"{None if x_mul is None else x_mul.dtype}")
    f = int(f)
    if f < 1 or x_up.ndim != 4:
        raise ValueError(f"QConv: X_up needs a 4-D input and x_up_factor >= 1, got {x_up.shape} and {f}")
    up_shape = x_up.shape[:2] + (x_up.shape[2] * f, x_up.shape[3] * f)
    per_plane = x_mul is None or (x_mul.ndim == 4 and x_mul.shape[2:] == (1, 1) and x_mul.shape[1] == x.shape[1]
                                  and x_mul.shape[0] in (1, x.shape[0]))
    if (x.shape == up_shape and per_plane and _native.available and x_scale is not None
            and x_zero_point is not None and np.size(x_scale) == 1 and np.asarray(x_zero_point).dtype == np.uint8):
        q = np.empty(x.shape, np.uint8)
        xm = None if x_mul is None else np.ascontiguousarray(np.broadcast_to(x_mul, x.shape[:2] + (1, 1)))
        _native.quantize_add_up_u8(np.ascontiguousarray(x), np.ascontiguousarray(x_up), q,
                                   float(np.asarray(x_scale).reshape(())), int(np.asarray(x_zero_point).reshape(())),
                                   xm)
        return q
    if x_mul is not None:
        x = x * x_mul
    return x + np.repeat(np.repeat(x_up, f, axis=2), f, axis=3)


def _multiplied(x, x_mul, x_scale, x_zero_point):
    """QConv's input with X_mul alone: ``x * x_mul`` (Mul broadcasting as ONNX's), quantized by one
    native pass (uint8) when x_mul is one value per (image, channel) of a 4-D x and this node
    quantizes statically per tensor to uint8; else float32."""
    if x.dtype != np.float32 or x_mul.dtype != np.float32:
        raise ValueError(f"QConv: X and X_mul must be float32, got {x.dtype} and {x_mul.dtype}")
    if (x.ndim == 4 and x_mul.ndim == 4 and x_mul.shape[2:] == (1, 1) and x_mul.shape[1] == x.shape[1]
            and x_mul.shape[0] in (1, x.shape[0]) and _native.available and x_scale is not None
            and x_zero_point is not None and np.size(x_scale) == 1 and np.asarray(x_zero_point).dtype == np.uint8):
        q = np.empty(x.shape, np.uint8)
        _native.quantize_add_up_u8(None, np.ascontiguousarray(x), q, float(np.asarray(x_scale).reshape(())),
                                   int(np.asarray(x_zero_point).reshape(())),
                                   um=np.ascontiguousarray(np.broadcast_to(x_mul, x.shape[:2] + (1, 1))))
        return q
    return x * x_mul


@kernel("QConv", since=1, domain=DOMAIN, context=True, out=True)
def qconv(
    x, x_scale=None, x_zero_point=None, w=None, w_scale=None, b=None, z=None, x_up=None, x_mul=None, /, *,
    auto_pad="NOTSET",
    dilations=(),
    group=1, kernel_shape=(), pads=(), strides=(), activation="", activation_params=(), output_scale=None,
    output_zero_point=0, pool_kernel_shape=(), pool_strides=(), post_scale=1.0, post_shift=0.0, x_up_factor=0, out=None,
    ctx=None,
):
    """activation(Conv(quant(x), int8 w * w_scale[m]) + b + z); float in, float out.

    With ``post_scale`` / ``post_shift`` the result is ``post_scale * activation(...) + post_shift``
    (a scalar affine map after the activation: the quantizer folds a following ``Mul`` / ``Add``
    by constant scalars into it), before any pooling or requantization.

    Chained form (docs/fused_ops.md): ``x`` may be uint8, i.e. already ``quant(x)`` with this
    node's static ``x_scale`` / uint8 ``x_zero_point``; with the ``output_scale`` attribute the
    output is ``quantize_u8(y, output_scale, output_zero_point)`` (uint8) of the float result y;
    ``output_scale`` / ``output_zero_point`` may be lists of one value per output channel (the
    input quantization of a depthwise QConv with per-channel scales).
    With ``pool_kernel_shape`` (and ``pool_strides``, default 1) the result is
    ``MaxPool(y, kernel_shape, strides)`` without padding, before any requantization.
    With ``x_up`` (float32, 4-D) and ``x_up_factor`` f the conv's input is ``x * x_mul + Resize(x_up)``
    (``x_mul`` optional, e.g. a squeeze-and-excitation scale per channel; the Resize nearest,
    asymmetric, floor, scales (1, 1, f, f)); with ``x_mul`` alone it is ``x * x_mul``: the quantizer
    folds an FPN's upsample-and-add and such Muls into the conv that alone reads them, and the
    result is quantized without being written.
    """
    if x.ndim == 3 and w is not None and w.ndim == 3 and x_up is None and x_mul is None:
        return _qconv_1d(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, group, kernel_shape, pads,
                         strides, activation, activation_params, output_scale, output_zero_point, post_scale,
                         post_shift, out, ctx)
    if x_up is not None:
        x = _add_upsampled(x, x_up, x_mul, x_up_factor, x_scale, x_zero_point)
    elif x_mul is not None:
        x = _multiplied(x, x_mul, x_scale, x_zero_point)
    # X_up / X_mul made a uint8 x only by their native quantizing pass (a recorded call), else by numpy
    input_pass_native = (x_up is None and x_mul is None) or x.dtype == np.uint8
    memo = ctx.memo if ctx is not None else {}
    prepared = memo.get(x.shape)  # the native call this node prepared for this input shape, if any
    if prepared is not None and prepared.fits(x, x_scale, x_zero_point, w, w_scale, b, z):
        y = prepared.run(x, z, out)
        # nothing but native calls before the conv's (none, or the input pass of X_up / X_mul): replayable
        # by a program (a dynamic input's scale and zero point are computed by the native call itself)
        return _native.final(y) if input_pass_native else y
    if w is None or w_scale is None:
        raise ValueError("QConv: inputs W and W_scale are required")
    if w.dtype != np.int8:
        raise ValueError(f"QConv: W must be int8, got {w.dtype}")
    # the attribute-derived arguments, once per node (per weight shape: W is normally a constant)
    derived = memo.get(w.shape[0])
    if derived is None:
        y_q = None if output_scale is None else _requant_attrs(output_scale, output_zero_point, w.shape[0])
        pool = _pool_attrs(pool_kernel_shape, pool_strides)
        post = (float(post_scale), float(post_shift))
        if pool is not None and post != (1.0, 0.0):
            raise ValueError("QConv: pool_kernel_shape with post_scale / post_shift is not supported")
        derived = memo[w.shape[0]] = (y_q, pool, post)
    y_q, pool, post = derived
    y = _qconv_fast(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, group, kernel_shape, pads,
                    strides, activation, activation_params, y_q, pool, out, post, memo)
    if y is not None:
        return y
    depthwise = x.ndim >= 2 and w.shape[1] == 1 and group == x.shape[1] == w.shape[0]
    if x.dtype == np.uint8:
        if x_scale is None:
            raise ValueError("QConv: a uint8 input X needs X_scale (and its uint8 X_zero_point)")
        s, zp, lo, _ = _quant_params(x, x_scale, x_zero_point, per_channel_ok=depthwise)
        if lo != 0:
            raise ValueError("QConv: a uint8 input X needs a uint8 X_zero_point")
        xq = (x.astype(np.float32) - np.float32(zp) if np.ndim(zp) == 0 else x.astype(np.float32) - zp)
        xq *= np.asarray(s, dtype=np.float32)
    else:
        s, zp, lo, hi = _quant_params(x, x_scale, x_zero_point, per_channel_ok=depthwise)
        xq = fake_quantize(x, s, zp, lo, hi)
    wf = _dequant_weight(w, w_scale, 0)
    y = _fn(DOMAIN, "FusedConv", 1)(
        xq, wf, b, z, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
        strides=strides, activation=activation, activation_params=activation_params,
    )
    if post != (1.0, 0.0):
        y = y * np.float32(post[0]) + np.float32(post[1])
    if pool is not None:
        y = _fn("", "MaxPool", 1)(y, kernel_shape=pool[0], strides=pool[1])
    return y if y_q is None else requantize_u8(y, *y_q)


def _qconv_1d(x, x_scale, x_zero_point, w, w_scale, b, z, auto_pad, dilations, group, kernel_shape, pads, strides,
              activation, activation_params, output_scale, output_zero_point, post_scale, post_shift, out, ctx):
    """A 1-D QConv (x (N, C, L), W (M, C/group, K)) as the 2-D QConv of (N, C, 1, L) by a 1 x K kernel, so
    that it takes the native int8 kernels (audio front ends: Silero VAD's convs, D95).  The weight's 4-D
    view is kept in the node's memo (the same object on every call: the prepared call is found by its
    identity); the result is the 3-D view of the 2-D call's, declared final when that one was."""
    memo = ctx.memo if ctx is not None else {}
    kept = memo.get("w4")
    if kept is not None and kept[0] is w:
        w4 = kept[1]
    else:
        w4 = w.reshape(w.shape[0], w.shape[1], 1, w.shape[2])
        if is_constant(w):
            memo["w4"] = (w, w4)

    def two_d(values, fill):
        return tuple(values) and (fill,) + tuple(values)

    pads4 = tuple(pads) and (0, int(pads[0]), 0, int(pads[1]))
    n, m = x.shape[0], w.shape[0]
    out4 = None if out is None else out.reshape(out.shape[0], out.shape[1], 1, out.shape[2])
    y4 = qconv(x.reshape(x.shape[0], x.shape[1], 1, x.shape[2]), x_scale, x_zero_point, w4, w_scale, b,
               None if z is None else z.reshape(z.shape[0], z.shape[1], 1, z.shape[2]),
               auto_pad=auto_pad, dilations=two_d(dilations, 1), group=group, kernel_shape=two_d(kernel_shape, 1),
               pads=pads4, strides=two_d(strides, 1), activation=activation, activation_params=activation_params,
               output_scale=output_scale, output_zero_point=output_zero_point, post_scale=post_scale,
               post_shift=post_shift, out=out4, ctx=ctx)
    y = y4.reshape(n, m, y4.shape[3])
    return _native.final(y) if _native.declared_final(y4) else y


def requantize_u8(y: np.ndarray, scale, zero_point) -> np.ndarray:
    """``clamp(rint(y / scale) + zero_point, 0, 255)`` as uint8 (NaN -> 0), as ``native.quantize_u8``;
    ``scale`` / ``zero_point`` one value, or sequences of one per channel (axis 1)."""
    y = np.asarray(y, dtype=np.float32)
    shape = (1, -1) + (1,) * (y.ndim - 2) if np.ndim(scale) else ()
    s = np.asarray(scale, np.float32).reshape(shape)
    zp = np.asarray(zero_point, np.float32).reshape(shape)
    t = np.divide(y, s)
    np.clip(t, -zp, np.float32(255) - zp, out=t)
    t = np.where(np.isnan(t), -zp, t)
    np.rint(t, out=t)
    t += zp
    return t.astype(np.uint8)


class _QConvTransposePlan:
    """What QConvTranspose derives from its constant inputs and attributes, made once per node and
    kept while they are the same objects: the validated geometry, the per-GEMM-row scales, bias and
    requantization, and the packed (M*kh*kw, C) weights."""

    def __init__(self, x_scale, x_zero_point, w, w_scale, b, attrs, y_q):
        self.consts = (x_scale, x_zero_point, w, w_scale, b)
        self.attrs = attrs
        (kernel_shape, strides, pads, dilations, group, output_padding, output_shape, auto_pad, activation,
         activation_params) = attrs
        if w is None or w_scale is None:
            raise ValueError("QConvTranspose: inputs W and W_scale are required")
        if w.dtype != np.int8 or w.ndim != 4:
            raise ValueError(f"QConvTranspose: W must be 4-D int8 (C, M, kH, kW), got {w.dtype} {w.shape}")
        if x_scale is None or np.asarray(x_scale).size != 1 or x_zero_point is None \
                or np.asarray(x_zero_point).dtype != np.uint8 or np.asarray(x_zero_point).size != 1:
            raise ValueError("QConvTranspose: a scalar X_scale and a uint8 scalar X_zero_point are required "
                             "(static quantization)")
        c, m = w.shape[:2]
        k = tuple(int(v) for v in w.shape[2:])
        if (int(group) != 1 or (kernel_shape and tuple(kernel_shape) != k) or tuple(strides or (1, 1)) != k
                or any(int(v) for v in (pads or ())) or any(int(v) != 1 for v in (dilations or ()))
                or any(int(v) for v in (output_padding or ())) or output_shape
                or auto_pad not in ("NOTSET", "VALID")):
            raise ValueError(
                f"QConvTranspose: only stride == kernel (every input pixel its own output tile) is supported: "
                f"kernel {list(k)}, strides {list(strides)}, group 1, no pads, dilations 1, output_padding 0, no "
                f"output_shape (got group={group}, pads={list(pads)}, dilations={list(dilations)}, "
                f"output_padding={list(output_padding)}, output_shape={list(output_shape)}, auto_pad={auto_pad!r})")
        ws = np.asarray(w_scale, dtype=np.float32).reshape(-1)
        if ws.size not in (1, m):
            raise ValueError(f"QConvTranspose: W_scale has {ws.size} values for {m} output channels")
        if b is not None and np.shape(b) != (m,):
            raise ValueError(f"QConvTranspose: B shape {np.shape(b)} must be ({m},)")
        self.c, self.m, self.k = c, m, k
        kk = k[0] * k[1]
        self.x_scale = np.float32(np.asarray(x_scale).reshape(()))
        self.x_zero = int(np.asarray(x_zero_point).reshape(()))
        # GEMM row (mi*kh + t)*kw + u computes output channel mi's tap (t, u): W[:, mi, t, u]
        self.w_rows = np.ascontiguousarray(w.reshape(c, m * kk).T)
        self.scale_rows = np.repeat((self.x_scale * np.broadcast_to(ws, (m,))).astype(np.float32), kk)
        self.bias_rows = None if b is None else np.repeat(np.asarray(b, dtype=np.float32), kk)
        self.act = nn.native_act(activation, activation_params)
        self.activation = (activation, activation_params)
        self.y_q = y_q
        self.y_q_rows = None if y_q is None else (np.repeat(y_q.arrays[0], kk), np.repeat(y_q.arrays[1], kk))
        self.native_available = _native.available  # (tests turn the native module off: a new plan then)
        self.native = self.act is not None and _native.available
        self.packed = _native.qpack(self.w_rows, owner=w, tag="convt") if self.native else None

    def fits(self, x_scale, x_zero_point, w, w_scale, b, attrs) -> bool:
        c = self.consts
        return (c[0] is x_scale and c[1] is x_zero_point and c[2] is w and c[3] is w_scale and c[4] is b
                and self.attrs == attrs and self.native_available == _native.available)

    def run(self, x, out):
        if x.ndim != 4 or x.shape[1] != self.c:
            raise ValueError(f"QConvTranspose: input shape {x.shape} does not match W {self.consts[2].shape} "
                             f"(need (N, {self.c}, H, W))")
        if x.dtype == np.uint8:
            xq = np.ascontiguousarray(x)
        elif x.dtype == np.float32 and self.native:
            xq = np.empty(x.shape, np.uint8)
            _native.quantize_u8(np.ascontiguousarray(x), xq, float(self.x_scale), self.x_zero)
        elif x.dtype == np.float32:
            xq = requantize_u8(x, float(self.x_scale), self.x_zero)
        else:
            raise ValueError(f"QConvTranspose: X must be float32 or uint8, got {x.dtype}")
        n, _, h, wd = x.shape
        (kh, kw), m = self.k, self.m
        shape = (n, m, h * kh, wd * kw)
        if self.native:
            y = nn._out_buffer(nn._free_out(out, x), shape, np.float32 if self.y_q is None else np.uint8)
            _native.qconvtranspose_tiles(xq, self.x_zero, self.packed, m, self.k, self.scale_rows, self.bias_rows, y,
                                         self.y_q_rows, *self.act)
            # (the input's quantization, when x is float, and the tiles: two recordable calls, D150; the
            # recorder refuses a read of a copy made on the way, such as a non-contiguous x made contiguous)
            return _native.final(y)
        # numpy: the exact integer sums, then the native epilogue's arithmetic (scale, bias, activation)
        acc = np.matmul(self.w_rows.astype(np.int32), xq.reshape(n, self.c, h * wd).astype(np.int32) - self.x_zero)
        y = acc.astype(np.float32) * self.scale_rows[:, None]
        if self.bias_rows is not None:
            y += self.bias_rows[:, None]
        y = y.reshape(n, m, kh, kw, h, wd).transpose(0, 1, 4, 2, 5, 3).reshape(shape)
        y = fused.apply_activation(np.ascontiguousarray(y), *self.activation)
        return y if self.y_q is None else requantize_u8(y, *self.y_q)


@kernel("QConvTranspose", since=1, domain=DOMAIN, context=True, out=True)
def qconv_transpose(
    x, x_scale=None, x_zero_point=None, w=None, w_scale=None, b=None, /, *, auto_pad="NOTSET", dilations=(), group=1,
    kernel_shape=(), output_padding=(), output_shape=(), pads=(), strides=(), activation="", activation_params=(),
    output_scale=None, output_zero_point=0, out=None, ctx=None,
):
    """activation(ConvTranspose(dq(quant(x)), int8 w * w_scale[m]) + b) for stride == kernel (no
    overlapping taps, the 2x2 / stride-2 upsampling of detection heads), exact integer sums.

    ``x`` float32 (quantized with the static ``x_scale`` / uint8 ``x_zero_point``) or uint8 (already
    quantized with them: the chained form, as QConv's); ``w`` int8 in ConvTranspose's (C, M, kH, kW)
    layout, ``w_scale`` per output channel.  With ``output_scale`` the result is uint8, requantized as
    QConv's.  Natively (``mrt_qconvtranspose_tiles``) the int8 GEMM of the (M*kH*kW, C) weight rows
    runs per band of input rows and the band's taps are placed while in cache."""
    attrs = (tuple(kernel_shape), tuple(strides), tuple(pads), tuple(dilations), int(group), tuple(output_padding),
             tuple(output_shape), auto_pad, activation, tuple(activation_params))
    memo = ctx.memo if ctx is not None else {}
    plan = memo.get("plan")
    if plan is None or not plan.fits(x_scale, x_zero_point, w, w_scale, b, attrs):
        m = w.shape[1] if w is not None and w.ndim == 4 else 0
        y_q = None if output_scale is None else _requant_attrs(output_scale, output_zero_point, m)
        plan = memo["plan"] = _QConvTransposePlan(x_scale, x_zero_point, w, w_scale, b, attrs, y_q)
    return plan.run(x, out)


@kernel("QuantizeUpsampleConcat", since=1, domain=DOMAIN, out=True)
def quantize_upsample_concat(*inputs, factors=(), scale=1.0, zero_point=0, out=None):
    """uint8 ``requantize_u8(Concat(axis=1) of the parts, scale, zero_point)``: inputs are pairs
    ``X_i, M_i`` and part i is ``X_i * M_i`` (``M_i`` absent: ``X_i``; Mul broadcasting as ONNX's)
    repeated ``factors[i]`` x ``factors[i]`` times over its two spatial axes (a Resize nearest,
    asymmetric, floor with scales (1, 1, f, f); 1: as is).  ``X_i`` float32 (N, C_i, H / f_i,
    W / f_i).  The quantizer makes it from the (squeeze-and-excitation) Muls, Resizes and Concat in
    front of a QConv, in that QConv's static input quantization (the QConv then reads uint8);
    natively each part is quantized straight into its channels of the result, nothing multiplied,
    upsampled or concatenated is written."""
    factors = tuple(int(f) for f in factors)
    if len(inputs) == 2 * len(factors) - 1:
        inputs = inputs + (None,)  # (an absent last M is not passed)
    if not factors or len(inputs) != 2 * len(factors) or min(factors) < 1:
        raise ValueError(f"QuantizeUpsampleConcat: inputs are (X, M) pairs with one factor >= 1 each, got "
                         f"{list(factors)} for {len(inputs)} inputs")
    zp = int(zero_point)
    if not (float(scale) > 0 and 0 <= zp <= 255):
        raise ValueError(f"QuantizeUpsampleConcat: scale must be > 0 and zero_point in [0, 255], got {scale}, {zp}")
    xs, ms = inputs[0::2], inputs[1::2]
    for x in xs + tuple(m for m in ms if m is not None):
        if x is None or x.dtype != np.float32 or x.ndim != 4:
            raise ValueError("QuantizeUpsampleConcat: every X (and M) must be float32 4-D, got "
                             f"{None if x is None else (x.dtype, x.shape)}")
    parts = [x if m is None else np.broadcast_shapes(x.shape, m.shape) for x, m in zip(xs, ms)]
    shapes = [p.shape if isinstance(p, np.ndarray) else p for p in parts]
    n, h, w = shapes[0][0], shapes[0][2] * factors[0], shapes[0][3] * factors[0]
    if any(sh[0] != n or sh[2] * f != h or sh[3] * f != w for sh, f in zip(shapes, factors)):
        raise ValueError("QuantizeUpsampleConcat: the upsampled parts differ in batch or plane size: "
                         + ", ".join(f"{sh} x{f}" for sh, f in zip(shapes, factors)))
    shape = (n, sum(sh[1] for sh in shapes), h, w)
    if not _native.available:
        ups = [x if m is None else x * m for x, m in zip(xs, ms)]
        ups = [np.repeat(np.repeat(u, f, axis=2), f, axis=3) if f > 1 else u for u, f in zip(ups, factors)]
        return requantize_u8(np.concatenate(ups, axis=1), float(scale), zp)
    y = nn._out_buffer(out, shape, np.uint8)
    c0 = 0
    products = False  # (a Mul computed in numpy: the node is more than its native calls, not replayable)
    for x, m, f, sh in zip(xs, ms, factors, shapes):
        c = sh[1]
        if x.shape != sh or (m is not None and (m.shape[2:] != (1, 1) or m.shape[1] != c)):
            x, m = x * m, None  # a broadcasting Mul other than one value per (image, channel): done first
            products = True
        xc = np.ascontiguousarray(x)
        um = None if m is None else np.ascontiguousarray(np.broadcast_to(m, (n, c, 1, 1)))
        for i in range(n):  # (one image's channels of y are contiguous)
            _native.quantize_add_up_u8(None, xc[i:i + 1], y[i:i + 1, c0:c0 + c], float(scale), zp,
                                       um=None if um is None else um[i:i + 1])
        c0 += c
    # every channel of y written by those calls: a program replays them (its recorder refuses any read
    # that is neither a call's result nor a constant, e.g. a contiguous copy made above)
    return y if products else _native.final(y)


# id(w) -> (weakref to w, id(scale), scale kept alive, float32 result): weights materialized once
_DEQUANTIZED: dict = {}


def _dequantize_weights(w, scale, axis, out=None):
    """float32 weights from int8 ``w`` times its scales along ``axis``, or float16 ``w`` (times a scalar
    scale); into ``out`` (float32, w's shape) when given."""
    if w.dtype == np.int8:
        if scale is None:
            raise ValueError("DequantizeWeights: int8 weights need W_scale")
        return _dequant_weight(w, scale, axis % w.ndim if w.ndim else 0, out)
    if w.dtype == np.float16:
        y = w.astype(np.float32) if out is None else _assign(out, w)
        if scale is not None:
            y *= np.asarray(scale, dtype=np.float32).reshape(())
        return y
    raise ValueError(f"DequantizeWeights: W must be int8 or float16, got {w.dtype}")


@kernel("DequantizeWeights", since=1, domain=DOMAIN)
def dequantize_weights(w, w_scale=None, /, *, axis=0):
    """Float32 weights from their stored form: ``int8 W * W_scale`` (per index of ``axis``, or one
    scale) or ``float16 W`` (times an optional scalar scale).

    Weights-only quantization: the layer computes in float32, the artifact holds 1 (int8) or 2
    (float16) bytes per weight.  The result for a read-only (constant, memory-mapped) ``W`` is
    computed once per loaded weight and returned, read-only, on every later run, so the cost is
    paid at the first run, not per run; a writeable ``W`` is dequantized on every call.
    """
    if w is None:
        raise ValueError("DequantizeWeights: input W is required")
    if w.flags.writeable:
        return _dequantize_weights(w, w_scale, axis)
    key = (id(w), axis)
    hit = _DEQUANTIZED.get(key)
    if hit is not None and hit[0]() is w and hit[1] is w_scale:
        return _native.constant_result(hit[2])  # (the same read-only array every run: a program reads it)
    # on a 64-byte boundary, as the artifact's own weights are: kernels that read weights in place (an
    # RNN's recurrent matrix-vector product) took 1.4x with numpy's 16-byte offset of big arrays
    y = _dequantize_weights(w, w_scale, axis, _native._aligned_floats(w.size).reshape(w.shape))
    y.flags.writeable = False
    import weakref

    try:
        ref = weakref.ref(w, lambda _r, key=key: _DEQUANTIZED.pop(key, None))
    except TypeError:  # pragma: no cover - numpy arrays are weak-referenceable
        return y
    _DEQUANTIZED[key] = (ref, w_scale, y)
    # (declared constant on this first run too: a recording in it, a session's dry warm-up, kept an
    # unaligned copy of it as a derived value otherwise, and a GRU read its recurrent weights there on
    # every replay: KWS GRU's int8-dynamic program 1.19x its float one)
    return _native.constant_result(y)


@kernel("QMatMul", since=1, domain=DOMAIN, context=True, out=True)
def qmatmul(a, a_scale=None, a_zero_point=None, b=None, b_scale=None, bias=None, z=None, /, *, transB=0,
            activation="", activation_params=(), flatten_axis=None, out=None, ctx=None):
    """activation(quant(a) @ (int8 b * b_scale[n]) (b transposed when transB) + bias + z).

    With ``flatten_axis``, ``a`` is first ``Flatten(a, axis=flatten_axis)`` (the quantizer folds
    a Flatten feeding only this node: one node less per run).  ``out``: the memory plan's buffer
    for the result (native path, when it fits)."""
    if (bias is None and z is not None and z.ndim == 1 and b is not None and b.ndim == 2
            and z.shape[0] == b.shape[0 if transB else 1]):
        bias, z = z, None  # (one value per column added after the product is a bias: the fused path takes it)
    memo = None if ctx is None else ctx.memo
    prepared = memo.get(a.shape) if memo is not None else None  # this node's native call for this input shape
    if prepared is not None and prepared.fits(a, a_scale, a_zero_point, b, b_scale, bias, z):
        # one native call, replayable by a program (dynamic quantization too: the call derives the
        # input's scale from it, D89)
        return _native.final(prepared.run(a, out))
    if b is None or b_scale is None:
        raise ValueError("QMatMul: inputs B and B_scale are required")
    if b.dtype != np.int8 or b.ndim != 2:
        raise ValueError(f"QMatMul: B must be a 2-D int8 matrix, got {b.dtype} {b.shape}")
    a_shape = a.shape
    if flatten_axis is not None:
        a = tensor.flatten(a, axis=flatten_axis)
    if _native.available and a.dtype == np.float32 and a.ndim >= 1 and a.size:
        y = _qmatmul_fast(a, a_scale, a_zero_point, b, b_scale, bias, z, transB, activation, activation_params,
                          out, memo, a_shape)
        if y is not None:
            return y
    # (a dynamic input in 256 levels, as the native kernel quantizes it: the same products with or without it)
    s, zp, lo, hi = (_dynamic_params(a, 255) if a_scale is None
                     else _quant_params(a, a_scale, a_zero_point))
    aq = fake_quantize(a, s, zp, lo, hi)
    bf = _dequant_weight(b, b_scale, 0 if transB else 1)
    y = np.matmul(aq, bf.T if transB else bf)
    return _qmatmul_epilogue(y, bias, z, activation, activation_params)


# (id(b), id(b_scale), id(a_scale), id(a_zero_point), id(bias), transB, activation...) -> plan tuple or False
_QMATMUL_PLANS: dict = {}


class _PreparedQMatMul:
    """A QMatMul node's native call for one input shape (kept in the node's memo under the shape of
    its input before any flatten) and no residual: the constant inputs it was validated for (the
    arrays themselves), the result's shape and rows, and the layer's plan (``_qmatmul_plan``)."""

    __slots__ = ("b", "b_scale", "a_scale", "a_zero_point", "bias", "rows", "y_shape", "plan", "native")

    def fits(self, a, a_scale, a_zero_point, b, b_scale, bias, z) -> bool:
        """Whether this is the call for these inputs (``a`` has the input shape it was made for)."""
        return (self.b is b and self.b_scale is b_scale and self.a_scale is a_scale
                and self.a_zero_point is a_zero_point and self.bias is bias and z is None and a.dtype == _F32
                and _native.available)  # (tests turn it off)

    def run(self, a, out):
        _, _, k, n, packed, ws, static, scale, bias_c, act = self.plan
        y = _result_buffer(out, self.y_shape, _F32, a, None)
        # (a C-contiguous input flattened is the same memory: reshape it to the GEMM's rows directly)
        a2, y2 = np.ascontiguousarray(a).reshape(self.rows, k), y.reshape(self.rows, n)
        if self.native is None:  # (the native structs made on the first run, then reused)
            if static is None:  # dynamic: x_scale 0 asks the kernel to quantize as DynamicQuantizeLinear,
                # scaling the columns by the weights' scales ws
                self.native = _native.qmatmul_prepare(self.rows, k, 0.0, 0, packed, n, ws, bias_c, *act)
            else:
                self.native = _native.qmatmul_prepare(self.rows, k, static[0], static[1], packed, n, scale, bias_c,
                                                      *act)
        _native.qmatmul_call(self.native, a2, y2)
        return y


def _qmatmul_fast(a, a_scale, a_zero_point, b, b_scale, bias, z, transB, activation, activation_params, out=None,
                  memo=None, a_shape=None):
    """QMatMul in one native call (quantize, int8 GEMM, bias, activation), or None.  ``memo``: the
    node's NodeContext.memo, where the prepared call (:class:`_PreparedQMatMul`) is kept under
    ``a_shape`` (the shape of the node's input before its flatten)."""
    key = (id(b), id(b_scale), id(a_scale), id(a_zero_point), id(bias), transB, activation, activation_params)
    constant = is_constant(b, b_scale, a_scale, a_zero_point, bias)  # (else: derived anew, never cached)
    plan = _QMATMUL_PLANS.get(key) if constant else None
    if plan is None or (plan is not False and plan[0]() is not b):
        plan = _qmatmul_plan(a, a_scale, a_zero_point, b, b_scale, bias, transB, activation, activation_params)
        if plan is False:
            if constant and len(_QMATMUL_PLANS) < 4096:
                _QMATMUL_PLANS[key] = False
            return None
        import weakref

        plan = (weakref.ref(b, lambda _r, key=key: _QMATMUL_PLANS.pop(key, None)),) + plan
        if constant:
            _QMATMUL_PLANS[key] = plan
    if plan is False:
        return None
    _, keep, k, n, packed, ws, static, scale, bias_c, act = plan
    if a.shape[-1] != k or (bias is not None and np.ndim(bias) > a.ndim):  # (the plan is shared by input ranks)
        return None
    if z is None and act is not None:  # (a residual comes before the activation: not fused)
        prepared = _PreparedQMatMul()
        prepared.b, prepared.b_scale, prepared.a_scale, prepared.a_zero_point, prepared.bias = (
            b, b_scale, a_scale, a_zero_point, bias)
        prepared.rows = a.size // k
        prepared.y_shape = a.shape[:-1] + (n,)
        prepared.plan = plan
        prepared.native = None
        if is_constant(b, b_scale, a_scale, a_zero_point, bias):  # (computed inputs: prepared anew per call)
            remember(memo, a.shape if a_shape is None else a_shape, prepared)
            return _native.final(prepared.run(a, out))  # (the later calls run it as this one does)
        return prepared.run(a, out)
    if static is None:
        sc, zp_u8, scale = _dynamic_quant(a, ws)
    else:
        sc, zp_u8 = static
    a2 = np.ascontiguousarray(a).reshape(-1, k)
    y = _result_buffer(out, a.shape[:-1] + (n,), _F32, a, z)
    fused = act if z is None else None  # the residual comes before the activation
    _native.qmatmul(a2, sc, zp_u8, packed, n, scale, bias_c, y.reshape(-1, n), *(fused or (0, 0.0, 0.0)))
    if fused is not None:
        return y
    return _qmatmul_epilogue(y, None, z, activation, activation_params)


def _qmatmul_plan(a, a_scale, a_zero_point, b, b_scale, bias, transB, activation, activation_params):
    k = b.shape[1] if transB else b.shape[0]
    n = b.shape[0] if transB else b.shape[1]
    # a bias of n values on its last axis, 1 on the others (a Gemm's C of (1, n), as magika's last Dense
    # has): the same sums as a (n,) one (one with more axes than the input is refused per call, _qmatmul_fast)
    if bias is not None and (np.shape(bias)[-1:] != (n,) or np.size(bias) != n):
        return False
    bs = np.asarray(b_scale, dtype=np.float32).reshape(-1)
    if bs.size not in (1, n):
        return False
    if a_scale is not None and np.asarray(a_scale).size != 1:
        return False
    ws = np.ascontiguousarray(np.broadcast_to(bs, (n,)), dtype=np.float32)
    static = scale = None
    if a_scale is not None:
        sc, zp, lo, hi = _quant_params(a, a_scale, a_zero_point)
        if (lo, hi) not in ((0, 255), (-128, 127)):
            return False
        static = (sc, zp + 128 if lo == -128 else zp)
        scale = (np.float32(sc) * ws).astype(np.float32)
    act = nn.native_act(activation, activation_params)
    wt = b if transB else b.T  # (N, K) int8
    packed = _native.qpack(wt, owner=b, tag=("T", transB))
    bias_c = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32).reshape(n)
    keep = (b_scale, a_scale, a_zero_point, bias)  # their ids are in the key
    return (keep, k, n, packed, ws, static, scale, bias_c, act)


def _qmatmul_native(a, s, zp_u8, b, b_scale, bias, transB):
    """quant(a) @ dequant(b) (+ bias[n]) with the int8 GEMM, weights on the left: y^T = B^T a^T."""
    from minirt import native

    k = a.shape[-1]
    nn_ = b.shape[0] if transB else b.shape[1]
    if bias is not None and np.asarray(bias).shape != (nn_,):
        return None
    bs = np.asarray(b_scale, dtype=np.float32).reshape(-1)
    if bs.size not in (1, nn_):
        return None
    a2 = np.ascontiguousarray(a, dtype=np.float32).reshape(-1, k)
    aq = np.empty(a2.shape, dtype=np.uint8)
    native.quantize_u8(a2, aq, s, zp_u8)
    aqt = np.ascontiguousarray(aq.T)  # (K, rows): the GEMM's column operand
    wt = b if transB else b.T  # (N, K) int8
    packed = native.qpack(wt, owner=b, tag=("T", transB))
    scale = (np.float32(s) * np.broadcast_to(bs, (nn_,))).astype(np.float32)
    yt = np.empty((nn_, a2.shape[0]), dtype=np.float32)
    native.qgemm(packed, nn_, k, aqt, zp_u8, scale, yt,
                 None if bias is None else np.ascontiguousarray(bias, dtype=np.float32))
    return np.ascontiguousarray(yt.T).reshape(a.shape[:-1] + (nn_,))


def _qmatmul_epilogue(y, bias, z, activation, activation_params):
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
