"""FlexAttention (``ai.onnx.preview``): scaled dot-product attention with optional
``score_mod`` / ``prob_mod`` subgraphs applied to the whole (B, Hq, L, S)
score and probability tensors.

Subgraphs arrive as bound subgraphs (``.run(*inputs) -> list``), as for the
control-flow ops.  Scores, softmax and the modifiers work in
``softmax_precision`` (float32 unless the inputs are double); the product
with V and the output are in the inputs' dtype.
"""
from __future__ import annotations

import math

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY
from minirt.kernels import _narrow
from minirt.kernels.registry import kernel

PREVIEW = "ai.onnx.preview"


def _apply(mod, tensor: np.ndarray, what: str) -> np.ndarray:
    (out,) = mod.run(tensor)
    out = np.asarray(out)
    if out.shape != tensor.shape:
        raise ValueError(f"FlexAttention: {what} returned shape {out.shape}, expected {tensor.shape}")
    return out.astype(tensor.dtype, copy=False)


@kernel("FlexAttention", since=1, domain=PREVIEW)
def flex_attention(q, k, v, /, *, prob_mod=None, scale=None, score_mod=None, softmax_precision=None):
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError("FlexAttention: Q, K and V must be rank 4 (batch, heads, sequence, head size)")
    b, hq, _, d = q.shape
    hkv = k.shape[1]
    if k.shape[0] != b or v.shape[0] != b or k.shape[3] != d or v.shape[1] != hkv or v.shape[2] != k.shape[2]:
        raise ValueError(f"FlexAttention: shapes Q {q.shape}, K {k.shape}, V {v.shape} do not fit")
    if hq % hkv:
        raise ValueError(f"FlexAttention: q_num_heads {hq} must be a multiple of kv_num_heads {hkv}")
    if softmax_precision:
        pdt = ONNX_TO_NUMPY.get(int(softmax_precision))
        if pdt is None or pdt.kind != "f":
            raise ValueError(f"FlexAttention: softmax_precision {softmax_precision} is not a float type")
    else:
        pdt = np.dtype(np.float64) if q.dtype == np.float64 else np.dtype(np.float32)
    group = hq // hkv
    kx = np.repeat(k, group, axis=1) if group > 1 else k  # query head h reads KV head h // group
    vx = np.repeat(v, group, axis=1) if group > 1 else v
    sc = scale if scale is not None else 1.0 / math.sqrt(d)
    qp = _narrow.widen(q).astype(pdt, copy=False)
    kp = _narrow.widen(kx).astype(pdt, copy=False)
    scores = np.matmul(qp, np.swapaxes(kp, -1, -2)) * pdt.type(sc)
    if score_mod is not None:
        scores = _apply(score_mod, scores, "score_mod")
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(m), m, 0))
    total = e.sum(axis=-1, keepdims=True)
    probs = e / np.where(total == 0, 1, total)
    if prob_mod is not None:
        probs = _apply(prob_mod, probs, "prob_mod")
    cdt = np.float64 if q.dtype == np.float64 else np.float32
    y = np.matmul(probs.astype(cdt, copy=False), _narrow.widen(vx).astype(cdt, copy=False))
    return y.astype(q.dtype)
