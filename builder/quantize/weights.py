"""Weight quantization: per-channel symmetric int8, activation parameters, fp16.

int8 weights are symmetric (zero point 0) with one scale per output channel::

    scale[c] = max|w[c]| / 127      (1.0 for an all-zero channel)
    q[c]     = clip(rint(w[c] / scale[c]), -127, 127)

-128 is never used, so negating a weight never overflows and a 7-bit-safe
variant (``reduce_range``: +-63, for CPUs whose int8 dot product saturates in
16 bits, e.g. AVX2 ``vpmaddubsw``) is one option away.  Where the target's
int8 GEMM is that instruction (AVX2 without VNNI), the builder keeps 8 bits and
limits pairs instead (``limit_pair_sums``): the two weights the kernel multiplies
side by side have |w0| + |w1| <= 128, so the pair of u8 x s8 products fits int16.

Activations are per tensor: asymmetric uint8 over the calibrated [lo, hi]
widened to include 0 (so zero padding is exact), or symmetric int8 with
``symmetric=True``.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.vocabulary import MINIRT_DOMAIN

FP16_MAX = float(np.finfo(np.float16).max)


def quantize_per_channel(w: np.ndarray, axis: int = 0, reduce_range: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantization of ``w`` with one scale per index of ``axis``."""
    w = np.asarray(w, dtype=np.float32)
    qmax = 63.0 if reduce_range else 127.0
    axis = axis % w.ndim if w.ndim else 0
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis] if w.ndim else 1, -1)
    amax = np.max(np.abs(moved), axis=1) if moved.size else np.zeros(moved.shape[0], np.float32)
    scale = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
    shape = [1] * w.ndim
    if w.ndim:
        shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -qmax, qmax).astype(np.int8)
    return q, scale


# The largest |w0| + |w1| of two int8 weights the int8 GEMM multiplies side by side on AVX2 without VNNI
# (vpmaddubsw adds the two u8 x s8 products into an int16: 255 x 128 = 32640 fits, 255 x 129 does not)
PAIR_LIMIT = 128


def limit_pair_sums(q: np.ndarray, axis: int) -> np.ndarray:
    """``q`` (int8) with every pair of entries 2j, 2j + 1 along ``axis`` brought to |a| + |b| <= PAIR_LIMIT
    (an odd last entry pairs with the kernels' zero padding: |w| <= 128 always fits): the excess is taken
    off both magnitudes, half each (the larger one loses the odd unit), which is the least squared change
    that meets the bound.  Random-normal weights at 8 bits have a few pairs in 100 over it (D172); only
    those are touched (``q`` itself comes back when none is)."""
    q = np.asarray(q, np.int8)
    moved = np.moveaxis(q, axis, -1)
    k = moved.shape[-1] // 2 * 2
    rows = moved.reshape(-1, moved.shape[-1])
    mag_a = np.abs(rows[:, 0:k:2].astype(np.int16))
    mag_b = np.abs(rows[:, 1:k:2].astype(np.int16))
    over_r, over_j = np.nonzero(mag_a + mag_b > PAIR_LIMIT)
    if not over_r.size:
        return q
    ma, mb = mag_a[over_r, over_j], mag_b[over_r, over_j]
    excess = ma + mb - PAIR_LIMIT
    cut_a = excess // 2 + np.where(ma >= mb, excess % 2, 0)
    rows = rows.copy()
    cols_a = 2 * over_j
    a, b = rows[over_r, cols_a].astype(np.int16), rows[over_r, cols_a + 1].astype(np.int16)
    rows[over_r, cols_a] = (np.sign(a) * (ma - cut_a)).astype(np.int8)
    rows[over_r, cols_a + 1] = (np.sign(b) * (mb - (excess - cut_a))).astype(np.int8)
    return np.moveaxis(rows.reshape(moved.shape), -1, axis)


def limit_conv_pair_sums(q: np.ndarray, group: int) -> np.ndarray:
    """A conv weight (M, C / group, kh, kw) limited for both orders the int8 conv kernels read: a packed
    row (C / group x kh x kw flattened, the im2col GEMMs) and, for one group with a window, channels 2i,
    2i + 1 of a tap (the implicit conv's tap order).  Both bounds only shrink magnitudes, so the second
    keeps the first."""
    m = q.shape[0]
    q = limit_pair_sums(q.reshape(m, -1), 1).reshape(q.shape)
    if group == 1 and q.ndim > 2 and int(np.prod(q.shape[2:])) > 1:
        q = limit_pair_sums(q, 1)
    return q


