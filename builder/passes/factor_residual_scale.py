"""Factor a residual scale: ``x + x * s`` becomes ``x * (1 + s)``.

Rule (``s`` any tensor, typically a squeeze-and-excitation gate of shape
(N, C, 1, 1); the Mul's result has no other reader and is no graph output)::

    Add(x, Mul(x, s))  ->  Mul(x, Add(s, 1))        (operands in either order)

Why: PP-OCR's RSE-FPN neck (and other "x + x * attention" blocks) write
``x * s`` as a full feature map and then read it back to add ``x``.  Factored,
the only full-size pass is one multiply; the added ``1 + s`` is over the small
gate.

Exactness: identical in real arithmetic, and the result's shape is the same
(both are ``x`` broadcast with ``s``); float results differ by rounding only.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass

_FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE)


class FactorResidualScale(Pass):
    """Rewrite ``Add(x, Mul(x, s))`` as ``Mul(x, Add(s, 1))``."""

    name = "factor_residual_scale"

    def run(self, model: ir.Model) -> bool:
        changed = False
        graph = model.graph
        for node in irh.live_nodes(graph):
            if irh.is_onnx(node, "Add") and len(node.inputs) == 2:
                changed |= self._try(graph, node)
        return changed

    def _try(self, graph: ir.Graph, add: ir.Node) -> bool:
        for scaled in add.inputs:
            mul = scaled.producer() if scaled is not None else None
            if mul is None or mul.graph is not graph or not irh.is_onnx(mul, "Mul") or len(mul.inputs) != 2:
                continue
            x = irh.other_input(add, scaled)
            gate = irh.other_input(mul, x)
            if x is None or gate is None or x is gate or irh.single_use(scaled) is not add:
                continue
            if x.dtype not in _FLOAT_TYPES or gate.dtype != x.dtype:
                continue
            one = irh.new_initializer(graph, np.ones((), dtype=irh.numpy_dtype(x)), "one")
            gate_plus_one = ir.Node("", "Add", [gate, one], name=irh.unique_name(graph, (mul.name or "gate") + "_plus_one"))
            gate_plus_one.outputs[0].type = gate.type
            gate_plus_one.outputs[0].shape = gate.shape
            factored = ir.Node("", "Mul", [x, gate_plus_one.outputs[0]], name=add.name)
            irh.copy_type(factored.outputs[0], add.outputs[0])
            if not irh.can_replace(add.outputs[0], factored.outputs[0]):
                continue
            graph.insert_before(add, [gate_plus_one, factored])
            irh.replace_value(add.outputs[0], factored.outputs[0])
            graph.remove([add, mul], safe=True)
            return True
        return False
