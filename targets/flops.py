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
* QLinearConv / QLinearMatMul / ConvInteger / MatMulInteger: as Conv / MatMul;
  QuantizeLinear / DequantizeLinear: one per element;
* pure data movement (Reshape, Transpose, Concat, Slice, ...) and shape
  arithmetic (:data:`DATA_MOVEMENT`): 0.

:func:`estimate` says None, "unknown", for a node whose cost depends on a shape that is not
known, and for an op this module has no rule for: reports show those as unknown, never as 0
(issue 27).  :func:`node_flops` is the cost models' number: unknown counts as 0 there, so the
cost of a decision never rests on invented work.
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


# Ops that move or index data, or compute shapes: no arithmetic on the tensor's values.
DATA_MOVEMENT = V.RESHAPES | frozenset({
    "Transpose", "Concat", "Slice", "Split", "Gather", "GatherElements", "GatherND", "Expand", "Tile", "Pad",
    "Identity", "Shape", "Size", "Constant", "ConstantOfShape", "Range", "DepthToSpace", "SpaceToDepth", "Dropout",
    "Compress", "NonZero", "ScatterND", "ScatterElements", "OneHot", "Trilu", "ReverseSequence", "CenterCropPad",
    "SequenceConstruct", "SequenceAt", "SequenceInsert", "SplitToSequence", "ConcatFromSequence", "EyeLike",
    "RowLookup"})  # (com.minirt::RowLookup: a row copy per id, D141)
_QUANTIZE = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})

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
    """FLOPs estimate of ``node`` for the cost models (see the module docstring): 0 when unknown."""
    return estimate(node) or 0.0


def estimate(node: ir.Node) -> float | None:
    """FLOPs estimate of ``node`` (see the module docstring), or None when it is unknown: a shape it
    depends on is not known, or the op has no rule here."""
    op = node.op_type
    out = node.outputs[0] if node.outputs else None
    out_shape = _shape(out) if out is not None else None
    out_elems = 0 if out_shape is None else int(np.prod(out_shape, dtype=np.int64))
    ins = list(node.inputs)
    if op in DATA_MOVEMENT:
        return 0.0
    if op in ("LSTM", "GRU", "RNN"):
        x, w = _shape(ins[0]), (_shape(ins[1]) if len(ins) > 1 else None)
        if x is None or w is None or len(x) != 3 or len(w) != 3:
            return None
        steps, batch = (x[1], x[0]) if attr(node, "layout", 0) else (x[0], x[1])
        directions, gate_rows, inputs = w  # W: (directions, gates * hidden, input)
        hidden = gate_rows // {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
        gate_values = steps * batch * directions * gate_rows
        return float(2 * gate_values * (inputs + hidden) + 4 * gate_values)
    if op == "ScaledDotProductAttention":
        q, k = _shape(ins[0]), _shape(ins[1])
        if q is None or k is None:
            return None
        n_kv = k[-2] if attr(node, "transpose_k", 1) else k[-1]
        return float(4 * int(np.prod(q, dtype=np.int64)) * n_kv + 5 * int(np.prod(q[:-1], dtype=np.int64)) * n_kv)
    if out_shape is None:
        return None  # (every rule below these counts per output element, or needs the output's size)
    if op in ("Conv", "FusedConv", "QLinearConv", "ConvInteger"):
        w_at = 3 if op == "QLinearConv" else 1
        w = _shape(ins[w_at]) if len(ins) > w_at and ins[w_at] is not None else None
        if w is None:
            return None
        per_out = 2 * w[1] * int(np.prod(w[2:], dtype=np.int64))
        return float(out_elems * per_out) + _epilogue(node, out_elems)
    if op in ("ConvTranspose", "FusedConvTranspose"):
        w = _shape(ins[1]) if len(ins) > 1 else None
        x = _shape(ins[0])
        if w is None or x is None:
            return None
        # W: (Cin, Cout/group, k...); every input element scatters Cout/group * prod(k) products
        return (float(2 * int(np.prod(x, dtype=np.int64)) * w[1] * int(np.prod(w[2:], dtype=np.int64)) + out_elems)
                + _epilogue(node, out_elems))
    if op in ("MatMul", "FusedMatMul", "Gemm", "FusedGemm", "QLinearMatMul", "MatMulInteger"):
        a = _shape(ins[0])
        if a is None:
            return None
        k = a[-1]
        if op in ("Gemm", "FusedGemm") and attr(node, "transA", 0):
            k = a[0]
        return float(2 * out_elems * k) + _epilogue(node, out_elems)
    if op in V.POOL:
        k = attr(node, "kernel_shape", None)
        return float(out_elems * (int(np.prod(k)) if k else 1))
    if op in V.GLOBAL_POOL or op in _REDUCE:
        x = _shape(ins[0])
        return None if x is None else float(np.prod(x, dtype=np.int64))
    if op in _NORM:
        return float(5 * out_elems)
    if op in ("Resize", "Upsample"):
        return float(4 * out_elems)
    if op == "LRN":  # a square and an add per channel of the window, then the power and the division
        return float(out_elems * (2 * int(attr(node, "size", 1)) + 6))
    if op in _ELEMENTWISE_1 or op in _QUANTIZE:
        return float(out_elems)
    if op in _ELEMENTWISE_4:
        return float(4 * out_elems)
    return None  # (an op without a rule: its cost is unknown here)


def graph_flops(graph, ctx=None) -> float:
    return float(sum(node_flops(n, ctx) for n in graph))
