"""Variadic Sum / Max / Min -> chains of binary Add / Max / Min.

Rule:

    Sum(a, b, c, ...) -> Add(Add(a, b), c) ...
    Max(a, b, c, ...) -> Max(Max(a, b), c) ...      (likewise Min; two inputs: unchanged)

in the order the runtime's kernels fold them (left to right), so the results are the same bits.  A
two-input Sum is what older exporters write for a residual (onnx's "light" ResNet-50 and DenseNet):
as an Add, ``fuse_activation`` folds it into the conv before it, and the accelerator rules (binary
only) take it.  Left alone: a single input (``cleanup``'s business), a node of opset < 8 whose inputs
do not all have one static shape (Sum-6 / Add-6 broadcast differently), and non-ONNX domains.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass

_BINARY_OF = {"Sum": "Add", "Max": "Max", "Min": "Min"}


def _broadcast_shape(a: ir.Value, b: ir.Value) -> ir.Shape | None:
    sa, sb = irh.static_shape(a), irh.static_shape(b)
    if sa is None or sb is None:
        return None
    try:
        return ir.Shape(np.broadcast_shapes(sa, sb))
    except ValueError:
        return None


class VariadicToBinary(Pass):
    """Rewrite Sum of two or more inputs, and Max / Min of three or more, as binary chains."""

    name = "variadic_to_binary"

    def run(self, model: ir.Model) -> bool:
        changed = False
        graph = model.graph
        for node in irh.live_nodes(graph):
            if not irh.is_onnx(node, *_BINARY_OF):
                continue
            inputs = list(node.inputs)
            if any(v is None for v in inputs) or len(inputs) < (2 if node.op_type == "Sum" else 3):
                continue
            if irh.opset_of(model, node) < 8:
                shapes = {irh.static_shape(v) for v in inputs}
                if len(shapes) != 1 or None in shapes:
                    self.refuse(node.op_type, node, "opset < 8 and inputs without one static shape")
                    continue
            op = _BINARY_OF[node.op_type]
            acc = inputs[0]
            out = node.outputs[0]
            for k, v in enumerate(inputs[1:], start=1):
                last = k == len(inputs) - 1
                step = ir.Node("", op, [acc, v], name=node.name if last else f"{node.name}_{k}")
                y = step.outputs[0]
                y.type = out.type
                y.shape = out.shape if last else _broadcast_shape(acc, v)
                graph.insert_before(node, step)
                acc = y
            irh.replace_value(out, acc)
            graph.remove(node, safe=True)
            changed = True
        return changed
