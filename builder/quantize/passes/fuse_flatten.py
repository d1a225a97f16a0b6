"""Fold ``Flatten -> QMatMul`` into the QMatMul's ``flatten_axis`` (pass ``quant_fuse_flatten``).

Rule: a Flatten whose output is no graph output and is read only by a QMatMul,
as its input A, and that QMatMul has no ``flatten_axis`` yet: the QMatMul reads
the Flatten's input with ``flatten_axis`` = the Flatten's axis.  Exact; one
node less per run (digits at batch 1: ~2 us of ~45, docs/decisions.md D25).
Nothing to refuse: every Flatten has the form the attribute expresses.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.quantize import qir
from minirt.builder.quantize.passes.base import QuantPass


class FuseFlatten(QuantPass):
    """Flatten -> QMatMul  =>  QMatMul(flatten_axis)."""

    name = "quant_fuse_flatten"

    def run(self, model: ir.Model) -> bool:
        graph = model.graph
        outputs = qir.output_ids(graph)
        fused = 0
        for node in list(graph):
            if qir.key(node) != ("", "Flatten") or len(node.inputs) != 1:
                continue
            flat = node.outputs[0]
            uses = list(flat.uses())
            if id(flat) in outputs or len(uses) != 1:
                continue
            user, idx = uses[0]
            if not qir.is_minirt(user, "QMatMul") or idx != 0 or "flatten_axis" in user.attributes:
                continue
            user.attributes["flatten_axis"] = ir.AttrInt64("flatten_axis", int(irh.attr(node, "axis", 1)))
            user.replace_input_with(0, node.inputs[0])
            graph.remove(node, safe=True)
            fused += 1
        return fused > 0
