"""A numpy evaluator for the MIL ops minirt's Core ML lowering emits: the off-device reference.

Core ML cannot run off Apple devices, so the tests and ``minirt verify`` (off-device, for a Core ML
partition: minirt/tools/verify.py) read a saved ML Program back with coremltools' milproto loader
and run it here; it needs coremltools (the builder's side), never the runtime.  Semantics follow the
coremltools MIL op documentation (conv/pool ``pad`` order
``[begin0, end0, begin1, end1]``, weights ``[C_out, C_in/groups, *K]``,
conv_transpose weights ``[C_in, C_out/groups, *K]``, ``linear`` weights
``[D_out, D_in]``, ``upsample_bilinear`` grid formulas, ``pad`` on the last
len(pad)/2 axes, ``lstm`` gate rows ``[input, forget, output, cell]``, ``gru`` gate rows
``[reset, new, update]``, ...).  fp16 tensors
are computed as float32 and rounded to fp16 after every op, which mimics
(not reproduces) an fp16 device.
"""
from __future__ import annotations

import io
import logging
import os
import tempfile
import zipfile

import numpy as np



def _erf_np(x):
    """erf in numpy (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7): no scipy needed."""
    x = np.asarray(x, np.float64)
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (sign * (1.0 - poly * np.exp(-a * a))).astype(np.float32)


def _quiet_ct():
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    import coremltools as ct

    return ct


def read_package(blob: bytes):
    """(spec, pymil Program) read back from a minirt Core ML blob (zipped .mlpackage)."""
    ct = _quiet_ct()
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load
    from coremltools.proto import Model_pb2

    with tempfile.TemporaryDirectory(prefix="mil-eval-") as tmp, zipfile.ZipFile(io.BytesIO(bytes(blob))) as zf:
        for name in zf.namelist():  # (a blob is data: no member may land outside the folder)
            if name.startswith("/") or ".." in name.split("/"):
                raise ValueError(f"unsafe path {name!r} in the Core ML blob")
        zf.extractall(tmp)
        root = zf.namelist()[0].split("/")[0]
        data = os.path.join(tmp, root, "Data", "com.apple.CoreML")
        spec = Model_pb2.Model()
        with open(os.path.join(data, "model.mlmodel"), "rb") as f:
            spec.ParseFromString(f.read())
        # (the loader reads the weight file now: the folder may go once it returns)
        prog = milproto_load(spec, spec.specificationVersion, file_weights_dir=os.path.join(data, "weights"))
    return spec, prog


def _np_dtype(var):
    from coremltools.converters.mil.mil import types

    t = var.dtype
    if t == types.fp16:
        return np.float16
    if t == types.fp32:
        return np.float32
    if t in (types.int32, types.int64, types.int16, types.int8):
        return np.int32
    if t == types.bool:
        return np.bool_
    return None


def run_program(prog, feeds: dict) -> dict:
    """Evaluate function ``main`` on ``feeds`` (input name -> array); output name -> array."""
    func = prog.functions["main"]
    env: dict[str, np.ndarray] = {}
    for name, var in func.inputs.items():
        env[name] = np.asarray(feeds[name]).astype(_np_dtype(var) or np.float32)

    def get(v):
        if isinstance(v, (list, tuple)):
            return [get(x) for x in v]
        if v.name in env:
            return env[v.name]
        if v.val is not None:
            return np.asarray(v.val)
        raise KeyError(f"MIL value {v.name!r} is not computed")

    for op in func.operations:
        if op.op_type == "const":
            env[op.outputs[0].name] = np.asarray(op.outputs[0].val)
            continue
        fn = OPS.get(op.op_type)
        if fn is None:
            raise NotImplementedError(f"mil_eval: op {op.op_type!r} is not implemented")
        args = {k: get(v) for k, v in op.inputs.items()}
        res = fn(**args)
        res = res if isinstance(res, (list, tuple)) else [res]
        for var, val in zip(op.outputs, res):
            dt = _np_dtype(var)
            val = np.asarray(val)
            env[var.name] = val.astype(dt) if dt is not None else val
    return {v.name: env[v.name] for v in func.outputs}


# --- op implementations ---------------------------------------------------------------------


