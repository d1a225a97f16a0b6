"""A node whose kernel changes a native call's result with numpy between recorded calls cannot be
replayed as those calls alone (minirt.native.modified): the recording refuses it, so every run, the
replays included, gives the node's real result.  Found by a fused ScaledDotProductAttention, which
scaled its scores in numpy between two recorded MatMul / Softmax calls (its replays dropped the scale)."""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

import minirt
from minirt.builder.lower import artifact_bytes


def _sdpa_model(scale: float) -> bytes:
    x = ir.Value(name="x", shape=ir.Shape([1, 2, 6, 4]), type=ir.TensorType(ir.DataType.FLOAT))
    tanh = ir.Node("", "Tanh", [x], num_outputs=1)  # (attention on a value of the run, as in a model)
    t = tanh.outputs[0]
    t.name, t.shape, t.type = "t", ir.Shape([1, 2, 6, 4]), ir.TensorType(ir.DataType.FLOAT)
    node = ir.Node("com.minirt", "ScaledDotProductAttention", [t, t, t], attributes=[ir.AttrFloat32("scale", scale)],
                   num_outputs=1)
    y = node.outputs[0]
    y.name, y.shape, y.type = "y", ir.Shape([1, 2, 6, 4]), ir.TensorType(ir.DataType.FLOAT)
    graph = ir.Graph([x], [y], nodes=[tanh, node], opset_imports={"": 17, "com.minirt": 1})
    return artifact_bytes(ir.Model(graph, ir_version=8))


def _reference(x: np.ndarray, scale: float) -> np.ndarray:
    t = np.tanh(x.astype(np.float64))
    s = t @ np.swapaxes(t, -1, -2) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ t


def test_scaled_attention_gives_its_result_on_every_run_and_warm_up():
    data = _sdpa_model(0.5)
    for warm_up in (False, True):
        sess = minirt.Session(data, threads=1, warm_up=warm_up)
        for seed in range(4):  # (run 1 plans, run 2 records, later runs replay what may be replayed)
            x = np.random.default_rng(seed).standard_normal((1, 2, 6, 4)).astype(np.float32)
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], _reference(x, 0.5), rtol=1e-5, atol=1e-5)
