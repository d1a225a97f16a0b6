"""Cleanup: local simplifications that never make the graph bigger.

One rule per line of the table ``RULES`` (op_type, rule): a rule looks at a
single node and returns the value that replaces the node's (first) output,
or edits the node in place and returns ``True``, or returns ``None`` when it
does not apply.  The node itself is left for dead code elimination.

    Identity(x)                           -> x
    Dropout(x)            (mask unused)   -> x          # inference: Dropout is the identity
    Cast(x, to=dtype(x))                  -> x
    CastLike(x, y)   (dtype x == dtype y) -> x
    Reshape(x, s)    (shape(x) == s)      -> x
    Reshape(R(x), s) (R reshapes only)    -> Reshape(x, s)    # R in Reshape/Flatten/Squeeze/Unsqueeze; s has no 0
    Squeeze/Unsqueeze/Flatten to shape(x) -> x
    Transpose(x, identity perm)           -> x
    Transpose(Transpose(x, p), q)         -> Transpose(x, p[q])  (-> x when p[q] is the identity)
    x * 1, 1 * x, x / 1                   -> x          # the constant broadcasts into x's shape
    x + 0, 0 + x, x - 0                   -> x
    Pad(x, all pads 0)                    -> x
    Concat(x)           (one input)       -> x
    Expand(x, s)     (shape(x) == result) -> x
    Resize(x) to shape(x) (not tf_crop_and_resize) -> x  # scale 1: every point samples itself

A rewrite that would rename a graph input (an Identity between a graph input
and a graph output) is skipped: the node is the model's interface.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass
from minirt.vocabulary import RESHAPES

Rule = Callable[[ir.Node, ir.Model], "ir.Value | bool | None"]


def _identity(node, model):
    return node.inputs[0] if node.inputs and node.inputs[0] is not None else None


def _dropout(node, model):
    if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
        return None
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        training = irh.const_array(node.inputs[2])
        if training is None or bool(training.reshape(-1)[0]):
            return None  # training mode (or unknown): not the identity
    return node.inputs[0]


def _cast(node, model):
    x = node.inputs[0]
    to = irh.attr(node, "to")
    if x is None or x.dtype is None or to is None:
        return None
    return x if int(x.dtype.value) == int(to) else None


def _cast_like(node, model):
    x, y = node.inputs[0], node.inputs[1]
    if x is None or y is None or x.dtype is None or y.dtype is None:
        return None
    return x if x.dtype == y.dtype else None


def _reshape_target(node) -> np.ndarray | None:
    if len(node.inputs) < 2:
        return None
    s = irh.const_array(node.inputs[1])
    return None if s is None else s.astype(np.int64).reshape(-1)


def _resolve_reshape(in_shape: tuple, target: np.ndarray, allowzero: int) -> tuple | None:
    out = []
    for i, d in enumerate(target.tolist()):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                return None
            out.append(in_shape[i])
        else:
            out.append(d)
    if out.count(-1) > 1:
        return None
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        total = int(np.prod(in_shape))
        if known == 0 or total % known:
            return None
        out[out.index(-1)] = total // known
    return tuple(out)


def _reshape(node, model):
    x = node.inputs[0]
    target = _reshape_target(node)
    if x is None or target is None:
        return None
    allowzero = irh.attr(node, "allowzero", 0)
    shape = irh.static_shape(x)
    if shape is not None and _resolve_reshape(shape, target, allowzero) == shape:
        return x
    # Reshape of a pure reshaping op: read the op's input directly.
    producer = x.producer()
    if (
        producer is not None
        and irh.is_onnx(producer, *RESHAPES)
        and producer.inputs[0] is not None
        and (allowzero or not (target == 0).any())
    ):
        node.replace_input_with(0, producer.inputs[0])
        return True
    return None


def _same_shape_as_input(node, model):
    x, y = node.inputs[0], node.outputs[0]
    sx, sy = irh.static_shape(x), irh.static_shape(y)
    return x if sx is not None and sx == sy else None


def _perm(node) -> list | None:
    p = irh.attr(node, "perm")
    if p is not None:
        return [int(i) for i in p]
    r = irh.rank(node.inputs[0])
    return None if r is None else list(range(r))[::-1]


def _transpose(node, model):
    perm = _perm(node)
    if perm is None:
        return None
    if perm == sorted(perm):
        return node.inputs[0]
    producer = node.inputs[0].producer()
    if producer is not None and irh.is_onnx(producer, "Transpose") and producer.inputs[0] is not None:
        inner = _perm(producer)
        if inner is None or len(inner) != len(perm):
            return None
        composed = [inner[i] for i in perm]
        if composed == sorted(composed):
            return producer.inputs[0]
        node.replace_input_with(0, producer.inputs[0])
        node.attributes["perm"] = ir.AttrInt64s("perm", composed)
        return True
    return None


def _neutral_operand(node, neutral: float, sides: tuple) -> ir.Value | None:
    """The other operand when one side (of ``sides``) is a constant equal to ``neutral`` that does not broadcast x."""
    if len(node.inputs) != 2 or None in node.inputs:
        return None
    for side in sides:
        c, x = node.inputs[side], node.inputs[1 - side]
        arr = irh.const_array(c)
        if arr is None or arr.dtype.kind not in "fiu" or not np.all(arr == neutral):
            continue
        rx = irh.rank(x)
        if rx is None or arr.ndim > rx or any(d != 1 for d in arr.shape):
            continue
        if x.dtype is not None and c.dtype is not None and x.dtype != c.dtype:
            continue
        return x
    return None


def _mul(node, model):
    return _neutral_operand(node, 1.0, (0, 1))


def _div(node, model):
    return _neutral_operand(node, 1.0, (1,))


def _add(node, model):
    return _neutral_operand(node, 0.0, (0, 1))


def _sub(node, model):
    return _neutral_operand(node, 0.0, (1,))


def _pad(node, model):
    if len(node.inputs) >= 2 and node.inputs[1] is not None:
        pads = irh.const_array(node.inputs[1])
    else:
        pads = irh.attr(node, "pads")
        pads = None if pads is None else np.asarray(pads)
    if pads is None or np.any(pads != 0):
        return None
    return node.inputs[0]


def _concat(node, model):
    return node.inputs[0] if len(node.inputs) == 1 else None


def _resize(node, model):
    """A Resize to its input's own shape: at scale 1 every coordinate transformation except
    tf_crop_and_resize (which reads the roi) maps output x to input x, an integer, where the nearest,
    linear and cubic kernels all weigh that one input point 1 and its neighbours 0 (with antialias or
    exclude_outside too); torchvision's detectors resize a 320 x 320 image to 320 x 320 first."""
    mode = irh.attr(node, "coordinate_transformation_mode", "half_pixel")
    if (mode.decode() if isinstance(mode, bytes) else mode) == "tf_crop_and_resize":
        return None
    return _same_shape_as_input(node, model)


