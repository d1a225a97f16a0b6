"""Fold a scalar affine map after a QConv into its epilogue (pass ``quant_fold_affine``).

Rule: ``Mul(y, a)`` and then ``Add(., b)`` by constant float32 scalars (either
one alone, too) after a QConv without ``post_scale`` / ``pool_kernel_shape`` /
``output_scale`` become its ``post_scale`` = a / ``post_shift`` = b, when each
intermediate output has that one use and is no graph output.  PP-OCR's LCNet
puts such a learnable affine map after every conv + activation; folded, the
native int8 epilogues apply it, the map's float tensors disappear, and the
QConv can write uint8 for the next int8 layer (``quant_chain_int8``).  The only
difference is float rounding (``a * y + b`` in one epilogue instead of two passes).

Refused (reported): a Mul / Add after such a QConv whose other operand is not
a constant float32 scalar (a wider constant would broadcast the output).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder.quantize import qir
from minirt.builder.quantize.passes.base import QuantPass


def _scalar_operand(node: ir.Node, x: ir.Value, graph: ir.Graph) -> float | None:
    """The constant float32 scalar (one element) that a binary ``node`` combines with ``x``, else None."""
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    other = node.inputs[1] if node.inputs[0] is x else node.inputs[0]
    if other is x:
        return None
    c = qir.const(other, graph)
    if c is None or c.dtype != np.float32 or c.size != 1 or c.ndim > 1:
        return None  # a wider constant would broadcast the output to a larger shape
    return float(c.reshape(()))


class FoldScalarAffine(QuantPass):
    """QConv -> Mul(a) -> Add(b)  =>  QConv(post_scale=a, post_shift=b)."""

    name = "quant_fold_affine"

    def run(self, model: ir.Model) -> bool:
        graph = model.graph
        outputs = qir.output_ids(graph)
        folded = 0
        for node in qir.qconvs_without(graph, "post_scale", "pool_kernel_shape", "output_scale"):
            scale, shift = 1.0, 0.0
            y = node.outputs[0]
            for op in ("Mul", "Add"):
                uses = list(y.uses())
                if id(y) in outputs or len(uses) != 1:
                    break
                user = uses[0][0]
                if qir.key(user) != ("", op):
                    continue
                c = _scalar_operand(user, y, graph)
                if c is None:
                    self.refuse(f"QConv+{op}", user, f"the {op}'s other operand is not a constant float32 scalar")
                    break
                if op == "Mul":
                    scale = c
                else:
                    shift = c
                qir.absorb(graph, y, user)
                folded += 1
            if (scale, shift) != (1.0, 0.0):
                node.attributes["post_scale"] = ir.AttrFloat32("post_scale", scale)
                node.attributes["post_shift"] = ir.AttrFloat32("post_shift", shift)
        return folded > 0
