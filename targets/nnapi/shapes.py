"""Static shapes of a model's values, for the NNAPI lowering.

onnx-ir carries the shapes ONNX shape inference found; after shape
specialisation some values (behind a Reshape whose target came from a folded
Shape computation, for instance) still lack one.  :func:`static_shapes`
fills the gaps for the operators the lowering handles, so a partition is
only refused for a truly dynamic shape.
"""
from __future__ import annotations

import numpy as np

from minirt.builder.ir_helpers import static_shape
from minirt import vocabulary as V


_static = static_shape  # one definition: builder.passes.irh.static_shape


def _broadcast(*shapes):
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _reshape(in_shape, target, allowzero=0):
    target = [int(t) for t in target]
    out = []
    for i, t in enumerate(target):
        out.append(in_shape[i] if t == 0 and not allowzero else t)
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        total = int(np.prod(in_shape, dtype=np.int64))
        if known == 0:
            return None
        out[out.index(-1)] = total // known
    return tuple(out)


# Ops whose output has the input's shape, of those the NNAPI lowering handles: a subset of the
# vocabulary's one-input families (tests/test_vocabulary.py checks the relation).
_SAME_SHAPE = {"Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "LeakyRelu", "Clip", "Softmax", "LogSoftmax",
               "Activation", "Identity", "Dropout", "Abs", "Exp", "Log", "Neg", "Sqrt", "Floor", "Elu", "Erf",
               "QuantizeLinear", "DequantizeLinear", "BatchNormalization", "PRelu", "Reciprocal"}
_BINARY = V.BINARY_MATH - {"Mod"}  # broadcast shapes; NNAPI has no Mod


def infer(node, in_shapes, const) -> list:
    """Output shapes of ``node`` from its input shapes (None where unknown)."""
    op = node.op_type
    x = in_shapes[0] if in_shapes else None
    if op in _SAME_SHAPE:
        return [x]
    if op in _BINARY:
        if any(s is None for s in in_shapes):
            return [None]
        return [_broadcast(*in_shapes)]
    if op == "Reshape" and x is not None and len(node.inputs) > 1:
        t = const(node.inputs[1])
        if t is not None:
            a = node.attributes.get("allowzero")
            return [_reshape(x, t.reshape(-1), a.value if a else 0)]
    if op == "Flatten" and x is not None:
        a = node.attributes.get("axis")
        axis = a.value if a else 1
        axis = axis + len(x) if axis < 0 else axis
        return [(int(np.prod(x[:axis], dtype=np.int64)), int(np.prod(x[axis:], dtype=np.int64)))]
    if op in ("MatMul", "FusedMatMul") and x is not None and in_shapes[1] is not None:
        a, b = x, in_shapes[1]
        if len(a) >= 1 and len(b) >= 2:
            batch = _broadcast(a[:-2], b[:-2]) if len(a) >= 2 else b[:-2]
            if batch is None:
                return [None]
            out = tuple(batch) + ((a[-2],) if len(a) >= 2 else ()) + (b[-1],)
            return [out]
    if op in ("Gemm", "FusedGemm") and x is not None and in_shapes[1] is not None:
        ta = node.attributes.get("transA")
        tb = node.attributes.get("transB")
        m = x[1] if ta and ta.value else x[0]
        n = in_shapes[1][0] if tb and tb.value else in_shapes[1][1]
        return [(m, n)]
    if op in V.GLOBAL_POOL and x is not None:
        return [tuple(x[:2]) + (1,) * (len(x) - 2)]
    return [None for _ in node.outputs]


def static_shapes(graph, const) -> dict:
    """id(value) -> static shape tuple (or None) for every value of ``graph`` (topological order)."""
    shapes: dict = {}
    for v in list(graph.inputs) + list(graph.initializers.values()):
        shapes[id(v)] = _static(v)
        if shapes[id(v)] is None and v.const_value is not None:
            shapes[id(v)] = tuple(int(d) for d in v.const_value.shape)
    for node in graph:
        ins = []
        for v in node.inputs:
            if v is None:
                ins.append(None)
                continue
            s = shapes.get(id(v))
            if s is None:
                s = _static(v)
                if s is None:
                    c = const(v)
                    s = None if c is None else tuple(c.shape)
                shapes[id(v)] = s
            ins.append(s)
        inferred = None
        for i, o in enumerate(node.outputs):
            s = _static(o)
            if s is None:
                if inferred is None:
                    try:
                        inferred = infer(node, [s for s in ins], const)
                    except Exception:  # noqa: BLE001 - unknown stays unknown
                        inferred = [None] * len(node.outputs)
                s = inferred[i] if i < len(inferred) else None
            shapes[id(o)] = s
    return shapes