def _f32(x):
    return np.asarray(x, dtype=np.float32)


def _pads(pad_type, pad, in_spatial, kernel, strides, dilations):
    n = len(in_spatial)
    pad_type = str(pad_type)
    if pad_type == "valid":
        return [(0, 0)] * n
    if pad_type == "custom":
        p = [int(v) for v in (pad if pad is not None else [0] * (2 * n))]
        return [(p[2 * i], p[2 * i + 1]) for i in range(n)]
    out = []
    for i in range(n):
        k = (kernel[i] - 1) * dilations[i] + 1
        o = -(-in_spatial[i] // strides[i])
        total = max(0, (o - 1) * strides[i] + k - in_spatial[i])
        if pad_type == "same_lower":
            out.append((total - total // 2, total // 2))
        else:
            out.append((total // 2, total - total // 2))
    return out


def conv(x, weight, bias=None, strides=None, pad_type="valid", pad=None, dilations=None, groups=1):
    x, w = _f32(x), _f32(weight)
    sp = x.ndim - 2
    strides = [int(s) for s in (strides if strides is not None else [1] * sp)]
    dil = [int(d) for d in (dilations if dilations is not None else [1] * sp)]
    groups = int(groups)
    pads = _pads(pad_type, pad, x.shape[2:], w.shape[2:], strides, dil)
    xp = np.pad(x, [(0, 0), (0, 0)] + pads)
    n, c = x.shape[:2]
    cout = w.shape[0]
    out_sp = [(xp.shape[2 + i] - ((w.shape[2 + i] - 1) * dil[i] + 1)) // strides[i] + 1 for i in range(sp)]
    xg = xp.reshape(n, groups, c // groups, *xp.shape[2:])
    wg = w.reshape(groups, cout // groups, c // groups, *w.shape[2:])
    y = np.zeros((n, groups, cout // groups, *out_sp), np.float32)
    for kidx in np.ndindex(*w.shape[2:]):
        sl = tuple(slice(kidx[i] * dil[i], kidx[i] * dil[i] + (out_sp[i] - 1) * strides[i] + 1, strides[i]) for i in range(sp))
        patch = xg[(slice(None), slice(None), slice(None)) + sl]
        wk = wg[(slice(None), slice(None), slice(None)) + kidx]
        y += np.einsum("ngc...,goc->ngo...", patch, wk, optimize=True)
    y = y.reshape(n, cout, *out_sp)
    if bias is not None:
        y += _f32(bias).reshape(1, -1, *([1] * sp))
    return y


def conv_transpose(x, weight, bias=None, pad=None, output_shape=None, pad_type="valid", strides=None, dilations=None, groups=1):
    x, w = _f32(x), _f32(weight)
    sp = x.ndim - 2
    strides = [int(s) for s in (strides if strides is not None else [1] * sp)]
    dil = [int(d) for d in (dilations if dilations is not None else [1] * sp)]
    groups = int(groups)
    n, cin = x.shape[:2]
    cout_g = w.shape[1]
    full = [(x.shape[2 + i] - 1) * strides[i] + (w.shape[2 + i] - 1) * dil[i] + 1 for i in range(sp)]
    y = np.zeros((n, groups, cout_g, *full), np.float32)
    xg = x.reshape(n, groups, cin // groups, *x.shape[2:])
    wg = w.reshape(groups, cin // groups, cout_g, *w.shape[2:])
    for kidx in np.ndindex(*w.shape[2:]):
        contrib = np.einsum("ngc...,gco->ngo...", xg, wg[(slice(None), slice(None), slice(None)) + kidx], optimize=True)
        sl = tuple(slice(kidx[i] * dil[i], kidx[i] * dil[i] + (x.shape[2 + i] - 1) * strides[i] + 1, strides[i]) for i in range(sp))
        y[(slice(None), slice(None), slice(None)) + sl] += contrib
    y = y.reshape(n, groups * cout_g, *full)
    if str(pad_type) == "custom" and pad is not None:
        p = [int(v) for v in pad]
        sl = tuple(slice(p[2 * i], full[i] - p[2 * i + 1]) for i in range(sp))
        y = y[(slice(None), slice(None)) + sl]
    if output_shape is not None:
        target = [int(v) for v in output_shape][-sp:]
        if list(y.shape[2:]) != target:
            pad_after = [(0, 0), (0, 0)] + [(0, max(0, t - s)) for t, s in zip(target, y.shape[2:])]
            y = np.pad(y, pad_after)[(slice(None), slice(None)) + tuple(slice(0, t) for t in target)]
    if bias is not None:
        y = y + _f32(bias).reshape(1, -1, *([1] * sp))
    return y


def _pool(x, kernel_sizes, strides, pad_type, pad, ceil_mode, kind, exclude=True):
    x = _f32(x)
    sp = len(kernel_sizes)
    k = [int(v) for v in kernel_sizes]
    s = [int(v) for v in strides] if strides is not None else [1] * sp
    pads = _pads(pad_type, pad, x.shape[2:], k, s, [1] * sp)
    out = []
    for i in range(sp):
        size = x.shape[2 + i] + pads[i][0] + pads[i][1] - k[i]
        o = (-(-size // s[i]) if bool(ceil_mode) else size // s[i]) + 1
        if bool(ceil_mode) and (o - 1) * s[i] >= x.shape[2 + i] + pads[i][0]:
            o -= 1
        out.append(o)
    extra = [max(0, (out[i] - 1) * s[i] + k[i] - (x.shape[2 + i] + pads[i][0] + pads[i][1])) for i in range(sp)]
    fill = -np.inf if kind == "max" else 0.0
    cfg = [(0, 0), (0, 0)] + [(pads[i][0], pads[i][1] + extra[i]) for i in range(sp)]
    xp = np.pad(x, cfg, constant_values=fill)
    # count of valid (non-padding) elements; with exclude=False, explicit padding counts but ceil overhang does not
    ones = np.pad(np.ones(x.shape[2:], np.float32), [(pads[i][0], pads[i][1] + extra[i]) for i in range(sp)])
    if not exclude:
        ones = np.pad(np.ones([x.shape[2 + i] + pads[i][0] + pads[i][1] for i in range(sp)], np.float32), [(0, e) for e in extra])
    acc = np.full((*x.shape[:2], *out), fill, np.float32)
    cnt = np.zeros(out, np.float32)
    for kidx in np.ndindex(*k):
        sl = tuple(slice(kidx[i], kidx[i] + (out[i] - 1) * s[i] + 1, s[i]) for i in range(sp))
        patch = xp[(slice(None), slice(None)) + sl]
        if kind == "max":
            acc = np.maximum(acc, patch)
        else:
            acc = acc + patch
            cnt += ones[sl]
    if kind == "avg":
        acc = acc / np.maximum(cnt, 1)
    return acc


def max_pool(x, kernel_sizes, strides=None, pad_type="valid", pad=None, ceil_mode=False):
    return _pool(x, kernel_sizes, strides, pad_type, pad, ceil_mode, "max")


def avg_pool(x, kernel_sizes, strides=None, pad_type="valid", pad=None, exclude_padding_from_average=False, ceil_mode=False):
    return _pool(x, kernel_sizes, strides, pad_type, pad, ceil_mode, "avg", bool(exclude_padding_from_average))


def _axes(x, axes):
    return tuple(range(x.ndim)) if axes is None else tuple(int(a) % x.ndim for a in np.atleast_1d(axes))


def _reduce(fn):
    def op(x, axes=None, keep_dims=False):
        return fn(_f32(x), axis=_axes(np.asarray(x), axes), keepdims=bool(keep_dims))

    return op


def linear(x, weight, bias=None):
    y = np.matmul(_f32(x), _f32(weight).T)
    return y if bias is None else y + _f32(bias)


def matmul(x, y, transpose_x=False, transpose_y=False):
    a, b = _f32(x), _f32(y)
    if bool(transpose_x):
        a = np.swapaxes(a, -1, -2)
    if bool(transpose_y):
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def softmax(x, axis=-1):
    x = _f32(x)
    e = np.exp(x - x.max(axis=int(axis), keepdims=True))
    return e / e.sum(axis=int(axis), keepdims=True)


def layer_norm(x, axes=None, gamma=None, beta=None, epsilon=1e-5):
    x = _f32(x)
    ax = _axes(x, axes)
    mean = x.mean(axis=ax, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=ax, keepdims=True)
    y = (x - mean) / np.sqrt(var + float(epsilon))
    if gamma is not None:
        y = y * _f32(gamma)
    if beta is not None:
        y = y + _f32(beta)
    return y


def batch_norm(x, mean, variance, gamma=None, beta=None, epsilon=1e-5):
    x = _f32(x)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - _f32(mean).reshape(shape)) / np.sqrt(_f32(variance).reshape(shape) + float(epsilon))
    if gamma is not None:
        y = y * _f32(gamma).reshape(shape)
    if beta is not None:
        y = y + _f32(beta).reshape(shape)
    return y


def upsample_nearest_neighbor(x, scale_factor_height=1, scale_factor_width=1):
    x = np.asarray(x)
    h, w = x.shape[-2:]
    ho, wo = int(np.floor(h * float(scale_factor_height))), int(np.floor(w * float(scale_factor_width)))
    ri = np.minimum(np.floor(np.arange(ho) / float(scale_factor_height)).astype(int), h - 1)
    ci = np.minimum(np.floor(np.arange(wo) / float(scale_factor_width)).astype(int), w - 1)
    return x[..., ri, :][..., :, ci]


def _grid(xin, xout, align_corners):
    i = np.arange(xout, dtype=np.float64)
    if align_corners:
        spacing = (xin - 1) / (xout - 1) if xout > 1 else 0.0
        g = i * spacing
    else:
        spacing = xin / xout
        g = i * spacing + 0.5 * spacing - 0.5
    return np.clip(g, 0, xin - 1)


def _lerp_axis(x, grid, axis):
    lo = np.floor(grid).astype(int)
    hi = np.minimum(lo + 1, x.shape[axis] - 1)
    f = (grid - lo).astype(np.float32)
    shape = [1] * x.ndim
    shape[axis] = -1
    return np.take(x, lo, axis=axis) * (1 - f.reshape(shape)) + np.take(x, hi, axis=axis) * f.reshape(shape)


def upsample_bilinear(x, scale_factor_height=1, scale_factor_width=1, align_corners=True, half_pixel_centers=None):
    x = _f32(x)
    h, w = x.shape[-2:]
    ho, wo = int(np.floor(h * float(scale_factor_height))), int(np.floor(w * float(scale_factor_width)))
    y = _lerp_axis(x, _grid(h, ho, bool(align_corners)), x.ndim - 2)
    return _lerp_axis(y, _grid(w, wo, bool(align_corners)), x.ndim - 1)


def slice_by_index(x, begin, end, stride=None, begin_mask=None, end_mask=None, squeeze_mask=None):
    x = np.asarray(x)
    stride = stride if stride is not None else [1] * x.ndim
    sl = []
    for i in range(x.ndim):
        b = None if begin_mask is not None and begin_mask[i] else int(begin[i])
        e = None if end_mask is not None and end_mask[i] else int(end[i])
        sl.append(slice(b, e, int(stride[i])))
    y = x[tuple(sl)]
    if squeeze_mask is not None and any(squeeze_mask):
        y = np.squeeze(y, axis=tuple(i for i, m in enumerate(squeeze_mask) if m))
    return y


def split(x, num_splits=None, split_sizes=None, axis=0):
    x = np.asarray(x)
    if split_sizes is not None:
        idx = np.cumsum([int(s) for s in split_sizes])[:-1]
    else:
        idx = int(num_splits)
    return np.split(x, idx, axis=int(axis))


def _sigmoid(x):
    with np.errstate(over="ignore"):  # (exp of a large -x is inf: the sigmoid is 0 there, as it should be)
        return 1.0 / (1.0 + np.exp(-_f32(x)))


def clip(x, alpha, beta):
    return np.clip(_f32(x), float(alpha), float(beta))


def gelu(x, mode="EXACT"):
    x = _f32(x)
    if str(mode) == "TANH_APPROXIMATION":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    if str(mode) == "SIGMOID_APPROXIMATION":
        return x * _sigmoid(1.702 * x)
    return 0.5 * x * (1 + _erf_np(x / np.sqrt(2.0)))


def cast(x, dtype):
    return np.asarray(x).astype({"fp16": np.float16, "fp32": np.float32, "int32": np.int32, "bool": np.bool_}[str(dtype)])


def gather(x, indices, axis=0, batch_dims=0, validate_indices=False):
    """MIL gather: slices of ``x`` along ``axis`` at ``indices`` (any rank; negative counts from the end)."""
    x = np.asarray(x)
    axis = int(axis) % x.ndim
    idx = np.asarray(indices).astype(np.int64)
    if int(batch_dims):
        raise NotImplementedError("mil_eval: gather with batch_dims")
    if idx.size and (idx.min() < -x.shape[axis] or idx.max() >= x.shape[axis]):
        raise IndexError(f"gather index out of [-{x.shape[axis]}, {x.shape[axis]})")
    return np.take(x, np.where(idx < 0, idx + x.shape[axis], idx), axis=axis)


def pad(x, pad, mode="constant", constant_val=0.0):
    """MIL pad: ``pad = [b0, e0, b1, e1, ...]`` for the last len(pad)/2 axes; replicate = numpy's edge."""
    x = np.asarray(x)
    p = [int(v) for v in np.asarray(pad).reshape(-1)]
    n = len(p) // 2
    width = [(0, 0)] * (x.ndim - n) + [(p[2 * i], p[2 * i + 1]) for i in range(n)]
    mode = str(mode)
    if mode == "constant":
        return np.pad(x, width, mode="constant", constant_values=float(constant_val))
    if mode == "reflect":
        if any(max(w) > x.shape[a] - 1 for a, w in enumerate(width)):
            raise ValueError("reflect pad wider than its axis minus one")
        return np.pad(x, width, mode="reflect")
    if mode == "replicate":
        return np.pad(x, width, mode="edge")
    raise ValueError(f"pad mode {mode!r}")


_RNN_ACT = {
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "relu": lambda v: np.maximum(v, 0),
    "linear": lambda v: v,
}


def _lstm_dir(x, h, c, w_ih, w_hh, b, order, acts):
    """One direction of MIL lstm over the time steps ``order``; gate rows [input, forget, output, cell]."""
    rec, cell_act, out_act = acts
    H = h.shape[-1]
    ys = []
    for t in order:
        g = x[t] @ w_ih.T + h @ w_hh.T + b
        i, f, o, z = (g[:, k * H:(k + 1) * H] for k in range(4))
        c = rec(f) * c + rec(i) * cell_act(z)
        h = rec(o) * out_act(c)
        ys.append(h)
    return ys, h, c


def lstm(x, initial_h, initial_c, weight_ih, weight_hh, bias=None, peephole=None, weight_ih_back=None,
         weight_hh_back=None, bias_back=None, peephole_back=None, direction="forward", output_sequence=False,
         recurrent_activation="sigmoid", cell_activation="tanh", activation="tanh", clip=None):
    """MIL lstm, x ``[s, b, I]``, states ``[b, DIRECTIONS*H]``, returns (y, h_final, c_final).

    Output time order (as coremltools' backend tests define it, its doc being silent): "forward" and
    the forward half of "bidirectional" step t at index t; "reverse" emits its steps in processing
    order (index 0 = last time step); the backward half of "bidirectional" sits at the time step it
    was computed for (index t = time t).
    """
    if peephole is not None and np.any(peephole) or clip is not None:
        raise NotImplementedError("mil_eval: lstm with peepholes or clip")
    x = _f32(x)
    s = x.shape[0]
    acts = tuple(_RNN_ACT[str(a)] for a in (recurrent_activation, cell_activation, activation))
    w_ih, w_hh = _f32(weight_ih), _f32(weight_hh)
    H = w_hh.shape[1]
    b = _f32(bias) if bias is not None else np.zeros(4 * H, np.float32)
    h0, c0 = _f32(initial_h), _f32(initial_c)
    direction = str(direction)
    if direction == "bidirectional":
        yf, hf, cf = _lstm_dir(x, h0[:, :H], c0[:, :H], w_ih, w_hh, b, range(s), acts)
        bb = _f32(bias_back) if bias_back is not None else np.zeros(4 * H, np.float32)
        yb, hb, cb = _lstm_dir(x, h0[:, H:], c0[:, H:], _f32(weight_ih_back), _f32(weight_hh_back), bb,
                               range(s - 1, -1, -1), acts)
        yb = yb[::-1]  # aligned with the input's time steps
        y = np.stack([np.concatenate([f, r], axis=-1) for f, r in zip(yf, yb)])
        h, c = np.concatenate([hf, hb], -1), np.concatenate([cf, cb], -1)
        last = np.concatenate([yf[-1], yb[0]], -1)[None]
    else:
        order = range(s) if direction == "forward" else range(s - 1, -1, -1)
        ys, h, c = _lstm_dir(x, h0, c0, w_ih, w_hh, b, order, acts)
        y = np.stack(ys)  # processing order
        last = ys[-1][None]
    return (y if bool(output_sequence) else last), h, c


def gru(x, initial_h, weight_ih, weight_hh, bias=None, direction="forward", output_sequence=False,
        recurrent_activation="sigmoid", activation="tanh"):
    """MIL gru, x ``[s, b, I]``, gate rows [reset, new ("output"), update], one bias per gate.

    The new gate resets h before the recurrent matmul, o = act(W_o x + W_ho (r * h) + b_o): the formula
    coremltools' backend tests check the device against (the op doc's "r_t * W_ho h_{t-1}" reads
    otherwise; the tested behaviour is the one taken).  "reverse" emits its steps in processing order.
    """
    x = _f32(x)
    rec, act = _RNN_ACT[str(recurrent_activation)], _RNN_ACT[str(activation)]
    w_ih, w_hh = _f32(weight_ih), _f32(weight_hh)
    H = w_hh.shape[1]
    b = _f32(bias) if bias is not None else np.zeros(3 * H, np.float32)
    wr, wo, wz = (w_ih[k * H:(k + 1) * H] for k in range(3))
    rr, ro, rz = (w_hh[k * H:(k + 1) * H] for k in range(3))
    br, bo, bz = (b[k * H:(k + 1) * H] for k in range(3))
    h = _f32(initial_h)
    order = range(x.shape[0]) if str(direction) == "forward" else range(x.shape[0] - 1, -1, -1)
    ys = []
    for t in order:
        r = rec(x[t] @ wr.T + h @ rr.T + br)
        z = rec(x[t] @ wz.T + h @ rz.T + bz)
        o = act(x[t] @ wo.T + (r * h) @ ro.T + bo)
        h = (1 - z) * o + z * h
        ys.append(h)
    y = np.stack(ys)
    return (y if bool(output_sequence) else y[-1:]), h


def instance_norm(x, gamma=None, beta=None, epsilon=1e-5):
    """MIL instance_norm: per (batch, channel), normalised over the spatial axes; gamma / beta per channel."""
    x = _f32(x)
    ax = tuple(range(2, x.ndim))
    mean = x.mean(axis=ax, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=ax, keepdims=True)
    y = (x - mean) / np.sqrt(var + float(epsilon))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if gamma is not None:
        y = y * _f32(gamma).reshape(shape)
    if beta is not None:
        y = y + _f32(beta).reshape(shape)
    return y


def local_response_norm(x, size, alpha=1e-4, beta=0.75, k=1.0):
    """MIL local_response_norm: x / (k + alpha / size * sum of x^2 over ``size`` channels centred on
    each)^beta, the window clipped at the first and last channel (odd ``size``: the lowering's only)."""
    x = _f32(x)
    size = int(size)
    sq = np.square(x)
    c = x.shape[1]
    total = np.zeros_like(x)
    for j in range(c):
        lo, hi = max(0, j - (size - 1) // 2), min(c - 1, j + size // 2)
        total[:, j] = sq[:, lo:hi + 1].sum(axis=1)
    return x / np.power(float(k) + float(alpha) / size * total, float(beta))


def select(cond, a, b):
    """MIL select: ``a`` where ``cond`` (bool) else ``b``, broadcast."""
    return np.where(np.asarray(cond, bool), a, b)


def reverse(x, axes=None):
    x = np.asarray(x)
    return np.flip(x, axis=None if axes is None else tuple(int(a) for a in np.atleast_1d(axes)))


OPS = {
    "conv": conv,
    "conv_transpose": conv_transpose,
    "max_pool": max_pool,
    "avg_pool": avg_pool,
    "linear": linear,
    "matmul": matmul,
    "add": lambda x, y: np.add(x, y),
    "sub": lambda x, y: np.subtract(x, y),
    "mul": lambda x, y: np.multiply(x, y),
    "real_div": lambda x, y: np.divide(_f32(x), y),
    "maximum": lambda x, y: np.maximum(x, y),
    "minimum": lambda x, y: np.minimum(x, y),
    "pow": lambda x, y: np.power(_f32(x), y),
    "relu": lambda x: np.maximum(x, 0),
    "relu6": lambda x: np.clip(x, 0, 6),
    "clip": clip,
    "sigmoid": _sigmoid,
    "sigmoid_hard": lambda x, alpha=0.2, beta=0.5: np.clip(float(alpha) * _f32(x) + float(beta), 0, 1),
    "tanh": lambda x: np.tanh(_f32(x)),
    "silu": lambda x: _f32(x) * _sigmoid(x),
    "gelu": gelu,
    "leaky_relu": lambda x, alpha=0.01: np.where(_f32(x) >= 0, x, float(alpha) * _f32(x)),
    "exp": lambda x: np.exp(_f32(x)),
    "log": lambda x, epsilon=0.0: np.log(_f32(x) + float(epsilon)),
    "sqrt": lambda x: np.sqrt(_f32(x)),
    "rsqrt": lambda x, epsilon=0.0: 1.0 / np.sqrt(_f32(x) + float(epsilon)),
    "inverse": lambda x, epsilon=0.0: 1.0 / (_f32(x) + float(epsilon)),
    "abs": lambda x: np.abs(x),
    "erf": lambda x: _erf_np(_f32(x)),
    "floor": lambda x: np.floor(x),
    "ceil": lambda x: np.ceil(x),
    "softplus": lambda x: np.log1p(np.exp(_f32(x))),
    "identity": lambda x: np.asarray(x),
    "square": lambda x: np.square(_f32(x)),
    "reduce_mean": _reduce(np.mean),
    "reduce_sum": _reduce(np.sum),
    "reduce_max": _reduce(np.max),
    "reduce_min": _reduce(np.min),
    "concat": lambda values, axis, interleave=False: np.concatenate([np.asarray(v) for v in values], axis=int(axis)),
    "reshape": lambda x, shape: np.reshape(x, [int(d) for d in shape]),
    "transpose": lambda x, perm: np.transpose(x, [int(p) for p in perm]),
    "expand_dims": lambda x, axes: np.expand_dims(x, tuple(int(a) for a in axes)),
    "squeeze": lambda x, axes=None: np.squeeze(x, axis=None if axes is None else tuple(int(a) for a in axes)),
    "softmax": softmax,
    "layer_norm": layer_norm,
    "batch_norm": batch_norm,
    "upsample_nearest_neighbor": upsample_nearest_neighbor,
    "upsample_bilinear": upsample_bilinear,
    "slice_by_index": slice_by_index,
    "split": split,
    "cast": cast,
    "gather": gather,
    "pad": pad,
    "lstm": lstm,
    "gru": gru,
    "reverse": reverse,
    # comparisons (fp16 / fp32 / int32 in, bool out) and bool logic
    "equal": lambda x, y: np.equal(x, y),
    "not_equal": lambda x, y: np.not_equal(x, y),
    "less": lambda x, y: np.less(x, y),
    "less_equal": lambda x, y: np.less_equal(x, y),
    "greater": lambda x, y: np.greater(x, y),
    "greater_equal": lambda x, y: np.greater_equal(x, y),
    "logical_and": lambda x, y: np.logical_and(x, y),
    "logical_or": lambda x, y: np.logical_or(x, y),
    "logical_xor": lambda x, y: np.logical_xor(x, y),
    "logical_not": lambda x: np.logical_not(x),
    "select": select,
    "instance_norm": instance_norm,
    "local_response_norm": local_response_norm,
}
