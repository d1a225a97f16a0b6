"""Fold a feature pyramid's ``Add(a, Resize(b))`` into the QConv that reads it (pass ``quant_fold_upsample_add``).

Rule: ``QConv(Add(a, Resize(b)))`` becomes ``QConv(a, ..., X_up=b)`` with
``x_up_factor`` f when the Resize repeats each value f x f times
(:func:`builder.quantize.qir.nearest_integer_upsample`), its output is read by
that Add only, the Add's by that QConv only (as X), neither is a graph output,
and the QConv quantizes X statically with one uint8 scale.  When ``a`` is
``Mul(x, s)`` with s of shape (N, C, 1, 1), read by that Add only, it becomes
``X = x, X_mul = s`` too.  The runtime adds (and multiplies) while it
quantizes: one pass, no float sum or upsampled tensor written, identical
results (PP-OCR det: ~0.2 ms of int8's ~5.2, docs/decisions.md D52).
Static int8 only: the QConv needs a calibrated input scale.

Refused (reported): an Add before such a QConv whose upsampled side is a
Resize that is not a nearest integer-factor upsample.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder.quantize import qir
from minirt.builder.quantize.passes.base import QuantPass


class FoldUpsampleAdd(QuantPass):
    """QConv(Add(a, Resize(b)))  =>  QConv(a, X_up=b, x_up_factor=f)."""

    name = "quant_fold_upsample_add"

    def run(self, model: ir.Model) -> bool:
        graph = model.graph
        outputs = qir.output_ids(graph)
        folded = 0
        for node, add in qir.binary_folds_into_static_qconvs(graph, "Add", outputs):
            folded += self._fold(graph, node, add, outputs)
        return folded > 0

    def _fold(self, graph: ir.Graph, node: ir.Node, add: ir.Node, outputs: set) -> int:
        """Fold ``add`` (and its Resize, and a channel Mul on its other side) into ``node``: 1, else 0."""
        for i in (0, 1):
            r = add.inputs[i].producer() if add.inputs[i] is not None else None
            f = qir.nearest_integer_upsample(r, graph) if r is not None else None
            if f is None:
                if r is not None and qir.key(r) == ("", "Resize"):
                    self.refuse("Resize+Add+QConv", r, "the Resize is not a nearest integer-factor upsample "
                                                      "(mode nearest, asymmetric, floor, constant scales (1, 1, f, f))")
                continue
            if id(r.outputs[0]) in outputs or len(list(r.outputs[0].uses())) != 1:
                continue
            other = add.inputs[1 - i]
            if other is None or other.dtype not in (None, ir.DataType.FLOAT):
                continue
            x_mul = mul = None
            parts = qir.channel_mul_parts(other, outputs)
            if parts is not None:
                mul, other, x_mul = parts
            ins = list(node.inputs) + [None] * (7 - len(node.inputs))
            new = ir.Node(qir.DOMAIN, "QConv",
                          [other] + ins[1:] + [r.inputs[0]] + ([x_mul] if x_mul is not None else []),
                          attributes=list(node.attributes.values()) + [ir.AttrInt64("x_up_factor", f)],
                          name=node.name, num_outputs=1)
            qir.replace_node(graph, node, new)
            graph.remove(add, safe=True)
            graph.remove(r, safe=True)
            if mul is not None:
                graph.remove(mul, safe=True)
            return 1
        return 0
