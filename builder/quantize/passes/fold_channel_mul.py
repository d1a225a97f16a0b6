"""Fold a per-channel ``Mul`` before a QConv into its quantize pass (pass ``quant_fold_channel_mul``).

Rule: ``QConv(Mul(x, s))`` with s statically (N, C, 1, 1) float (a
squeeze-and-excitation scale), the Mul's output read by that QConv alone (as X)
and no graph output, becomes ``QConv(x, ..., X_mul=s)`` when the QConv
quantizes X statically with one uint8 scale and has no X_up / X_mul yet: the
runtime multiplies while it quantizes, identical results, one float pass and
one node less (PP-OCR det's backbone SE blocks, docs/decisions.md
D52).  Static int8 only.

Refused (reported): a Mul before such a QConv whose operands are not one
(N, C, 1, 1) float scale and a float tensor.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder.quantize import qir
from minirt.builder.quantize.passes.base import QuantPass


class FoldChannelMul(QuantPass):
    """QConv(Mul(x, s))  =>  QConv(x, X_mul=s)."""

    name = "quant_fold_channel_mul"

    def run(self, model: ir.Model) -> bool:
        graph = model.graph
        outputs = qir.output_ids(graph)
        folded = 0
        for node, mul in qir.binary_folds_into_static_qconvs(graph, "Mul", outputs):
            parts = qir.channel_mul_parts(node.inputs[0], outputs)
            if parts is None:
                self.refuse("Mul+QConv", mul, "not a multiplication by one (N, C, 1, 1) float scale")
                continue
            _, x_in, s_in = parts
            if x_in is None or x_in.dtype not in (None, ir.DataType.FLOAT):
                self.refuse("Mul+QConv", mul, f"the scaled input {x_in.name if x_in else None!r} is not float")
                continue
            ins = list(node.inputs) + [None] * (7 - len(node.inputs))
            new = ir.Node(qir.DOMAIN, "QConv", [x_in] + ins[1:] + [None, s_in], attributes=list(node.attributes.values()),
                          name=node.name, num_outputs=1)
            qir.replace_node(graph, node, new)
            graph.remove(mul, safe=True)
            folded += 1
        return folded > 0
