"""LinearAttention, CausalConvWithState and FlexAttention against the onnx reference
evaluator (onnxruntime has no kernels for these opset-27 / preview ops); the
evaluator runs the ops' ONNX function bodies, so the reference shares no code
with the kernels."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from minirt.kernels import NodeContext, lookup
from tests.kernels import reference as ref_mod
from tests.kernels.test_elementwise import assert_same, check, rand

RNG = np.random.default_rng(13)


def _unit(x, axis=-1):
    return (x / np.linalg.norm(x, axis=axis, keepdims=True)).astype(x.dtype)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("with_past", [False, True])
def test_linear_attention(rule, heads, with_past):
    hq, hkv = heads
    b, t, dk, dv = 2, 5, 4, 3
    q = rand((b, t, hq * dk), low=-1, high=1)
    k = _unit(rand((b, t, hkv, dk), low=-1, high=1)).reshape(b, t, hkv * dk)
    v = rand((b, t, hkv * dv), low=-1, high=1)
    past = rand((b, hkv, dk, dv), low=-0.5, high=0.5) if with_past else None
    decay = -RNG.uniform(0.01, 0.5, (b, t, hkv * dk)).astype(np.float32) if "gated" in rule else None
    beta = RNG.uniform(0.1, 0.9, (b, t, hkv)).astype(np.float32) if "delta" in rule else None
    attrs = {"q_num_heads": hq, "kv_num_heads": hkv, "update_rule": rule}
    check("LinearAttention", [q, k, v, past, decay, beta], attrs, opset=27, n_outputs=2,
          engine="onnx-reference", rtol=1e-4, atol=1e-5)


def test_linear_attention_per_head_decay_and_scale():
    b, t, h, d = 1, 3, 2, 4
    q, v = rand((b, t, h * d)), rand((b, t, h * d))
    k = _unit(rand((b, t, h, d))).reshape(b, t, h * d)
    decay = -RNG.uniform(0.1, 1, (b, t, h)).astype(np.float32)
    attrs = {"q_num_heads": h, "kv_num_heads": h, "update_rule": "gated", "scale": 0.3}
    check("LinearAttention", [q, k, v, None, decay], attrs, opset=27, n_outputs=2, engine="onnx-reference",
          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k_size", [1, 3, 5])
@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("extras", ["", "bias", "past", "bias+past"])
def test_causal_conv_with_state(k_size, activation, extras):
    b, c, length = 2, 3, 4
    x = rand((b, c, length))
    w = rand((c, 1, k_size))
    bias = rand((c,)) if "bias" in extras else None
    past = rand((b, c, k_size - 1)) if "past" in extras else None
    check("CausalConvWithState", [x, w, bias, past], {"activation": activation}, opset=27, n_outputs=2,
          engine="onnx-reference", rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- FlexAttention

PREVIEW = "ai.onnx.preview"


class _Graph:
    """Stands in for the runtime's bound subgraph: runs a GraphProto with the reference evaluator."""

    def __init__(self, graph):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        model.ir_version = 10
        self._ev = ReferenceEvaluator(model)
        self._name = graph.input[0].name

    def run(self, *inputs):
        return self._ev.run(None, {self._name: inputs[0]})


def _soft_cap_graph():
    cap = helper.make_tensor("cap", TensorProto.FLOAT, [], [5.0])
    nodes = [helper.make_node("Div", ["s", "cap"], ["d"]), helper.make_node("Tanh", ["d"], ["t"]),
             helper.make_node("Mul", ["t", "cap"], ["out"])]
    vi = helper.make_tensor_value_info
    return helper.make_graph(nodes, "soft_cap", [vi("s", TensorProto.FLOAT, None)],
                             [vi("out", TensorProto.FLOAT, None)], initializer=[cap])


def _flex_check(inputs, attrs, graphs=None):
    graphs = graphs or {}
    model_attrs = dict(attrs, **graphs)
    model = ref_mod.single_node_model("FlexAttention", inputs, model_attrs, 1, 1, domain=PREVIEW)
    model.opset_import.append(helper.make_opsetid("", 26))
    model.ir_version = 10
    (expected,) = ReferenceEvaluator(model).run(None, {f"in{i}": x for i, x in enumerate(inputs)})
    kattrs = dict(attrs, **{k: _Graph(g) for k, g in graphs.items()})
    entry = lookup(PREVIEW, "FlexAttention", 1)
    actual = entry.fn(*inputs, **kattrs)
    tol = 2e-3 if inputs[0].dtype == np.float16 else 1e-5
    assert_same(actual, np.asarray(expected), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
def test_flex_attention(dtype, heads):
    hq, hkv = heads
    q = rand((2, hq, 5, 8), dtype, -1, 1)
    k = rand((2, hkv, 7, 8), dtype, -1, 1)
    v = rand((2, hkv, 7, 6), dtype, -1, 1)
    _flex_check([q, k, v], {})
    _flex_check([q, k, v], {"scale": 0.2})


def test_flex_attention_score_mod():
    q, k, v = rand((1, 2, 4, 8), low=-2, high=2), rand((1, 2, 4, 8), low=-2, high=2), rand((1, 2, 4, 8))
    _flex_check([q, k, v], {}, {"score_mod": _soft_cap_graph()})
