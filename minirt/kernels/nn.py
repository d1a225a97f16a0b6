"""Neural-network kernels: convolution, pooling, normalisation, softmax family, dropout.

Layout is always ONNX's channels-first ``(N, C, D1, ..., Dn)``; every
windowed op (Conv, ConvTranspose, MaxPool, AveragePool) works for any number
of spatial axes because the window geometry is computed per axis and the
windows are read through strided views rather than hand-written loops.

Conventions shared by every kernel here:

* Results keep the ONNX output dtype.  float32 data is computed in float32
  (Python-float attributes are converted with ``dtype.type(v)`` first);
  float16 data of reductions/transcendentals is widened to float32 for the
  computation and rounded back, as onnxruntime does.
* Optional ONNX inputs are positional-only parameters defaulting to ``None``
  so the registry does not mistake them for attributes.
* Kernels with optional extra outputs register ``context=True`` and return
  exactly ``ctx.n_outputs`` arrays (one when called without a context).
* Training-mode behaviour is supported where ONNX defines it as an input or
  attribute: BatchNormalization ``training_mode=1`` normalises with the batch
  statistics and outputs the running ones; Dropout with ``training_mode``
  true draws its mask from numpy's Mersenne-Twister seeded with the ``seed``
  attribute (unseeded when absent).  The legacy ``is_test`` flag of opsets < 7
  defaulted to 0 and exporters routinely left it unset on inference graphs,
  so it is accepted and ignored rather than rejected.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from minirt import native as _native
from minirt.format.packed_weights import runs_down_a_column
from minirt.kernels import _narrow
from minirt.kernels._limits import check_alloc, current_limit
from minirt.kernels.registry import NodeContext, is_constant, kernel, remember
from minirt.vocabulary import ACTIVATIONS

_AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")

# --------------------------------------------------------------------------- helpers


def _n_outputs(ctx: NodeContext | None) -> int:
    return 1 if ctx is None else ctx.n_outputs


def _axis(op: str, axis: int, rank: int) -> int:
    """``axis`` normalised to ``[0, rank)``; ONNX allows ``[-rank, rank)``."""
    if not -rank <= axis < rank:
        raise ValueError(f"{op}: axis {axis} out of range for rank-{rank} input")
    return axis + rank if axis < 0 else axis


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """float16/bfloat-ish inputs are computed in float32; float32/64 as themselves."""
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def _per_axis(op: str, name: str, values, nd: int, default: int) -> tuple:
    if not values:
        return (default,) * nd
    if len(values) != nd:
        raise ValueError(f"{op}: {name} has {len(values)} values, expected {nd} (one per spatial axis)")
    out = tuple(int(v) for v in values)
    if min(out) < 1:
        raise ValueError(f"{op}: {name} must be >= 1, got {list(out)}")
    return out


def _check_rank(op: str, x: np.ndarray) -> int:
    if x.ndim < 3:
        raise ValueError(f"{op}: input must be (N, C, D1, ...) with at least one spatial axis, got shape {x.shape}")
    return x.ndim - 2


def _geometry(op: str, in_sp: tuple, k: tuple, s: tuple, d: tuple, pads, auto_pad: str, ceil_mode: int = 0,
              planes: tuple = (1, 1), dtype=np.float32):
    """Output spatial shape and begin/end padding of a sliding-window op.

    Returns ``(out, pad_begin, pad_end)``.  ``pad_end`` is the (explicit or
    automatic) padding; with ``ceil_mode`` the last window may still reach past
    it, which callers handle by padding up to what the windows actually read.

    The memory guard: pads can make the padded input and the output far larger than the input (a
    one-byte change of a pad), so both are checked against the session's limit here, before any kernel
    allocates them: ``planes`` (input planes, output planes), e.g. (N*C, N*M) for a Conv, of ``dtype``.
    """
    out, pb, pe = _window_geometry(op, in_sp, k, s, d, pads, auto_pad, ceil_mode)
    padded = tuple(i + b + e for i, b, e in zip(in_sp, pb, pe))
    itemsize = np.dtype(dtype).itemsize
    if max(planes[0] * math.prod(padded), planes[1] * math.prod(out)) * itemsize > current_limit():
        check_alloc((planes[0],) + padded, dtype, f"{op} padded input")
        check_alloc((planes[1],) + tuple(out), dtype, f"{op} output")
    return out, pb, pe


def _window_geometry(op: str, in_sp: tuple, k: tuple, s: tuple, d: tuple, pads, auto_pad: str, ceil_mode: int):
    """:func:`_geometry` without the memory guard."""
    nd = len(in_sp)
    eff = tuple((ki - 1) * di + 1 for ki, di in zip(k, d))
    if auto_pad == "NOTSET" or auto_pad == "VALID":
        if auto_pad == "VALID" or not pads:
            pb = pe = (0,) * nd
        else:
            if len(pads) != 2 * nd:
                raise ValueError(
                    f"{op}: pads has {len(pads)} values, expected {2 * nd} (begin and end per spatial axis)"
                )
            pads = tuple(int(p) for p in pads)
            if min(pads) < 0:
                raise ValueError(f"{op}: negative pads {list(pads)} are not supported")
            pb, pe = pads[:nd], pads[nd:]
        out = []
        for i in range(nd):
            span = in_sp[i] + pb[i] + pe[i] - eff[i]
            if span < 0:
                raise ValueError(
                    f"{op}: window of extent {eff[i]} (kernel {k[i]}, dilation {d[i]}) is larger than "
                    f"padded spatial axis {i} of size {in_sp[i] + pb[i] + pe[i]}"
                )
            if ceil_mode:
                o = -(-span // s[i]) + 1
                # A window that would start inside the end padding is dropped
                # (onnxruntime / PyTorch rule), so every window sees real data.
                if (o - 1) * s[i] >= in_sp[i] + pb[i]:
                    o -= 1
            else:
                o = span // s[i] + 1
            out.append(o)
        return tuple(out), pb, pe
    if auto_pad == "SAME_UPPER" or auto_pad == "SAME_LOWER":
        out = tuple(-(-n // si) for n, si in zip(in_sp, s))
        total = [max(0, (o - 1) * si + e - n) for o, si, e, n in zip(out, s, eff, in_sp)]
        if auto_pad == "SAME_UPPER":  # odd padding: the extra element goes at the end
            pb = tuple(t // 2 for t in total)
        else:
            pb = tuple(t - t // 2 for t in total)
        pe = tuple(t - b for t, b in zip(total, pb))
        return out, pb, pe
    raise ValueError(f"{op}: unsupported auto_pad {auto_pad!r}; expected one of {', '.join(_AUTO_PADS)}")


def _pad_for_windows(x: np.ndarray, out: tuple, k: tuple, s: tuple, d: tuple, pb: tuple, value) -> np.ndarray:
    """``x`` padded so every window ``(out, k, s, d)`` starting at ``-pb`` is in bounds.

    The end padding is exactly what the last window reads (which may be less
    than the declared end padding, or more in ceil mode), so nothing is copied
    for unpadded inputs.
    """
    in_sp = x.shape[2:]
    need = tuple((o - 1) * si + (ki - 1) * di + 1 for o, ki, si, di in zip(out, k, s, d))
    end = tuple(max(0, n - b - i) for n, b, i in zip(need, pb, in_sp))
    if not any(pb) and not any(end):
        return x
    xp = np.full(x.shape[:2] + tuple(b + i + e for b, i, e in zip(pb, in_sp, end)), value, dtype=x.dtype)
    xp[(slice(None), slice(None)) + tuple(slice(b, b + i) for b, i in zip(pb, in_sp))] = x
    return xp


def _tap_slices(k: tuple, s: tuple, d: tuple, out: tuple) -> list:
    """For each kernel tap (row-major over ``k``), the index selecting its input for all outputs."""
    taps = []
    for t in itertools.product(*(range(ki) for ki in k)):
        taps.append(
            (slice(None), slice(None))
            + tuple(slice(ti * di, ti * di + (o - 1) * si + 1, si) for ti, di, si, o in zip(t, d, s, out))
        )
    return taps


def _windows(xp: np.ndarray, out: tuple, k: tuple, s: tuple, d: tuple) -> np.ndarray:
    """Read-only view ``(N, C, *out, *k)`` of the sliding windows of padded ``xp``.

    Invariant (guaranteed by :func:`_pad_for_windows`): for every axis
    ``(out-1)*s + (k-1)*d < xp.shape[axis]``, so the view never leaves ``xp``.
    """
    sp = xp.strides[2:]
    shape = xp.shape[:2] + out + k
    strides = xp.strides[:2] + tuple(a * b for a, b in zip(sp, s)) + tuple(a * b for a, b in zip(sp, d))
    return as_strided(xp, shape, strides, writeable=False)


def _pad_value_min(dtype: np.dtype):
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    raise ValueError(f"unsupported dtype {dtype} for max pooling")


# --------------------------------------------------------------------------- convolution


def _depthwise(xp: np.ndarray, w: np.ndarray, out: tuple, k: tuple, s: tuple, d: tuple) -> np.ndarray:
    """Depthwise convolution of padded ``xp`` (N, C, *Dp) with per-channel taps ``w`` (C, K)."""
    n, c = xp.shape[:2]
    nd = len(out)
    kk = w.shape[1]
    if all(si == 1 for si in s):
        # Stride 1: work on each channel's flattened padded plane.  Output q of
        # the "wide" plane (padded row length, garbage past each row's end)
        # reads xp_flat[q + offset(tap)], so every tap is one long contiguous
        # slice; that is ~2x faster than short per-row strided slices.  The
        # largest index read equals the last window's last element, which
        # _pad_for_windows guarantees is inside xp.
        xp = np.ascontiguousarray(xp)
        dp = xp.shape[2:]
        plane = [math.prod(dp[a + 1 :]) for a in range(nd)]
        length = sum((o - 1) * p for o, p in zip(out, plane)) + 1
        wide = np.empty((n, c, out[0] * plane[0]), dtype=xp.dtype)
        acc = wide[:, :, :length]
        tmp = np.empty_like(acc)
        xf = xp.reshape(n, c, -1)
        wt = np.ascontiguousarray(w.T).reshape(kk, c, 1)
        for i, t in enumerate(itertools.product(*(range(ki) for ki in k))):
            off = sum(ti * di * p for ti, di, p in zip(t, d, plane))
            if i == 0:
                np.multiply(xf[:, :, off : off + length], wt[0], out=acc)
            else:
                np.multiply(xf[:, :, off : off + length], wt[i], out=tmp)
                acc += tmp
        y = wide.reshape((n, c, out[0]) + dp[1:])
        return np.ascontiguousarray(y[(slice(None), slice(None), slice(None)) + tuple(slice(0, o) for o in out[1:])])
    wt = np.ascontiguousarray(w.T).reshape((kk, c) + (1,) * nd)
    y = np.empty((n, c) + out, dtype=xp.dtype)
    tmp = np.empty_like(y)
    for i, sl in enumerate(_tap_slices(k, s, d, out)):
        if i == 0:
            np.multiply(xp[sl], wt[0], out=y)
        else:
            np.multiply(xp[sl], wt[i], out=tmp)
            y += tmp
    return y


@kernel("Conv", since=1, context=True, out=True)
def conv(x, w, b=None, /, *, auto_pad="NOTSET", dilations=(), group=1, kernel_shape=(), pads=(), strides=(),
         out=None, ctx=None):
    """``out``: the result buffer (memory plan), used by the native 2-D path when it fits (see _out_buffer).
    ``ctx``: the node's context, whose memo keeps the native path's prepared call per input shape."""
    memo = _memo(ctx)
    plan = _prepared_conv(memo, x, w, b, None)
    if plan is not None:
        return _native.final(plan.run(x, None, out))  # (a program may replay it: one native call, nothing else)
    nd = _check_rank("Conv", x)
    if w.ndim != x.ndim:
        raise ValueError(f"Conv: weight rank {w.ndim} (shape {w.shape}) does not match input rank {x.ndim}")
    if x.dtype != w.dtype:
        raise ValueError(f"Conv: input dtype {x.dtype} and weight dtype {w.dtype} differ")
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    k = w.shape[2:]
    if group < 1 or c % group or m % group or cg * group != c:
        raise ValueError(
            f"Conv: group={group} incompatible with {c} input channels and weight shape {w.shape} "
            f"(need C_in == group * W.shape[1] and group dividing C_out)"
        )
    if kernel_shape and tuple(kernel_shape) != k:
        raise ValueError(f"Conv: kernel_shape {list(kernel_shape)} does not match weight spatial shape {list(k)}")
    s = _per_axis("Conv", "strides", strides, nd, 1)
    d = _per_axis("Conv", "dilations", dilations, nd, 1)
    out_sp, pb, _ = _geometry("Conv", x.shape[2:], k, s, d, pads, auto_pad,
                              planes=(x.shape[0] * x.shape[1], x.shape[0] * m), dtype=x.dtype)
    if b is not None and b.shape != (m,):
        raise ValueError(f"Conv: bias shape {b.shape} must be ({m},)")
    if x.dtype.itemsize < 4:
        # float16: numpy has no half-precision BLAS; compute in float32, round once.
        bf = None if b is None else b.astype(np.float32)
        y = conv(x.astype(np.float32), w.astype(np.float32), bf, auto_pad=auto_pad, dilations=dilations,
                 group=group, pads=pads, strides=strides)
        return y.astype(x.dtype)
    if nd <= 2 and x.dtype == np.float32 and _native.available:  # (1-D: as a 2-D conv of (N, C, 1, W))
        return _conv2d_native(x, w, b, None, out_sp, k, s, d, pb, group, _ACT_NONE, 0.0, 0.0,
                              dst=_free_out(out, x), memo=memo)
    xp = _pad_for_windows(x, out_sp, k, s, d, pb, 0)
    p = math.prod(out_sp)
    kk = math.prod(k)

    if kk == 1:
        # 1x1 kernel: the "im2col" matrix is the (strided) input itself.
        xs = xp[(slice(None), slice(None)) + tuple(slice(0, (o - 1) * si + 1, si) for o, si in zip(out_sp, s))]
        cols = xs.reshape(n, group, cg, p)
        y = np.matmul(w.reshape(group, m // group, cg), cols)
    elif group == c and cg == 1 and m == c:
        # Depthwise: one multiply-accumulate per kernel tap over all channels
        # at once beats C tiny (1 x K) @ (K x P) matrix products.
        y = _depthwise(xp, w.reshape(c, kk), out_sp, k, s, d)
        if b is not None:
            y += b.reshape((m,) + (1,) * nd)
        return y
    else:
        # im2col: (N, C, *out_sp, *k) window view -> one contiguous copy laid out
        # (N, group, Cg*K, P) so a single batched matmul covers every group.
        win = _windows(xp, out_sp, k, s, d)
        perm = (0, 1) + tuple(range(2 + nd, 2 + 2 * nd)) + tuple(range(2, 2 + nd))
        cols = win.transpose(perm).reshape(n, group, cg * kk, p)
        y = np.matmul(w.reshape(group, m // group, cg * kk), cols)
    y = y.reshape((n, m) + out_sp)
    if b is not None:
        y += b.reshape((m,) + (1,) * nd)
    return y


# --------------------------------------------------------------------------- native conv paths

# Fused-activation names (com.minirt convention, see kernels/fused.py) that the native epilogue
# computes: name -> (native code, number of parameters), from the vocabulary and the compiled module
# (empty without native kernels: the native paths are not taken then).
_NATIVE_ACTIVATIONS = {name: (code, ACTIVATIONS[name].params) for name, code in _native.ACTIVATION_CODES.items()}
# The native code of "no activation" (0 without native kernels, where it is never passed to C).
_ACT_NONE = _native.ACTIVATION_CODES.get("", 0)


def _free_out(out, *inputs):
    """``out`` (the memory plan's buffer for a result) unless it overlaps one of ``inputs``: None then."""
    if out is not None:
        for t in inputs:  # (a plain loop: any() over a generator costs more than the check on hot paths)
            if t is not None and np.may_share_memory(t, out):
                return None
    return out


def _over_input(out, x):
    """``out`` when it is exactly ``x``'s memory (the memory plan placed the result over its input: D143;
    for kernels that read each element before writing it), else :func:`_free_out`'s answer."""
    if (out is not None and out.ctypes.data == x.ctypes.data and out.nbytes == x.nbytes
            and out.flags.c_contiguous and x.flags.c_contiguous):
        return out
    return _free_out(out, x)


def _out_buffer(dst, shape: tuple, dtype=np.float32):
    """``dst`` when it can hold the result exactly (shape, dtype, C-contiguous), else a fresh array."""
    if dst is not None and dst.shape == shape and dst.dtype == dtype and dst.flags.c_contiguous:
        return dst
    return np.empty(shape, dtype=dtype)


_F32 = np.dtype(np.float32)


class _NativeConv:
    """A float32 2-D convolution prepared for one node and input shape (``_prepare_native_conv``).

    It holds what it was validated for: the weight and bias arrays themselves (a different object
    means new weights, validated again) and the residual's shape; the output shape; and the native
    entry point with its constant arguments already converted for cffi (``native.conv2d_prepare`` /
    ``native.dwconv2d_prepare``).  Running it costs the native call and the output buffer only.
    """

    __slots__ = ("w", "b", "z_shape", "y_shape", "call", "args", "x4_shape", "y4_shape")

    def fits(self, x, w, b, z) -> bool:
        """Whether this is the conv of these inputs (``x`` has the input shape it was made for)."""
        return (self.w is w and self.b is b and x.dtype == _F32 and _native.available  # (tests turn it off)
                and (self.z_shape is None if z is None else z.shape == self.z_shape and z.dtype == _F32))

    def run(self, x, z, out):
        """act(conv(x) + b + z) into ``out`` when it fits and overlaps no input, else into a new array."""
        y = _out_buffer(_free_out(out, x, z), self.y_shape)
        x = np.ascontiguousarray(x)
        z = None if z is None else np.ascontiguousarray(z)
        if self.y4_shape is None:
            self.call(self.args, x, y, z)
        else:  # run as the 2-D conv of (N, C, 1, L): views of the same memory, the result in its own shape
            y4 = self.y4_shape
            self.call(self.args, x.reshape(self.x4_shape), y.reshape(y4), None if z is None else z.reshape(y4))
        return y


def _prepare_native_conv(x, w, b, z, out, k, s, d, pb, group, act, a0, a1) -> _NativeConv:
    """The native convolution act(conv(x, w) + b + z) (shapes already validated).  A 1-D conv (x of
    rank 3) runs as the 2-D conv of (N, C, 1, W) by a 1 x K kernel: k, s, d, pb, out are then 1-D."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    wc = np.ascontiguousarray(w)
    bc = b
    if b is not None and not (b.dtype == _F32 and b.flags.c_contiguous):
        bc = np.ascontiguousarray(b, dtype=np.float32)  # (with a dtype it returns a new view even when b fits)
    plan = _NativeConv()
    plan.w, plan.b = wc, bc
    plan.z_shape = None if z is None else z.shape
    plan.x4_shape = plan.y4_shape = None
    x_shape, w4 = x.shape, wc
    if x.ndim == 4 and runs_down_a_column(x.shape[3], k[1], out[1], pb[1]):
        # the same memory seen as (N, C, 1, H) takes the row kernels, which are faster on it (magika's
        # 5 x 1 conv, 256 -> 512 channels: 1.30x -> 1.12x onnxruntime's time, Zen 5)
        x_shape = plan.x4_shape = (n, c, 1, x.shape[2])
        w4 = wc.reshape(m, cg, 1, k[0])
        k, s, d, pb, out = (1, k[0]), (1, s[0]), (1, d[0]), (0, pb[0]), (1, out[0])
        plan.y4_shape = (n, m) + out
    elif x.ndim == 3:
        x_shape = plan.x4_shape = (n, c, 1, x.shape[2])
        w4 = wc.reshape(m, cg, 1, wc.shape[2])
        k, s, d, pb, out = (1,) + tuple(k), (1,) + tuple(s), (1,) + tuple(d), (0,) + tuple(pb), (1,) + tuple(out)
        plan.y4_shape = (n, m) + out
    if group == c and cg == 1 and m == c and k[0] * k[1] > 1:
        plan.y_shape = (n, c) + tuple(out)
        plan.call = _native.dwconv2d_call
        plan.args = _native.dwconv2d_prepare(x_shape, w4, bc, k, s, d, pb, out, act, a0, a1)
    else:
        plan.y_shape = (n, m) + tuple(out)
        plan.call = _native.conv2d_call
        # (packs are cached under the weight itself: a 1-D conv's reshaped view is a new array per call)
        plan.args = _native.conv2d_prepare(x_shape, w4, group, k, s, d, pb, out, bc, act, a0, a1, owner=wc)
    if plan.y4_shape is not None:
        plan.y_shape = (n, m, out[1]) if x.ndim == 3 else (n, m, out[1], 1)
    return plan


def _prepared_conv(memo, x, w, b, z) -> _NativeConv | None:
    """The native conv this node prepared for these inputs (``x``'s shape, ``w`` / ``b`` the same
    objects, ``z`` of the same shape), or None."""
    plan = memo.get(x.shape) if memo is not None else None
    return plan if plan is not None and plan.fits(x, w, b, z) else None


def _remember_conv(memo, x, w, b, plan) -> bool:
    """Keep ``plan`` in the node's memo under ``x``'s shape, unless it reads a converted copy of ``w`` or
    ``b`` (its identity check would then always fail, and a copy would miss in-place changes) or they
    are computed values (writeable: refilled in place, its packed weights would be stale).  Returns
    whether it was kept (the later calls then run it as this one does)."""
    if memo is not None and plan is not None and plan.w is w and plan.b is b and is_constant(w, b):
        remember(memo, x.shape, plan)
        return True
    return False


def _conv2d_native(x, w, b, z, out, k, s, d, pb, group, act, a0, a1, dst=None, memo=None):
    """2-D float32 Conv through the native kernels: act(conv(x, w) + b + z).

    Depthwise convolutions run entirely in C (bias, residual and activation
    fused into the same pass).  Everything else is GEMM-based, as in the numpy path:
    1x1 kernels multiply the input directly, larger ones read the input through
    padded per-stride-phase planes (an implicit GEMM, no im2col matrix) or, for
    small images, a native im2col, and our GEMM writes y with bias + residual +
    activation fused.  The whole batch is one native call (``mrt_conv2d_f32``:
    threads over images or bands of output rows, small planes of several images
    in one GEMM).  ``memo``: the node's memo, where the prepared call is kept
    (see :class:`_NativeConv`).
    """
    plan = _prepare_native_conv(x, w, b, z, out, k, s, d, pb, group, act, a0, a1)
    if _remember_conv(memo, x, w, b, plan):  # (later calls run the kept plan: a program may replay this one)
        return _native.final(plan.run(x, z, dst))
    return plan.run(x, z, dst)


def conv_fused_native(x, w, b=None, z=None, /, *, activation="", activation_params=(), auto_pad="NOTSET",
                      dilations=(), group=1, kernel_shape=(), pads=(), strides=(), out=None, memo=None):
    """``activation(Conv(x, w, b) + z)`` in one native pass, or ``None`` when that is not possible.

    ``out``: a buffer for the result, used when it has exactly its shape and dtype.
    ``memo``: the node's NodeContext.memo: the prepared native call (:class:`_NativeConv`) is kept
    there per input shape (validating the inputs and deriving the geometry from the attributes in
    Python costs several microseconds per call, about what a small conv's kernel costs).

    For the fused ``com.minirt`` ops: returns ``None`` (the caller then
    composes the standard kernels) when the native kernels are unavailable,
    the data is not 2-D float32, or the activation has no native epilogue.
    """
    plan = _prepared_conv(memo, x, w, b, z)
    if plan is not None:  # (FusedConv returns this result as is: a program may replay the call)
        return _native.final(plan.run(x, z, out))
    if (not _native.available or x.dtype != np.float32 or w.dtype != np.float32 or x.ndim not in (3, 4)
            or w.ndim != x.ndim):
        return None
    if z is not None and (z.dtype != np.float32 or z.ndim != x.ndim):
        return None
    geometry = _fused_conv_geometry(x.shape, w.shape, None if b is None else b.shape, None if z is None else z.shape,
                                    activation, activation_params, auto_pad, dilations, group, kernel_shape, pads,
                                    strides)
    if geometry is False:
        return None
    act, a0, a1, k, s, d, out_sp, pb = geometry
    return _conv2d_native(x, w, b, z, out_sp, k, s, d, pb, group, act, a0, a1, dst=_free_out(out, x, z), memo=memo)


def _memo(ctx) -> dict | None:
    """The node's memo, or None when the kernel is called without its context (tests, the builder)."""
    return None if ctx is None else ctx.memo


def native_act(activation, params) -> tuple | None:
    """(act code, a0, a1) of the native epilogue for this activation and its parameters, or None."""
    spec = _NATIVE_ACTIVATIONS.get(activation)
    params = tuple(float(v) for v in (params or ()))
    if spec is None or len(params) != spec[1]:
        return None
    return (spec[0],) + (params + (0.0, 0.0))[:2]


def _fused_conv_geometry(x_shape, w_shape, b_shape, z_shape, activation, activation_params, auto_pad, dilations,
                         group, kernel_shape, pads, strides):
    """(act code, a0, a1, kernel, strides, dilations, output size, begin pads) of a native fused conv, or
    False when the native path does not apply (the caller then composes the standard kernels, which report
    any error)."""
    act = native_act(activation, activation_params)
    if act is None:
        return False
    n, c = x_shape[:2]
    m, cg = w_shape[:2]
    k = tuple(w_shape[2:])
    if group < 1 or c % group or m % group or cg * group != c or (kernel_shape and tuple(kernel_shape) != k):
        return False  # let the standard kernel report the error
    if b_shape is not None and b_shape != (m,):
        return False
    try:
        s = _per_axis("Conv", "strides", strides, len(x_shape) - 2, 1)
        d = _per_axis("Conv", "dilations", dilations, len(x_shape) - 2, 1)
        out_sp, pb, _ = _geometry("Conv", x_shape[2:], k, s, d, pads, auto_pad, planes=(n * c, n * m))
    except ValueError:
        return False  # the standard kernel raises the same error with its own context
    if z_shape is not None and z_shape != (n, m) + tuple(out_sp):
        return False  # a broadcasting residual: not fused
    return act + (k, s, d, tuple(out_sp), pb)


def _split_transpose_pads(total: list, auto_pad: str) -> tuple:
    """Begin padding when ConvTranspose derives its pads from a target size.

    An odd total puts the extra element at the end for SAME_UPPER and at the
    beginning otherwise (SAME_LOWER, and NOTSET with ``output_shape``), which
    is what onnxruntime does.
    """
    if auto_pad == "SAME_UPPER":
        return tuple(t // 2 for t in total)
    return tuple(t - t // 2 for t in total)


def _conv_transpose_pads(in_sp, k, s, d, op_, pads, output_shape, auto_pad):
    """ConvTranspose output size and begin padding per axis (onnxruntime's rules)."""
    nd = len(in_sp)
    full = tuple((i - 1) * si + (ki - 1) * di + 1 + a for i, ki, si, di, a in zip(in_sp, k, s, d, op_))
    if auto_pad not in _AUTO_PADS:
        raise ValueError(f"ConvTranspose: unsupported auto_pad {auto_pad!r}; expected one of {', '.join(_AUTO_PADS)}")
    if output_shape:
        shape = tuple(int(v) for v in output_shape)
        if len(shape) == nd + 2:  # some exporters include N and C
            shape = shape[2:]
        if len(shape) != nd:
            raise ValueError(f"ConvTranspose: output_shape {list(output_shape)} must have {nd} spatial values")
        total = [max(0, f - o) for f, o in zip(full, shape)]
        return shape, _split_transpose_pads(total, auto_pad)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        shape = tuple(i * si for i, si in zip(in_sp, s))
        total = [max(0, f - o) for f, o in zip(full, shape)]
        return shape, _split_transpose_pads(total, auto_pad)
    if auto_pad == "VALID" or not pads:
        return full, (0,) * nd
    if len(pads) != 2 * nd:
        raise ValueError(f"ConvTranspose: pads has {len(pads)} values, expected {2 * nd}")
    pads = tuple(int(v) for v in pads)
    if min(pads) < 0:
        raise ValueError(f"ConvTranspose: negative pads {list(pads)} are not supported")
    shape = tuple(f - pads[i] - pads[nd + i] for i, f in enumerate(full))
    if min(shape) < 1:
        raise ValueError(f"ConvTranspose: pads {list(pads)} leave an empty output (full size {list(full)})")
    return shape, pads[:nd]


_U64_SHIFT32 = np.uint64(32)


def _conv_transpose_tiles(x, w, b, act=None, dst=None):
    """float32 2-D ConvTranspose with stride == kernel, no padding/dilation, one group.

    Every input pixel then owns its own kh x kw output tile (no overlaps), so
    the result is the GEMM ``(M*kh*kw, C) @ (C, H*W)`` with the bias per row
    fused, its rows placed as interleaved taps (the FPN 2x2/stride-2
    upsampling of detection heads).  Natively (``mrt_convtranspose_tiles_f32``)
    the GEMM runs per band of input rows into cache-sized scratch and the band
    is placed right away, in one pass over the output.  Without the native
    module: one matmul, then for kw == 2 the two column taps interleaved as one
    8-byte integer per output pair.

    ``act``: (native activation code, a0, a1) applied in the GEMM epilogue
    (FusedConvTranspose), or None.  Returns (y, whether ``act`` was applied):
    only the native path applies it.  ``dst``: the result buffer when it fits (native path, _out_buffer).
    """
    n, c, hh, ww = x.shape
    m, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    kk, p = kh * kw, hh * ww
    x = np.ascontiguousarray(x)
    wt = np.ascontiguousarray(w.reshape(c, m * kk).T)
    if _native.available:
        y = _out_buffer(_free_out(dst, x), (n, m, hh * kh, ww * kw))
        bias_rows = None if b is None else np.ascontiguousarray(np.repeat(b.astype(np.float32), kk))
        _native.convtranspose_tiles(x, wt, m, (kh, kw), bias_rows, y, *(act or (_ACT_NONE, 0.0, 0.0)))
        return _native.final(y), act is not None  # (one native call: a program may replay it)
    cols = np.matmul(wt, x.reshape(n, c, p))
    if b is not None:
        cols.reshape(n, m, kk * p)[...] += b.astype(np.float32).reshape(m, 1)
    taps = cols.reshape(n, m, kh, kw, hh, ww)
    y = np.empty((n, m, hh, kh, ww, kw), dtype=np.float32)
    if kw == 2:
        u = taps.view(np.uint32)
        yv = y.view(np.uint64).reshape(n, m, hh, kh, ww)
        for t in range(kh):
            lo = u[:, :, t, 0].astype(np.uint64)
            hi = u[:, :, t, 1].astype(np.uint64)
            np.left_shift(hi, _U64_SHIFT32, out=hi)
            np.bitwise_or(lo, hi, out=yv[:, :, :, t, :])
    else:
        np.copyto(y, taps.transpose(0, 1, 4, 2, 5, 3))
    return y.reshape(n, m, hh * kh, ww * kw), False


@kernel("ConvTranspose", since=1, out=True)
def conv_transpose(
    x,
    w,
    b=None,
    /,
    *,
    auto_pad="NOTSET",
    dilations=(),
    group=1,
    kernel_shape=(),
    output_padding=(),
    output_shape=(),
    pads=(),
    strides=(),
    out=None,
):
    return conv_transpose_act(
        x, w, b, None, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
        output_padding=output_padding, output_shape=output_shape, pads=pads, strides=strides, dst=out,
    )[0]


def conv_transpose_act(x, w, b, act, *, auto_pad="NOTSET", dilations=(), group=1, kernel_shape=(), output_padding=(),
                       output_shape=(), pads=(), strides=(), dst=None):
    """ConvTranspose, with the native activation ``act`` = (code, a0, a1) or None fused where it can be.

    Returns (y, whether ``act`` was applied): the stride == kernel path applies
    it in its GEMM epilogue; otherwise the caller applies it (FusedConvTranspose).
    ``dst``: the memory plan's buffer for the result, used by that path when it fits.
    """
    nd = _check_rank("ConvTranspose", x)
    if w.ndim != x.ndim:
        raise ValueError(f"ConvTranspose: weight rank {w.ndim} (shape {w.shape}) does not match input rank {x.ndim}")
    if x.dtype != w.dtype:
        raise ValueError(f"ConvTranspose: input dtype {x.dtype} and weight dtype {w.dtype} differ")
    n, c = x.shape[:2]
    in_sp = x.shape[2:]
    mg = w.shape[1]
    k = w.shape[2:]
    if group < 1 or w.shape[0] != c or c % group:
        raise ValueError(
            f"ConvTranspose: weight shape {w.shape} and group={group} incompatible with {c} input channels "
            f"(need W.shape[0] == C_in and group dividing C_in)"
        )
    if kernel_shape and tuple(kernel_shape) != k:
        raise ValueError(f"ConvTranspose: kernel_shape {list(kernel_shape)} does not match weight shape {list(k)}")
    m = mg * group
    cg = c // group
    s = _per_axis("ConvTranspose", "strides", strides, nd, 1)
    d = _per_axis("ConvTranspose", "dilations", dilations, nd, 1)
    if output_padding:
        if len(output_padding) != nd or min(output_padding) < 0:
            raise ValueError(f"ConvTranspose: output_padding {list(output_padding)} must be {nd} values >= 0")
        op_ = tuple(int(v) for v in output_padding)
        for i, (o, si, di) in enumerate(zip(op_, s, d)):
            if o >= max(si, di):  # (onnxruntime's rule: the padding stays within one stride's gap)
                raise ValueError(f"ConvTranspose: output_padding {list(op_)}: {o} on spatial axis {i} must be less "
                                 f"than max(stride, dilation) = {max(si, di)}")
    else:
        op_ = (0,) * nd
    if b is not None and b.shape != (m,):
        raise ValueError(f"ConvTranspose: bias shape {b.shape} must be ({m},)")
    out, pb = _conv_transpose_pads(in_sp, k, s, d, op_, pads, output_shape, auto_pad)
    if x.dtype.itemsize < 4:
        # float16: compute in float32 (numpy has no half-precision BLAS), round once.
        bf = None if b is None else b.astype(np.float32)
        y = conv_transpose(x.astype(np.float32), w.astype(np.float32), bf, auto_pad=auto_pad, dilations=dilations,
                           group=group, output_padding=output_padding, output_shape=output_shape, pads=pads,
                           strides=strides)
        return y.astype(x.dtype), False
    kk = math.prod(k)
    check_alloc((n, m, kk) + tuple(in_sp), x.dtype, "ConvTranspose column buffer")
    if (nd == 2 and group == 1 and x.dtype == np.float32 and s == tuple(k) and d == (1, 1) and pb == (0, 0)
            and tuple(out) == tuple(i * ki for i, ki in zip(in_sp, k))):
        return _conv_transpose_tiles(x, w, b, act, dst=dst)

    # cols[n, g*Mg + j, *tap, *pos] = sum_c W[g*Cg + c, j, *tap] * X[n, g*Cg + c, *pos]
    wg = w.reshape(group, cg, mg * kk).transpose(0, 2, 1)
    cols = np.matmul(wg, x.reshape(n, group, cg, math.prod(in_sp)))
    cols = cols.reshape((n, m) + k + in_sp)
    # col2im: every tap adds its contribution at stride-spaced output positions.
    # The buffer covers both the full transposed-conv extent and the requested
    # output window (output_shape may ask for more than the data reaches).
    span = tuple((i - 1) * si + 1 for i, si in zip(in_sp, s))
    size = tuple(max((ki - 1) * di + sp, b_ + o) for ki, di, sp, b_, o in zip(k, d, span, pb, out))
    check_alloc((n, m) + size, x.dtype, "ConvTranspose output buffer")
    full = np.zeros((n, m) + size, dtype=x.dtype)
    for t in itertools.product(*(range(ki) for ki in k)):
        dst = (slice(None), slice(None)) + tuple(
            slice(ti * di, ti * di + sp, si) for ti, di, sp, si in zip(t, d, span, s)
        )
        full[dst] += cols[(slice(None), slice(None)) + t]
    y = full[(slice(None), slice(None)) + tuple(slice(b_, b_ + o) for b_, o in zip(pb, out))]
    if b is not None:
        return y + b.reshape((m,) + (1,) * nd), False
    return np.ascontiguousarray(y), False


# --------------------------------------------------------------------------- pooling


def _check_pool_pads(op: str, pb: tuple, pe: tuple, k: tuple) -> None:
    # Padding at least as large as the kernel would create windows holding
    # nothing but padding (-inf maxima, zero averaging counts); onnxruntime
    # rejects such models too.
    if any(p >= ki for p, ki in zip(pb, k)) or any(p >= ki for p, ki in zip(pe, k)):
        raise ValueError(f"{op}: pads {list(pb + pe)} must be smaller than kernel_shape {list(k)}")


def _max_pool_geometry(x_shape, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides):
    """(rank, kernel, strides, dilations, output size, begin pads, end pads, native call) of a MaxPool;
    raises on bad input.  ``native call``: the constant arguments of ``native.maxpool2d_call`` for a
    2-D float32 input of this shape (None when there is no native kernel)."""
    nd = len(x_shape) - 2
    if not kernel_shape:
        raise ValueError("MaxPool: kernel_shape attribute is required")
    k = _per_axis("MaxPool", "kernel_shape", kernel_shape, nd, 1)
    s = _per_axis("MaxPool", "strides", strides, nd, 1)
    d = _per_axis("MaxPool", "dilations", dilations, nd, 1)
    if storage_order not in (0, 1):
        raise ValueError(f"MaxPool: storage_order must be 0 or 1, got {storage_order}")
    out, pb, pe = _geometry("MaxPool", x_shape[2:], k, s, d, pads, auto_pad, ceil_mode,
                            planes=(x_shape[0] * x_shape[1],) * 2)
    if auto_pad == "NOTSET":  # automatic pads may exceed a dilated kernel legitimately
        _check_pool_pads("MaxPool", pb, pe, k)
    native = None
    if nd == 2 and _native.available:
        # separable (rows, then columns): SPPF's 5x5 stride-1 pools on small planes
        separable = s == (1, 1) and d == (1, 1)
        native = _native.maxpool2d_prepare(x_shape, k, s, d, pb, out, separable)
    return nd, k, s, d, tuple(out), pb, pe, native


def _max_pool(x, n_out, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides, memo=None,
              out=None):
    """``memo``: the node's NodeContext.memo, where the validated geometry is kept per input shape
    (deriving it costs more than a small plane's native pool).  ``out``: the memory plan's buffer for
    the result (native path, when it fits)."""
    _check_rank("MaxPool", x)
    geometry = memo.get(x.shape) if memo is not None else None
    if geometry is None:  # (invalid input raises here, every time: only valid geometries are kept)
        geometry = _max_pool_geometry(x.shape, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order,
                                      strides)
        remember(memo, x.shape, geometry)
    nd, k, s, d, out_sp, pb, pe, native = geometry
    if n_out < 2 and native is not None and x.dtype == _F32 and _native.available:
        y = _out_buffer(_free_out(out, x), x.shape[:2] + out_sp)
        _native.maxpool2d_call(native, np.ascontiguousarray(x), y)
        return y if memo is None else _native.final(y)  # (with a memo: the node's own kernel, returned as is)
    in_sp = x.shape[2:]
    xp = _pad_for_windows(x, out_sp, k, s, d, pb, _pad_value_min(x.dtype))
    taps = _tap_slices(k, s, d, out_sp)
    if n_out < 2:
        y = xp[taps[0]].copy()
        for sl in taps[1:]:
            np.maximum(y, xp[sl], out=y)
        return y

    # With Indices: track which tap won (first maximum wins, as in onnxruntime),
    # then turn (output position, tap) into a flat index into X.
    # The winning tap is tracked in the smallest integer type that holds the
    # tap count, updated arithmetically (best += better * (i - best)): masked
    # assignment (copyto/putmask/where) is an order of magnitude slower.
    tdt = np.int8 if len(taps) <= 127 else np.int16 if len(taps) <= 32767 else np.int32
    y = xp[taps[0]].copy()
    best = np.zeros(y.shape, dtype=tdt)
    for i, sl in enumerate(taps[1:], start=1):
        v = xp[sl]
        better = (v > y).view(np.int8).astype(tdt, copy=False)
        np.maximum(y, v, out=y)
        better *= tdt(i) - best
        best += better
    tap_coords = np.array(list(itertools.product(*(range(ki) for ki in k))), dtype=np.int64).reshape(-1, nd)
    # Row-major (storage_order 0) or column-major (1) strides of the spatial block.
    if storage_order == 0:
        sp_strides = [math.prod(in_sp[a + 1 :]) for a in range(nd)]
    else:
        sp_strides = [math.prod(in_sp[:a]) for a in range(nd)]
    n, c = x.shape[:2]
    flat = (np.arange(n * c, dtype=np.int64) * math.prod(in_sp)).reshape((n, c) + (1,) * nd)
    for a in range(nd):
        pos = (np.arange(out_sp[a], dtype=np.int64) * s[a] - pb[a]).reshape((-1,) + (1,) * (nd - 1 - a))
        flat = flat + (pos + np.take(tap_coords[:, a] * d[a], best)) * sp_strides[a]
    return y, flat


@kernel("MaxPool", since=1, context=True, out=True)
def max_pool_1(x, /, *, auto_pad="NOTSET", kernel_shape=(), pads=(), strides=(), out=None, ctx=None):
    return _max_pool(x, 1, auto_pad, 0, (), kernel_shape, pads, 0, strides, _memo(ctx), out)


@kernel("MaxPool", since=8, context=True, out=True)
def max_pool_8(x, /, *, auto_pad="NOTSET", kernel_shape=(), pads=(), storage_order=0, strides=(), out=None,
               ctx=None):
    return _max_pool(x, _n_outputs(ctx), auto_pad, 0, (), kernel_shape, pads, storage_order, strides, _memo(ctx),
                     out)


@kernel("MaxPool", since=10, context=True, out=True)
def max_pool_10(
    x,
    /,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=(),
    kernel_shape=(),
    pads=(),
    storage_order=0,
    strides=(),
    out=None,
    ctx=None,
):
    return _max_pool(x, _n_outputs(ctx), auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides,
                     _memo(ctx), out)


def _window_counts(out: int, k: int, s: int, d: int, pb: int, lo: int, hi: int) -> np.ndarray:
    """Per output position along one axis: how many taps land in ``[lo, hi)`` (input coordinates)."""
    pos = np.arange(out)[:, None] * s - pb + np.arange(k)[None, :] * d
    return ((pos >= lo) & (pos < hi)).sum(axis=1)


def _average_pool(x, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads, strides, dst=None):
    """``dst``: the memory plan's buffer for the result (native path, when it fits)."""
    nd = _check_rank("AveragePool", x)
    if not kernel_shape:
        raise ValueError("AveragePool: kernel_shape attribute is required")
    if x.dtype.kind != "f":
        raise ValueError(f"AveragePool: unsupported dtype {x.dtype}")
    k = _per_axis("AveragePool", "kernel_shape", kernel_shape, nd, 1)
    s = _per_axis("AveragePool", "strides", strides, nd, 1)
    d = _per_axis("AveragePool", "dilations", dilations, nd, 1)
    in_sp = x.shape[2:]
    out, pb, pe = _geometry("AveragePool", in_sp, k, s, d, pads, auto_pad, ceil_mode,
                            planes=(x.shape[0] * x.shape[1],) * 2, dtype=x.dtype)
    if auto_pad == "NOTSET":  # automatic pads may exceed a dilated kernel legitimately
        _check_pool_pads("AveragePool", pb, pe, k)
    cdt = _compute_dtype(x.dtype)
    if nd == 2 and x.dtype == np.float32 and _native.available:
        y = _out_buffer(_free_out(dst, x), x.shape[:2] + tuple(out))
        # Same divisor rule as below: a fixed 1/K, or per-output tap counts
        # inside the counting box (input, or input + declared padding).
        if count_include_pad:
            box = ((-pb[0], in_sp[0] + pe[0]), (-pb[1], in_sp[1] + pe[1]))
        else:
            box = ((0, in_sp[0]), (0, in_sp[1]))
        scale = float(np.float32(1.0 / math.prod(k))) if count_include_pad and not ceil_mode else 0.0
        _native.avgpool2d(np.ascontiguousarray(x), y, k, s, d, pb, box, scale)
        return _native.final(y)  # (one native call: a program may replay it)
    xp = _pad_for_windows(x, out, k, s, d, pb, 0)
    taps = _tap_slices(k, s, d, out)
    y = xp[taps[0]].astype(cdt)
    for sl in taps[1:]:
        y += xp[sl]
    # The divisor counts the taps inside the real input, or (count_include_pad)
    # inside input + declared padding; positions only reached because of
    # ceil_mode never count.  Without ceil_mode and with count_include_pad
    # every window lies inside input + padding, so it is the kernel size.
    if count_include_pad and not ceil_mode:
        y *= cdt.type(1.0 / math.prod(k))
    else:
        count = None
        for a in range(nd):
            lo, hi = (-pb[a], in_sp[a] + pe[a]) if count_include_pad else (0, in_sp[a])
            ca = _window_counts(out[a], k[a], s[a], d[a], pb[a], lo, hi)
            ca = ca.reshape((-1,) + (1,) * (nd - 1 - a))
            count = ca if count is None else count * ca
        y /= count.astype(cdt)
    return y.astype(x.dtype, copy=False)


@kernel("AveragePool", since=1, out=True)
def average_pool_1(x, /, *, auto_pad="NOTSET", kernel_shape=(), pads=(), strides=(), out=None):
    return _average_pool(x, auto_pad, 0, 0, (), kernel_shape, pads, strides, out)


@kernel("AveragePool", since=7, out=True)
def average_pool_7(x, /, *, auto_pad="NOTSET", count_include_pad=0, kernel_shape=(), pads=(), strides=(), out=None):
    return _average_pool(x, auto_pad, 0, count_include_pad, (), kernel_shape, pads, strides, out)


@kernel("AveragePool", since=10, out=True)
def average_pool_10(x, /, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, kernel_shape=(), pads=(), strides=(),
                    out=None):
    return _average_pool(x, auto_pad, ceil_mode, count_include_pad, (), kernel_shape, pads, strides, out)


@kernel("AveragePool", since=19, out=True)
def average_pool_19(
    x, /, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=(), kernel_shape=(), pads=(), strides=(),
    out=None,
):
    return _average_pool(x, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads, strides, out)


@kernel("GlobalAveragePool", since=1, out=True)
def global_average_pool(x, /, *, out=None):
    nd = _check_rank("GlobalAveragePool", x)
    if x.dtype == np.float32 and x.size and _native.available:
        # One pass with vector partial sums (numpy's mean over the trailing axes is several times slower).
        y = _out_buffer(_free_out(out, x), x.shape[:2] + (1,) * nd)
        _native.plane_means(np.ascontiguousarray(x), y)
        return _native.final(y)  # (one native call, returned as is: a program may replay it)
    # np.mean accumulates float16 in float32 and returns the input dtype.
    return np.asarray(x.mean(axis=tuple(range(2, 2 + nd)), keepdims=True), dtype=x.dtype)


@kernel("GlobalMaxPool", since=1)
def global_max_pool(x, /):
    nd = _check_rank("GlobalMaxPool", x)
    if x.dtype == np.float32 and x.size and x.flags.c_contiguous and type(x) is np.ndarray and _native.available:
        # the planes' maxima by one native call (NaN-propagating, as numpy's max)
        y = np.empty(x.shape[:2] + (1,) * nd, np.float32)
        _native.reduce("ReduceMax", x, y, x.shape[0] * x.shape[1], x.size // (x.shape[0] * x.shape[1]), 1)
        return _native.final(y)
    return np.asarray(x.max(axis=tuple(range(2, 2 + nd)), keepdims=True))


# --------------------------------------------------------------------------- normalisation


def _batch_norm(x, scale, bias, mean, var, epsilon, n_out):
    if x.ndim < 2:
        raise ValueError(f"BatchNormalization: input must be (N, C, ...), got shape {x.shape}")
    if n_out > 1:
        raise ValueError(
            f"BatchNormalization: node has {n_out} outputs; the extra outputs only exist in training mode, "
            "which this inference runtime does not support"
        )
    c = x.shape[1]
    cdt = _compute_dtype(x.dtype)
    params = []
    for name, p in (("scale", scale), ("B", bias), ("mean", mean), ("var", var)):
        if p.shape == (c,):
            p = p.reshape((c,) + (1,) * (x.ndim - 2))
        elif p.shape != x.shape[1:]:  # spatial=0 (opset < 9): per-activation statistics
            raise ValueError(f"BatchNormalization: {name} shape {p.shape} must be ({c},) or {x.shape[1:]}")
        params.append(p.astype(cdt, copy=False))
    scale, bias, mean, var = params
    # Fold into y = x * a + b: two passes over x instead of four.
    a = scale / np.sqrt(var + cdt.type(epsilon))
    b = bias - mean * a
    y = x * a.astype(x.dtype, copy=False)
    y += b.astype(x.dtype, copy=False)
    return y


@kernel("BatchNormalization", since=1, context=True)
def batch_norm_1(
    x, scale, b, mean, var, /, *, consumed_inputs=(), epsilon=1e-5, is_test=0, momentum=0.9, spatial=1, ctx=None
):
    return _batch_norm(x, scale, b, mean, var, epsilon, _n_outputs(ctx))


@kernel("BatchNormalization", since=6, context=True)
def batch_norm_6(x, scale, b, mean, var, /, *, epsilon=1e-5, is_test=0, momentum=0.9, spatial=1, ctx=None):
    return _batch_norm(x, scale, b, mean, var, epsilon, _n_outputs(ctx))


@kernel("BatchNormalization", since=7, context=True)
def batch_norm_7(x, scale, b, mean, var, /, *, epsilon=1e-5, momentum=0.9, spatial=1, ctx=None):
    return _batch_norm(x, scale, b, mean, var, epsilon, _n_outputs(ctx))


@kernel("BatchNormalization", since=9, context=True)
def batch_norm_9(x, scale, b, mean, var, /, *, epsilon=1e-5, momentum=0.9, ctx=None):
    return _batch_norm(x, scale, b, mean, var, epsilon, _n_outputs(ctx))


@kernel("BatchNormalization", since=14, context=True)
def batch_norm_14(x, scale, b, mean, var, /, *, epsilon=1e-5, momentum=0.9, training_mode=0, ctx=None):
    if training_mode:
        return _batch_norm_training(x, scale, b, mean, var, epsilon, momentum, _n_outputs(ctx))
    return _batch_norm(x, scale, b, mean, var, epsilon, _n_outputs(ctx))


def _batch_norm_training(x, scale, bias, mean, var, epsilon, momentum, n_out):
    """training_mode=1: normalise with the batch statistics; optionally output the running ones."""
    if x.ndim < 2:
        raise ValueError(f"BatchNormalization: input must be (N, C, ...), got shape {x.shape}")
    c = x.shape[1]
    for name, p in (("scale", scale), ("B", bias), ("input_mean", mean), ("input_var", var)):
        if p.shape != (c,):
            raise ValueError(f"BatchNormalization: {name} shape {p.shape} must be ({c},)")
    cdt = _compute_dtype(x.dtype)
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = (c,) + (1,) * (x.ndim - 2)
    xc = x.astype(cdt, copy=False)
    cur_mean = xc.mean(axis=axes)
    cur_var = xc.var(axis=axes)  # population variance (divides by N)
    a = scale.astype(cdt) / np.sqrt(cur_var + cdt.type(epsilon))
    y = (xc - cur_mean.reshape(bshape)) * a.reshape(bshape) + bias.astype(cdt).reshape(bshape)
    outs = [y.astype(x.dtype, copy=False)]
    if n_out > 1:
        m = cdt.type(momentum)
        running_mean = mean.astype(cdt) * m + cur_mean * (cdt.type(1) - m)
        outs.append(running_mean.astype(mean.dtype, copy=False))
    if n_out > 2:
        running_var = var.astype(cdt) * m + cur_var * (cdt.type(1) - m)
        outs.append(running_var.astype(var.dtype, copy=False))
    return outs[0] if n_out < 2 else tuple(outs)


def _instance_norm(x, scale, bias, epsilon, out=None):
    if x.ndim < 3:
        raise ValueError(f"InstanceNormalization: input must be (N, C, D1, ...), got shape {x.shape}")
    c = x.shape[1]
    if scale.shape != (c,) or bias.shape != (c,):
        raise ValueError(f"InstanceNormalization: scale {scale.shape} and B {bias.shape} must both be ({c},)")
    if (x.dtype == np.float32 and _native.available and x.size and _f32_like(scale, (c,))
            and _f32_like(bias, (c,))):
        # float32: one native pass per (n, c) plane (LayerNormalization's rows, one scale / bias per row),
        # into the memory plan's buffer when it fits (a fresh array is a first run's page faults)
        y = _out_buffer(_free_out(out, x), x.shape)
        _native.instancenorm_rows(np.ascontiguousarray(x), np.ascontiguousarray(scale),
                                  np.ascontiguousarray(bias), y, float(epsilon))
        return _native.final(y)  # (one native call: a program may replay it)
    cdt = _compute_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    axes = tuple(range(2, x.ndim))
    mean = xc.mean(axis=axes, keepdims=True)
    centred = xc - mean
    var = np.square(centred).mean(axis=axes, keepdims=True)
    bshape = (c,) + (1,) * (x.ndim - 2)
    a = scale.astype(cdt, copy=False).reshape(bshape) / np.sqrt(var + cdt.type(epsilon))
    centred *= a
    centred += bias.astype(cdt, copy=False).reshape(bshape)
    return centred.astype(x.dtype, copy=False)


@kernel("InstanceNormalization", since=1, out=True)
def instance_norm_1(x, scale, b, /, *, consumed_inputs=(), epsilon=1e-5, out=None):
    return _instance_norm(x, scale, b, epsilon, out)


@kernel("InstanceNormalization", since=6, out=True)
def instance_norm_6(x, scale, b, /, *, epsilon=1e-5, out=None):
    return _instance_norm(x, scale, b, epsilon, out)


def _f32_like(v, shape: tuple) -> bool:
    """``v`` is a float32 array of exactly ``shape`` (LayerNormalization's scale / bias without broadcasting)."""
    return type(v) is np.ndarray and v.dtype == np.float32 and v.shape == shape


@kernel("LayerNormalization", since=17, context=True, out=True)
def layer_norm(x, scale, b=None, /, *, axis=-1, epsilon=1e-5, stash_type=1, ctx=None, out=None):
    ax = _axis("LayerNormalization", axis, x.ndim)
    if stash_type == 1:
        mdt = np.dtype(np.float32)
    elif stash_type == 11:
        mdt = np.dtype(np.float64)
    else:
        raise ValueError(f"LayerNormalization: unsupported stash_type {stash_type} (expected 1=float or 11=double)")
    if (stash_type == 1 and x.dtype == np.float32 and _native.available and _n_outputs(ctx) == 1 and x.size
            and _f32_like(scale, x.shape[ax:]) and (b is None or _f32_like(b, x.shape[ax:]))):
        # float32 rows over the trailing axes, one output: one native pass per row (statistics in
        # float lanes summed in double, the centred variance as below), into the memory plan's buffer
        # when it fits (a fresh array is a first run's page faults)
        y = _out_buffer(_free_out(out, x), x.shape)
        _native.layernorm_rows(np.ascontiguousarray(x), np.ascontiguousarray(scale),
                               None if b is None else np.ascontiguousarray(b), y, float(epsilon))
        return _native.final(y)  # (one native call: a program may replay it)
    # Statistics are computed in at least the stash precision (a float64 input
    # keeps float64, as onnxruntime does); Mean/InvStdDev are reported in it.
    sdt = np.result_type(x.dtype, mdt)
    xs = x.astype(sdt, copy=False)
    axes = tuple(range(ax, x.ndim))
    mean = xs.mean(axis=axes, keepdims=True)
    centred = xs - mean
    inv_std = np.square(centred).mean(axis=axes, keepdims=True)
    inv_std += sdt.type(epsilon)
    np.sqrt(inv_std, out=inv_std)
    np.reciprocal(inv_std, out=inv_std)
    centred *= inv_std
    try:
        # Scale and bias are applied in the statistics precision; one rounding
        # to the input dtype at the end (a no-op for float32).
        y = centred * scale
        if b is not None:
            y += b
        if y.shape != x.shape:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"LayerNormalization: Scale {scale.shape} / B {None if b is None else b.shape} do not broadcast "
            f"to the input shape {x.shape}"
        ) from None
    y = y.astype(x.dtype, copy=False)
    n_out = _n_outputs(ctx)
    if n_out == 1:
        return y
    return (y, mean.astype(mdt, copy=False), inv_std.astype(mdt, copy=False))[:n_out]


@kernel("LpNormalization", since=1)
def lp_normalization(x, /, *, axis=-1, p=2):
    ax = _axis("LpNormalization", axis, x.ndim)
    cdt = _compute_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    if p == 2:
        norm = np.sqrt(np.square(xc).sum(axis=ax, keepdims=True))
    elif p == 1:
        norm = np.abs(xc).sum(axis=ax, keepdims=True)
    else:
        raise ValueError(f"LpNormalization: p must be 1 or 2, got {p}")
    # An all-zero slice stays zero instead of becoming 0/0 = NaN.
    norm[norm == 0] = 1
    return (xc / norm).astype(x.dtype, copy=False)


@kernel("LRN", since=1)
def lrn(x, /, *, alpha=1e-4, beta=0.75, bias=1.0, size=0):
    if size < 1:
        raise ValueError(f"LRN: size attribute must be >= 1, got {size}")
    if x.ndim < 3:
        raise ValueError(f"LRN: input must be (N, C, D1, ...), got shape {x.shape}")
    cdt = _compute_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    sq = np.square(xc)
    c = x.shape[1]
    before = (size - 1) // 2
    after = size - 1 - before  # ceil((size-1)/2)
    # square_sum[c] = sum of sq over channels [c - before, c + after], clipped;
    # one shifted add per window offset (size is small) keeps it vectorised.
    total = sq.copy()
    # (offsets of c or more reach no channel: the loops stop there, whatever the size; a size of 2^62
    # iterated 2^61 empty offsets, a hang found by tests/test_attribute_extremes.py)
    for off in range(1, min(before, c - 1) + 1):
        total[:, off:] += sq[:, : c - off]
    for off in range(1, min(after, c - 1) + 1):
        total[:, : c - off] += sq[:, off:]
    total *= cdt.type(alpha / size)
    total += cdt.type(bias)
    np.power(total, cdt.type(beta), out=total)
    return (xc / total).astype(x.dtype, copy=False)


# --------------------------------------------------------------------------- softmax family


def _softmax(x: np.ndarray, axis: int, log: bool, out=None) -> np.ndarray:
    """Softmax / LogSoftmax over ``axis``; ``out``: the memory plan's buffer (native path, when it fits)."""
    if _narrow.is_narrow_float(x.dtype):  # bfloat16 / float8: in float32, rounded once
        return _softmax(x.astype(np.float32), axis, log).astype(x.dtype)
    if x.dtype.kind != "f":
        raise ValueError(f"{'LogSoftmax' if log else 'Softmax'}: unsupported dtype {x.dtype}")
    if x.size == 0:
        return x.copy()
    if axis == x.ndim - 1 and x.dtype == np.float32 and _native.available:
        y = _out_buffer(_over_input(out, x), x.shape)
        _native.softmax_rows(np.ascontiguousarray(x), y, log)
        return _native.final(y)  # (one native call: a program may replay it)
    cdt = _compute_dtype(x.dtype)
    xc = x.astype(cdt, copy=False)
    # Subtracting the max keeps exp() finite; the result is invariant to it.
    shifted = xc - xc.max(axis=axis, keepdims=True)
    if log:
        total = np.exp(shifted).sum(axis=axis, keepdims=True)
        shifted -= np.log(total)
        return shifted.astype(x.dtype, copy=False)
    np.exp(shifted, out=shifted)
    shifted /= shifted.sum(axis=axis, keepdims=True)
    return shifted.astype(x.dtype, copy=False)


def _hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    y = np.zeros_like(x)
    if x.size:
        # argmax picks the first maximum, as ONNX specifies.
        np.put_along_axis(y, np.expand_dims(x.argmax(axis=axis), axis), 1, axis=axis)
    return y


def _coerce_2d(op: str, x: np.ndarray, axis: int) -> tuple:
    """Opset < 13 semantics: view x as (prod(shape[:axis]), prod(shape[axis:]))."""
    if x.ndim == 0:
        raise ValueError(f"{op}: input must have rank >= 1")
    ax = _axis(op, axis, x.ndim)
    return x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:])), x.shape


@kernel("Softmax", since=1, out=True)
def softmax_1(x, /, *, axis=1, out=None):
    x2, shape = _coerce_2d("Softmax", x, axis)
    if x.dtype == np.float32 and x.size and _native.available:
        # rows of the trailing axes, written in the result's own shape (a reshape of the native result
        # would be another array than the one the call wrote, which a program could not replay)
        y = _out_buffer(_over_input(out, x), shape)
        _native.softmax_rows(np.ascontiguousarray(x2), y.reshape(x2.shape), False)
        return _native.final(y)
    return _softmax(x2, 1, False).reshape(shape)


@kernel("Softmax", since=13, out=True)
def softmax_13(x, /, *, axis=-1, out=None):
    return _softmax(x, _axis("Softmax", axis, x.ndim), False, out)


@kernel("LogSoftmax", since=1)
def log_softmax_1(x, /, *, axis=1):
    x2, shape = _coerce_2d("LogSoftmax", x, axis)
    return _softmax(x2, 1, True).reshape(shape)


@kernel("LogSoftmax", since=13)
def log_softmax_13(x, /, *, axis=-1):
    return _softmax(x, _axis("LogSoftmax", axis, x.ndim), True)


@kernel("Hardmax", since=1)
def hardmax_1(x, /, *, axis=1):
    x2, shape = _coerce_2d("Hardmax", x, axis)
    return _hardmax(x2, 1).reshape(shape)


@kernel("Hardmax", since=13)
def hardmax_13(x, /, *, axis=-1):
    return _hardmax(x, _axis("Hardmax", axis, x.ndim))


# --------------------------------------------------------------------------- dropout


def _dropout(x, n_out, mask_dtype):
    # Inference: identity.  The input is returned as is (kernels never write
    # into their inputs, so sharing the buffer is safe).
    if n_out < 2:
        return x
    return x, np.ones(x.shape, dtype=mask_dtype)


@kernel("Dropout", since=1, context=True)
def dropout_1(x, /, *, consumed_inputs=(), is_test=0, ratio=0.5, ctx=None):
    return _dropout(x, _n_outputs(ctx), x.dtype)


@kernel("Dropout", since=6, context=True)
def dropout_6(x, /, *, is_test=0, ratio=0.5, ctx=None):
    return _dropout(x, _n_outputs(ctx), x.dtype)


@kernel("Dropout", since=7, context=True)
def dropout_7(x, /, *, ratio=0.5, ctx=None):
    return _dropout(x, _n_outputs(ctx), x.dtype)


@kernel("Dropout", since=10, context=True)
def dropout_10(x, /, *, ratio=0.5, ctx=None):
    return _dropout(x, _n_outputs(ctx), np.bool_)


@kernel("Dropout", since=12, context=True)
def dropout_12(x, ratio=None, training_mode=None, /, *, seed=None, ctx=None):
    if training_mode is not None and bool(np.asarray(training_mode)):
        r = 0.5 if ratio is None else float(np.asarray(ratio))
        if r != 0.0:
            return _dropout_training(x, r, seed, _n_outputs(ctx))
    return _dropout(x, _n_outputs(ctx), np.bool_)


def _dropout_training(x, ratio, seed, n_out):
    """Random dropout: keep each element with probability 1 - ratio, scale the kept ones by 1/(1 - ratio).

    The mask is drawn from numpy's seeded Mersenne-Twister generator
    (``RandomState(seed).uniform``); the same seed gives the same mask.
    """
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"Dropout: ratio must be in [0, 1), got {ratio}")
    rng = np.random.RandomState(None if seed is None else int(seed) & 0xFFFFFFFF)
    mask = rng.uniform(0.0, 1.0, x.shape) >= ratio
    scale = 1.0 / (1.0 - ratio)
    y = np.asarray(mask * x * scale).astype(x.dtype, copy=False)
    return y if n_out < 2 else (y, mask)
