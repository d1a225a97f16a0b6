"""Transformer building blocks: Attention (opset 23+), RotaryEmbedding, RMSNormalization.
"""
from __future__ import annotations

import math

import numpy as np

from minirt._compat import scalar
from minirt.dtypes import ONNX_TO_NUMPY
from minirt.kernels.registry import kernel


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row that is entirely -inf gives zeros."""
    m = np.max(x, axis=-1, keepdims=True)
    dead = ~np.isfinite(m)
    # Scalars of the array's own type, not Python ints: numpy 1.x turns 0 into
    # int64, which has no common type with ml_dtypes' bfloat16 (minirt/_compat.py).
    zero, one = scalar(x.dtype, 0), scalar(x.dtype, 1)
    e = np.exp(x - np.where(dead, zero, m))
    s = np.sum(e, axis=-1, keepdims=True)
    out = e / np.where(s == 0, one, s)
    return np.where(dead, zero, out)


@kernel("Attention", since=23, context=True)
def attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
              is_causal=0, kv_num_heads=0, q_num_heads=0, qk_matmul_output_mode=0, scale=None, softcap=0.0,
              softmax_precision=0, left_window_size=-1, right_window_size=-1, ctx=None):
    dtype = Q.dtype
    three_d = Q.ndim == 3
    if three_d:
        b, sq, _ = Q.shape
        Q = Q.reshape(b, sq, q_num_heads, -1).transpose(0, 2, 1, 3)
        K = K.reshape(K.shape[0], K.shape[1], kv_num_heads, -1).transpose(0, 2, 1, 3)
        V = V.reshape(V.shape[0], V.shape[1], kv_num_heads, -1).transpose(0, 2, 1, 3)
    batch, qh, sq, hd = Q.shape
    kvh = K.shape[1]
    past_len = 0
    if past_key is not None:
        past_len = past_key.shape[2]
        K = np.concatenate([past_key, K], axis=2)
    if past_value is not None:
        V = np.concatenate([past_value, V], axis=2)
    present_k, present_v = K, V
    total = K.shape[2]
    if qh != kvh:
        K = np.repeat(K, qh // kvh, axis=1)
        V = np.repeat(V, qh // kvh, axis=1)
    s = (1.0 / math.sqrt(hd)) if scale is None else float(scale)
    rs = dtype.type(math.sqrt(s))
    qk = np.matmul(Q * rs, np.swapaxes(K * rs, -1, -2))
    qk_raw = qk
    if softcap and softcap > 0:
        c = dtype.type(softcap)
        qk = c * np.tanh(qk / c)
    qk_capped = qk

    # allowed-key set from causality, windows and padding: [batch, 1, sq, total]
    allowed = np.ones((batch, 1, sq, total), dtype=bool)
    if nonpad_kv_seqlen is not None and past_key is None:
        offset = np.asarray(nonpad_kv_seqlen).astype(np.int64) - sq
    else:
        offset = np.full(batch, past_len, np.int64)
    i = np.arange(sq)[None, :, None]
    j = np.arange(total)[None, None, :]
    p = offset[:, None, None] + i
    if is_causal:
        allowed &= (j <= p)[:, None]
    if left_window_size is not None and left_window_size >= 0:
        allowed &= (j >= p - left_window_size)[:, None]
    if right_window_size is not None and right_window_size >= 0:
        allowed &= (j <= p + right_window_size)[:, None]
    if nonpad_kv_seqlen is not None:
        allowed &= (j < np.asarray(nonpad_kv_seqlen).astype(np.int64)[:, None, None])[:, None]
    bias = np.where(allowed, dtype.type(0), dtype.type(-np.inf)).astype(dtype)
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.shape[-1] < total:
            pad = [(0, 0)] * (m.ndim - 1) + [(0, total - m.shape[-1])]
            m = np.pad(m, pad, constant_values=False if m.dtype == bool else -np.inf)
        if m.dtype == bool:
            bias = bias + np.where(m, dtype.type(0), dtype.type(-np.inf)).astype(dtype)
        else:
            bias = bias + m.astype(dtype)
    qk = qk + bias
    qk_biased = qk
    sm_dtype = ONNX_TO_NUMPY.get(int(softmax_precision)) if softmax_precision else dtype
    probs = _softmax_rows(qk.astype(sm_dtype)).astype(dtype)
    y = np.matmul(probs, V).astype(dtype)
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(batch, sq, -1)
    qk_out = (qk_raw, qk_capped, qk_biased, probs)[int(qk_matmul_output_mode)]
    outs = (y, present_k, present_v, qk_out.astype(dtype))
    return outs[: ctx.n_outputs]


def rotate_pairs(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """RoPE of x [..., S, H, D] with cos/sin [..., S, 1, R/2] broadcasting over heads; the first R
    features rotate, the rest pass through.  Non-interleaved pairs feature i with i + R/2;
    interleaved pairs 2i with 2i + 1:  (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos).  (ONNX's
    RotaryEmbedding and com.microsoft's RotaryEmbedding / GroupQueryAttention rotate with it.)"""
    r = 2 * cos.shape[-1]
    if r > x.shape[-1]:
        raise ValueError(f"rotary: cos/sin caches of width {cos.shape[-1]} rotate {r} features, more than the "
                         f"head size {x.shape[-1]}")
    rot = x[..., :r]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot[..., : r // 2], rot[..., r // 2:]
    real = x1 * cos - x2 * sin
    imag = x1 * sin + x2 * cos
    out = np.empty_like(x)  # (cos / sin share x's leading dimensions; results rounded to x's type once)
    if interleaved:
        out[..., 0:r:2] = real
        out[..., 1:r:2] = imag
    else:
        out[..., : r // 2] = real
        out[..., r // 2: r] = imag
    out[..., r:] = x[..., r:]
    return out


@kernel("RotaryEmbedding", since=23)
def rotary_embedding(X, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=0,
                     rotary_embedding_dim=0):
    four_d = X.ndim == 4
    if four_d:
        x = X.transpose(0, 2, 1, 3)  # [B, S, H, D]
    else:
        b, s, hidden = X.shape
        x = X.reshape(b, s, num_heads, hidden // num_heads)
    d = x.shape[-1]
    rd = int(rotary_embedding_dim) if rotary_embedding_dim else d
    if position_ids is not None:
        cos = cos_cache[position_ids]
        sin = sin_cache[position_ids]
    else:
        cos, sin = cos_cache, sin_cache
    y = rotate_pairs(x, cos[..., : rd // 2][:, :, None, :], sin[..., : rd // 2][:, :, None, :],
                     bool(interleaved)).astype(X.dtype)
    if four_d:
        return y.transpose(0, 2, 1, 3)
    return y.reshape(X.shape)


@kernel("RMSNormalization", since=23)
def rms_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    ax = axis + X.ndim if axis < 0 else axis
    axes = tuple(range(ax, X.ndim))
    ct = ONNX_TO_NUMPY.get(int(stash_type), np.dtype(np.float32))
    x = X.astype(ct)
    rms = np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + ct.type(epsilon))
    return ((x / rms) * scale.astype(ct)).astype(X.dtype)
