"""Stateful sequence-model kernels: LinearAttention and CausalConvWithState (opset 27).

Both carry a recurrent state across calls (``past_state`` in,
``present_state`` out) so a decoder can run token by token.
CausalConvWithState is a depthwise 1-D convolution over the state-prefixed
sequence, one vectorised multiply-add per kernel tap.  LinearAttention runs
its recurrence token by token (the loop is over the sequence length T only;
batch, heads and the d_k x d_v state are vectorised), which is exactly the
semantics the spec defines; float16 is computed in float32.
"""
from __future__ import annotations

import math

import numpy as np

from minirt.kernels import _narrow
from minirt.kernels.registry import kernel


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# --------------------------------------------------------------------------- CausalConvWithState


@kernel("CausalConvWithState", since=27)
def causal_conv_with_state(x, weight, bias=None, past_state=None, /, *, activation="none"):
    act = _text(activation)
    if act not in ("none", "silu", "swish"):
        raise ValueError(f"CausalConvWithState: activation must be 'none', 'silu' or 'swish', got {act!r}")
    x, weight = np.asarray(x), np.asarray(weight)
    if x.ndim != 3:
        raise ValueError(f"CausalConvWithState: input must be (batch, channels, length), got {x.shape}")
    b, c, length = x.shape
    if weight.ndim != 3 or weight.shape[:2] != (c, 1):
        raise ValueError(f"CausalConvWithState: weight must be ({c}, 1, k), got {weight.shape}")
    k = weight.shape[2]
    cdt = _compute_dtype(x.dtype)
    xc = _narrow.widen(x).astype(cdt, copy=False)
    if past_state is None:
        past = np.zeros((b, c, k - 1), dtype=cdt)
    else:
        past = _narrow.widen(np.asarray(past_state)).astype(cdt, copy=False)
        if past.shape != (b, c, k - 1):
            raise ValueError(f"CausalConvWithState: past_state must be {(b, c, k - 1)}, got {past.shape}")
    seq = np.concatenate([past, xc], axis=2)  # (B, C, k - 1 + L)
    w = _narrow.widen(weight).astype(cdt, copy=False)[:, 0, :]  # (C, k)
    y = np.zeros((b, c, length), dtype=cdt)
    for j in range(k):
        y += seq[:, :, j:j + length] * w[None, :, j:j + 1]
    if bias is not None:
        y += _narrow.widen(np.asarray(bias)).astype(cdt).reshape(1, c, 1)
    if act != "none":  # silu == swish: y * sigmoid(y)
        y = y / (1 + np.exp(-y))
    present = seq[:, :, seq.shape[2] - (k - 1):]
    return y.astype(x.dtype), present.astype(x.dtype)


# --------------------------------------------------------------------------- LinearAttention

_RULES = ("linear", "gated", "delta", "gated_delta")


@kernel("LinearAttention", since=27)
def linear_attention(query, key, value, past_state=None, decay=None, beta=None, /, *, chunk_size=64,
                     kv_num_heads=None, q_num_heads=None, scale=0.0, update_rule="gated_delta"):
    rule = _text(update_rule)
    if rule not in _RULES:
        raise ValueError(f"LinearAttention: update_rule must be one of {_RULES}, got {rule!r}")
    if not kv_num_heads or not q_num_heads:
        raise ValueError("LinearAttention: q_num_heads and kv_num_heads are required")
    hq, hkv = int(q_num_heads), int(kv_num_heads)
    if hq % hkv:
        raise ValueError(f"LinearAttention: q_num_heads {hq} must be a multiple of kv_num_heads {hkv}")
    q, k, v = np.asarray(query), np.asarray(key), np.asarray(value)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError("LinearAttention: query, key and value must be 3-D (B, T, H * D)")
    bsz, t_len = q.shape[:2]
    if q.shape[2] % hq or k.shape[2] % hkv or v.shape[2] % hkv:
        raise ValueError("LinearAttention: packed head dimensions do not divide by the head counts")
    dk, dv = q.shape[2] // hq, v.shape[2] // hkv
    if k.shape != (bsz, t_len, hkv * dk):
        raise ValueError(f"LinearAttention: key shape {k.shape} must be {(bsz, t_len, hkv * dk)}")
    if rule in ("gated", "gated_delta") and decay is None:
        raise ValueError(f"LinearAttention: update_rule {rule!r} needs the decay input")
    if rule in ("delta", "gated_delta") and beta is None:
        raise ValueError(f"LinearAttention: update_rule {rule!r} needs the beta input")
    cdt = _compute_dtype(q.dtype)

    def f(a):
        return _narrow.widen(np.asarray(a)).astype(cdt, copy=False)

    qh = f(q).reshape(bsz, t_len, hq, dk)
    kh = f(k).reshape(bsz, t_len, hkv, dk)
    vh = f(v).reshape(bsz, t_len, hkv, dv)
    if past_state is None:
        state = np.zeros((bsz, hkv, dk, dv), dtype=cdt)
    else:
        state = f(past_state).copy()
        if state.shape != (bsz, hkv, dk, dv):
            raise ValueError(f"LinearAttention: past_state must be {(bsz, hkv, dk, dv)}, got {state.shape}")
    gate = None
    if rule in ("gated", "gated_delta"):
        g = f(decay)
        if g.shape == (bsz, t_len, hkv * dk):  # per key dimension: scales the rows of S
            gate = np.exp(g).reshape(bsz, t_len, hkv, dk, 1)
        elif g.shape == (bsz, t_len, hkv):  # per head
            gate = np.exp(g).reshape(bsz, t_len, hkv, 1, 1)
        else:
            raise ValueError(f"LinearAttention: decay shape {g.shape} must be {(bsz, t_len, hkv * dk)} "
                             f"or {(bsz, t_len, hkv)}")
    rate = None
    if rule in ("delta", "gated_delta"):
        bt = f(beta)
        if bt.shape not in ((bsz, t_len, hkv), (bsz, t_len, 1)):
            raise ValueError(f"LinearAttention: beta shape {bt.shape} must be {(bsz, t_len, hkv)} or "
                             f"{(bsz, t_len, 1)}")
        rate = bt.reshape(bsz, t_len, bt.shape[2], 1)  # broadcasts over heads and d_v
    sc = cdt.type(scale if scale else 1.0 / math.sqrt(dk))
    head_of = np.arange(hq) // (hq // hkv)  # query head -> its KV head
    out = np.empty((bsz, t_len, hq, dv), dtype=cdt)
    for t in range(t_len):
        kt, vt = kh[:, t], vh[:, t]  # (B, Hkv, dk), (B, Hkv, dv)
        if gate is not None:
            state = state * gate[:, t]
        if rate is not None:
            recalled = np.einsum("bhkv,bhk->bhv", state, kt)  # S^T k (after the decay for gated_delta)
            update = rate[:, t] * (vt - recalled)
        else:
            update = vt
        state = state + kt[..., :, None] * update[..., None, :]
        out[:, t] = sc * np.einsum("bhk,bhkv->bhv", qh[:, t], state[:, head_of])
    return out.reshape(bsz, t_len, hq * dv).astype(q.dtype), state.astype(q.dtype)
