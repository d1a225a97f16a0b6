"""FLOPs estimates for ONNX and minirt-fused nodes, shared by every provider spec.

Counting rules (one multiply-add = 2 FLOPs):

* Conv / FusedConv: ``2 * N*Cout*Hout*Wout * (Cin/group)*prod(kernel)``, plus
  one FLOP per output element for the bias, residual and activation each;
* ConvTranspose / FusedConvTranspose: ``2 * N*Cin*prod(in spatial) * (Cout/group)*prod(kernel)``
  (+ epilogue);
* MatMul / Gemm / FusedGemm / FusedMatMul: ``2 * batch*M*N*K`` (+ epilogue);
* pooling: output elements times kernel size (global pools: input elements);
* elementwise ops and activations: one FLOP per output element (a few for
  the transcendental ones); Softmax / LayerNormalization: 5 per element;
* Resize: 4 per output element (bilinear blend);
* LSTM / GRU / RNN: ``2 * steps*batch*directions * gates*hidden * (input + hidden)`` (the input
  projection and the recurrent product) plus 4 per gate value (activations and the cell update);
* pure data movement (Reshape, Transpose, Concat, Slice, ...) and shape
  arithmetic: 0.

Unknown shapes count as 0: the estimate never invents work.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder.ir_helpers import attr, static_shape
from minirt import vocabulary as V

# The op families are the vocabulary's (minirt/vocabulary.py); the costs are this module's.
# A few FLOPs per element: the transcendental elementwise ops and com.minirt's Activation.
_ELEMENTWISE_4 = frozenset({"Sigmoid", "Tanh", "Exp", "Log", "Erf", "HardSwish", "Gelu", "Elu", "Selu", "Softplus",
                            "Mish"}) | {"Activation"}
# Statistics over an axis: ~5 FLOPs per element.  The per-channel ones (BatchNormalization and
# InstanceNormalization, an affine map at inference) count as elementwise.
_NORM = V.SOFTMAX | (V.NORMALIZATION - {"BatchNormalization", "InstanceNormalization"})
_ELEMENTWISE_1 = (V.ELEMENTWISE - _ELEMENTWISE_4) | (V.NORMALIZATION - _NORM)
_REDUCE = V.REDUCE


_shape = static_shape  # one definition: builder.ir_helpers.static_shape


def numel(value) -> int:
    """Elements of ``value`` when its shape is static, else 0."""
    s = _shape(value)
    return 0 if s is None else int(np.prod(s, dtype=np.int64))


def _epilogue(node: ir.Node, out_elems: int) -> float:
    extra = 0
    inputs = list(node.inputs)
    if node.op_type == "FusedConv":
        extra += sum(1 for v in inputs[2:4] if v is not None)
    elif node.op_type in ("FusedGemm", "FusedMatMul", "Gemm"):
        extra += sum(1 for v in inputs[2:4] if v is not None)
    act = attr(node, "activation", "") or ""
    if act:
        extra += 4 if act not in ("Relu", "Clip", "LeakyRelu") else 1
    return float(extra * out_elems)


def node_flops(node: ir.Node, ctx=None) -> float:
    """FLOPs estimate of ``node`` (see the module docstring); 0 when shapes are unknown."""
    op = node.op_type
    out = node.outputs[0] if node.outputs else None
    out_elems = numel(out)
    ins = list(node.inputs)
    if op in ("Conv", "FusedConv"):
        w = _shape(ins[1]) if len(ins) > 1 else None
        if w is None or out_elems == 0:
            return 0.0
        per_out = 2 * w[1] * int(np.prod(w[2:], dtype=np.int64))
        return float(out_elems * per_out) + _epilogue(node, out_elems)
    if op in ("ConvTranspose", "FusedConvTranspose"):
        w = _shape(ins[1]) if len(ins) > 1 else None
        x = _shape(ins[0])
        if w is None or x is None:
            return 0.0
        # W: (Cin, Cout/group, k...); every input element scatters Cout/group * prod(k) products
        return (float(2 * int(np.prod(x, dtype=np.int64)) * w[1] * int(np.prod(w[2:], dtype=np.int64)) + out_elems)
                + _epilogue(node, out_elems))
    if op in ("MatMul", "FusedMatMul", "Gemm", "FusedGemm"):
        a = _shape(ins[0])
        if a is None or out_elems == 0:
            return 0.0
        k = a[-1]
        if op in ("Gemm", "FusedGemm") and attr(node, "transA", 0):
            k = a[0]
        return float(2 * out_elems * k) + _epilogue(node, out_elems)
    if op in V.POOL:
        k = attr(node, "kernel_shape", None)
        return float(out_elems * (int(np.prod(k)) if k else 1))
    if op in V.GLOBAL_POOL:
        return float(numel(ins[0]))
    if op in _REDUCE:
        return float(numel(ins[0]))
    if op in _NORM:
        return float(5 * out_elems)
    if op in ("Resize", "Upsample"):
        return float(4 * out_elems)
    if op in _ELEMENTWISE_1:
        return float(out_elems)
    if op in _ELEMENTWISE_4:
        return float(4 * out_elems)
    if op in ("LSTM", "GRU", "RNN"):
        x, w = _shape(ins[0]), (_shape(ins[1]) if len(ins) > 1 else None)
        if x is None or w is None or len(x) != 3 or len(w) != 3:
            return 0.0
        steps, batch = (x[1], x[0]) if attr(node, "layout", 0) else (x[0], x[1])
        directions, gate_rows, inputs = w  # W: (directions, gates * hidden, input)
        hidden = gate_rows // {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
        gate_values = steps * batch * directions * gate_rows
        return float(2 * gate_values * (inputs + hidden) + 4 * gate_values)
    if op == "ScaledDotProductAttention":
        q, k = _shape(ins[0]), _shape(ins[1])
        if q is None or k is None:
            return 0.0
        n_kv = k[-2] if attr(node, "transpose_k", 1) else k[-1]
        return float(4 * int(np.prod(q, dtype=np.int64)) * n_kv + 5 * int(np.prod(q[:-1], dtype=np.int64)) * n_kv)
    return 0.0


def graph_flops(graph, ctx=None) -> float:
    return float(sum(node_flops(n, ctx) for n in graph))
