"""Scaled dot-product attention in one native call (minirt/native/sdpa_impl.h, com.minirt::
ScaledDotProductAttention) against numpy in float64, and against the composed kernels it replaces
(products, scale, mask, row softmax), whose results it must give exactly."""
from __future__ import annotations

import numpy as np
import pytest

import minirt
from minirt import native
from minirt.kernels import fused
from tests.native.conftest import requires_native

pytestmark = requires_native


def _reference(q, k, v, mask, scale, transpose_k):
    kt = np.swapaxes(k, -1, -2) if transpose_k else k
    s = q.astype(np.float64) @ kt.astype(np.float64) * scale
    if mask is not None:
        s = s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)


def _composed(q, k, v, mask, scale, transpose_k, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(fused, "_sdpa_native", lambda *a: None)
        return fused.scaled_dot_product_attention(q, k, v, mask, scale=scale, transpose_k=transpose_k)


# (batch axes, queries, keys, d, dv): Whisper's 1500 keys (several query blocks), DeiT's 197 (a partial
# panel and a dot tail), BERT's 128, one key, one query, dv != d
SHAPES = [((1, 6), 40, 1500, 64, 64), ((3,), 197, 197, 64, 64), ((1, 4), 128, 128, 64, 64), ((2,), 5, 1, 8, 8),
          ((2, 2), 1, 33, 16, 24), ((), 70, 9, 12, 5)]
MASKS = ["none", "shared row", "per query", "per batch and query"]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{s[1]}x{s[2]}" for s in SHAPES])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("transpose_k", [1, 0])
def test_attention_matches_float64_and_the_composed_kernels(shape, mask_kind, transpose_k, every_isa, threads,
                                                            monkeypatch):
    batch, sq, sk, d, dv = shape
    rng = np.random.default_rng(sq * 7 + sk)
    q = rng.standard_normal(batch + (sq, d)).astype(np.float32)
    k = rng.standard_normal(batch + ((sk, d) if transpose_k else (d, sk))).astype(np.float32)
    v = rng.standard_normal(batch + (sk, dv)).astype(np.float32)
    mask = {"none": None,
            "shared row": np.where(rng.random((1, sk)) < 0.2, -1e4, 0.0),
            "per query": rng.standard_normal((sq, sk)),
            "per batch and query": rng.standard_normal(batch + (sq, sk))}[mask_kind]
    mask = None if mask is None else mask.astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    y = fused._sdpa_native(q, k, v, mask, scale, transpose_k, None)
    assert y is not None, "the native call must take these operands"
    np.testing.assert_allclose(y, _reference(q, k, v, mask, scale, transpose_k), rtol=2e-4, atol=2e-5)
    composed = _composed(q, k, v, mask, scale, transpose_k, monkeypatch)
    if sq > 3:  # (the composed products of 1-3 rows take the matrix-vector kernel: another order of the sums)
        np.testing.assert_array_equal(y, composed)
    else:
        np.testing.assert_allclose(y, composed, rtol=1e-5, atol=1e-6)


def test_operands_it_does_not_take_run_the_composed_kernels():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 4)).astype(np.float32)
    k = rng.standard_normal((2, 5, 4)).astype(np.float32)
    v = rng.standard_normal((2, 5, 6)).astype(np.float32)
    assert fused._sdpa_native(q.astype(np.float64), k, v, None, 1.0, 1, None) is None  # dtype
    assert fused._sdpa_native(q, k[:1], v, None, 1.0, 1, None) is None  # leading axes broadcast
    assert fused._sdpa_native(q, np.swapaxes(k, -1, -2), v, None, 1.0, 1, None) is None  # not contiguous
    assert fused._sdpa_native(q, k, v, np.zeros((2, 1, 5), np.float64), 1.0, 1, None) is None  # mask dtype
    assert fused._sdpa_native(q, k, v, np.zeros((1, 3, 5), np.float32)[:, :, :5], 1.0, 1, None) is not None
    assert fused._sdpa_native(q, k, v, np.zeros((2, 2, 3, 5), np.float32), 1.0, 1, None) is None  # extra axis
    # the kernel itself still answers for them, through the composed kernels
    y = fused.scaled_dot_product_attention(q.astype(np.float64), k, v, scale=0.5)
    np.testing.assert_allclose(y, _reference(q, k, v, None, 0.5, 1), rtol=1e-5, atol=1e-6)


def test_an_attention_model_replays_the_native_call():
    """In a model, the call is recorded and replayed (a native program) with the node's results."""
    import onnx_ir as ir
    from minirt.builder.lower import artifact_bytes

    x = ir.Value(name="x", shape=ir.Shape([1, 2, 24, 8]), type=ir.TensorType(ir.DataType.FLOAT))
    tanh = ir.Node("", "Tanh", [x], num_outputs=1)
    t = tanh.outputs[0]
    t.name, t.shape, t.type = "t", ir.Shape([1, 2, 24, 8]), ir.TensorType(ir.DataType.FLOAT)
    node = ir.Node("com.minirt", "ScaledDotProductAttention", [t, t, t], attributes=[ir.AttrFloat32("scale", 0.3)],
                   num_outputs=1)
    y = node.outputs[0]
    y.name, y.shape, y.type = "y", ir.Shape([1, 2, 24, 8]), ir.TensorType(ir.DataType.FLOAT)
    data = artifact_bytes(ir.Model(ir.Graph([x], [y], nodes=[tanh, node], opset_imports={"": 17, "com.minirt": 1}),
                                   ir_version=8))
    sess = minirt.Session(data, threads=2)
    for seed in range(4):
        xv = np.random.default_rng(seed).standard_normal((1, 2, 24, 8)).astype(np.float32)
        t64 = np.tanh(xv.astype(np.float64))
        np.testing.assert_allclose(sess.run(None, {"x": xv})[0], _reference(t64, t64, t64, None, 0.3, 1),
                                   rtol=1e-5, atol=1e-5)
    assert "native calls" in str(sess.memory_plans()[0]["native_program"]), sess.memory_plans()