def quantize_pair_limited(w: np.ndarray, axis: int, limit) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-channel int8 (one scale per index of ``axis``) whose pairs meet PAIR_LIMIT, as
    ``limit(q)`` (limit_pair_sums or limit_conv_pair_sums, bound to the layer's layout) makes them: per
    channel, the scale max|w| / qmax for the qmax in [63, 127] whose limited weights have the least
    squared error (63: no pair can exceed the limit; 127: full resolution, most pairs cut).  Found on a
    coarse grid, then refined around its best; random-normal 3 x 3 convs land near 85, with half the
    squared error of 7-bit weights (D172)."""
    w = np.asarray(w, dtype=np.float32)
    axis = axis % w.ndim
    moved = np.moveaxis(w, axis, 0)
    rows = moved.reshape(moved.shape[0], -1)
    amax = np.max(np.abs(rows), axis=1)
    channel = (slice(None),) + (None,) * (w.ndim - 1)
    best_q = best_s = None
    best_err = np.full(amax.shape, np.inf)

    def attempt(qmax: np.ndarray) -> None:
        nonlocal best_q, best_s
        s = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
        q = np.moveaxis(limit(np.moveaxis(np.clip(np.rint(moved / s[channel]), -127, 127).astype(np.int8), 0, axis)),
                        axis, 0)
        err = np.square(q.reshape(rows.shape) * s[:, None] - rows).sum(axis=1)
        if best_q is None:
            best_q, best_s, best_err[:] = q.copy(), s, err
            return
        better = err < best_err
        best_q[better], best_s[better], best_err[better] = q[better], s[better], err[better]

    for qmax in range(63, 128, 16):
        attempt(np.full(amax.shape, float(qmax), np.float32))
    coarse = np.where(best_s > 0, amax / best_s, 63.0).round()
    for step in (-12, -8, -4, -2, -1, 1, 2, 4, 8, 12):
        attempt(np.clip(coarse + step, 63, 127).astype(np.float32))
    return np.moveaxis(best_q, 0, axis), best_s.astype(np.float32)


def activation_params(lo: float, hi: float, symmetric: bool = False) -> tuple[np.float32, np.ndarray]:
    """(scale, zero point) for an activation range; the zero point's dtype is uint8 or int8."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if symmetric:
        amax = max(abs(lo), abs(hi))
        scale = np.float32(amax / 127.0) if amax > 0 else np.float32(1.0)
        return scale, np.array(0, dtype=np.int8)
    scale = np.float32((hi - lo) / 255.0)
    if scale == 0 or not np.isfinite(scale):
        return np.float32(1.0), np.array(0, dtype=np.uint8)
    zp = np.uint8(np.clip(np.rint(-lo / float(scale)), 0, 255))
    return scale, np.array(zp, dtype=np.uint8)


def activation_params_per_channel(lo: np.ndarray, hi: np.ndarray, symmetric: bool = False):
    """Vector form of :func:`activation_params` (depthwise convolution inputs, one pair per channel)."""
    pairs = [activation_params(a, b, symmetric) for a, b in zip(np.asarray(lo).reshape(-1), np.asarray(hi).reshape(-1))]
    scales = np.array([p[0] for p in pairs], dtype=np.float32)
    zps = np.array([p[1] for p in pairs], dtype=np.int8 if symmetric else np.uint8)
    return scales, zps


def fp16_candidates(model: ir.Model, min_elements: int = 1024) -> list[str]:
    """Names of the float32 initializers :func:`convert_to_fp16` would convert."""
    out = []
    for graph in model.graphs():  # (If / Loop / Scan bodies hold weights of their own too: D95)
        for name, value in graph.initializers.items():
            t = value.const_value
            if t is None or value.dtype != ir.DataType.FLOAT or not value.uses() or value in graph.inputs:
                continue
            if t.size >= min_elements and name not in out:
                out.append(name)
    return out


def convert_to_fp16(model: ir.Model, min_elements: int = 1024, only=None) -> dict:
    """Store float32 initializers of at least ``min_elements`` as float16 + a conversion back to float32.

    The conversion is ``com.minirt::DequantizeWeights``, which the runtime runs
    once per loaded weight (a Cast would run on every call).  Kernels then
    compute in float32 on the CPU while the artifact holds half the bytes.  Small tensors (biases, depthwise filters below
    ``min_elements``) stay float32: they weigh little and some models are
    surprisingly sensitive to them.  ``only`` restricts the conversion to
    those initializer names (the accuracy budget uses it).  A tensor whose values
    are all small is stored times a power of two (see :func:`_fp16_exponent`) with
    the inverse as DequantizeWeights' scale.  Tensors with values beyond float16's range (|x| > 65504) stay
    float32.  Returns counts for the report.  An If / Loop / Scan body's own initializers are converted
    in the body (D95).  Must run after the optimizer: constant folding would fold the
    Casts straight back.
    """
    counts = {"initializers": 0, "kept_float32_out_of_range": 0, "bytes_before": 0, "bytes_after": 0, "rescaled": 0}
    for graph in list(model.graphs()):
        for k, v in _convert_graph_to_fp16(graph, min_elements, only).items():
            counts[k] += v
    if counts["initializers"]:
        model.opset_imports.setdefault(MINIRT_DOMAIN, 1)
    return counts


def _convert_graph_to_fp16(graph: ir.Graph, min_elements: int, only) -> dict:
    """:func:`convert_to_fp16` over one graph's own initializers."""
    converted, kept_range, bytes_before, bytes_after, rescaled = 0, 0, 0, 0, 0
    first = next(iter(graph), None)
    for name, value in list(graph.initializers.items()):
        tensor = value.const_value
        if tensor is None or value.dtype != ir.DataType.FLOAT or value in graph.inputs:
            continue
        if only is not None and name not in only:
            continue
        arr = tensor.numpy()
        if arr.size < min_elements:
            continue
        if not value.uses():
            continue
        if np.any(np.abs(arr[np.isfinite(arr)]) > FP16_MAX):
            kept_range += 1
            continue
        exp = _fp16_exponent(arr)
        stored = arr if exp == 0 else arr * np.float32(2.0 ** exp)  # exact: a power of two
        half = ir.Value(name=f"{name}_fp16", shape=ir.Shape(arr.shape), type=ir.TensorType(ir.DataType.FLOAT16),
                        const_value=ir.tensor(stored.astype(np.float16), name=f"{name}_fp16"))
        graph.register_initializer(half)
        inputs = [half]
        if exp:
            scale = np.array(2.0 ** -exp, dtype=np.float32)
            sv = ir.Value(name=f"{name}_fp16_scale", shape=ir.Shape(()), type=ir.TensorType(ir.DataType.FLOAT),
                          const_value=ir.tensor(scale, name=f"{name}_fp16_scale"))
            graph.register_initializer(sv)
            inputs.append(sv)
            rescaled += 1
        # com.minirt::DequantizeWeights, not a Cast: the runtime converts each weight once and
        # reuses the float32 copy, where a Cast would run on every call.
        cast = ir.Node(MINIRT_DOMAIN, "DequantizeWeights", inputs, name=f"{name}_to_fp32", num_outputs=1)
        out = cast.outputs[0]
        out.name = f"{name}_fp32"
        out.dtype = ir.DataType.FLOAT
        out.shape = ir.Shape(arr.shape)
        # Move every use of the float32 initializer (graph outputs too) to the cast.
        value.replace_all_uses_with(out, replace_graph_outputs=True)
        if first is not None:
            graph.insert_before(first, cast)
        else:
            graph.append(cast)
        graph.initializers.pop(name)
        converted += 1
        bytes_before += arr.nbytes
        bytes_after += arr.size * 2
    return {"initializers": converted, "kept_float32_out_of_range": kept_range, "bytes_before": bytes_before,
            "bytes_after": bytes_after, "rescaled": rescaled}


def _fp16_exponent(arr: np.ndarray) -> int:
    """k such that ``arr * 2**k`` has its largest magnitude in [1, 2): small weights (BatchNorm folded
    into a conv can leave a whole tensor below float16's normal range, 6.1e-5, where float16 keeps
    fewer significant bits) are stored scaled by a power of two, which costs no precision.  0 for
    tensors whose largest magnitude is already >= 2**-4."""
    finite = np.abs(arr[np.isfinite(arr)])
    amax = float(finite.max()) if finite.size else 0.0
    if amax == 0.0 or amax >= 2.0 ** -4:
        return 0
    return int(-np.floor(np.log2(amax)))