RULES: list[tuple[str, Rule]] = [
    ("Identity", _identity),  # Identity(x) -> x
    ("Dropout", _dropout),  # Dropout(x) -> x when the mask is unused
    ("Cast", _cast),  # Cast(x, to=dtype(x)) -> x
    ("CastLike", _cast_like),  # CastLike(x, y) -> x when dtypes match
    ("Reshape", _reshape),  # Reshape(x, shape(x)) -> x;  Reshape(R(x), s) -> Reshape(x, s)
    ("Squeeze", _same_shape_as_input),  # Squeeze to the same shape -> x
    ("Unsqueeze", _same_shape_as_input),  # Unsqueeze to the same shape -> x
    ("Flatten", _same_shape_as_input),  # Flatten to the same shape -> x
    ("Expand", _same_shape_as_input),  # Expand to the same shape -> x
    ("Transpose", _transpose),  # identity perm -> x;  Transpose(Transpose(x)) -> Transpose(x)
    ("Mul", _mul),  # x * 1 -> x
    ("Div", _div),  # x / 1 -> x
    ("Add", _add),  # x + 0 -> x
    ("Sub", _sub),  # x - 0 -> x
    ("Pad", _pad),  # Pad(x, 0) -> x
    ("Concat", _concat),  # Concat(x) -> x
    ("Resize", _resize),  # Resize to the input's shape -> x
]
_BY_OP: dict[str, list[Rule]] = {}
for _op, _rule in RULES:
    _BY_OP.setdefault(_op, []).append(_rule)


class Cleanup(Pass):
    """Apply the simplification table until no rule fires."""

    name = "cleanup"

    def run(self, model: ir.Model) -> bool:
        changed = False
        for graph in list(irh.graphs(model)):
            for node in irh.live_nodes(graph):
                if node.domain not in ("", "ai.onnx"):
                    continue
                for rule in _BY_OP.get(node.op_type, ()):
                    result = rule(node, model)
                    if result is None:
                        continue
                    if result is True:
                        changed = True
                        continue
                    out = node.outputs[0]
                    if result is out or not irh.replace_value(out, result):
                        continue
                    # Keep the removed node's output dtype/shape knowledge on the survivor.
                    if result.shape is None and out.shape is not None:
                        result.shape = out.shape
                    graph.remove(node, safe=True)
                    changed = True
                    break
        return changed
