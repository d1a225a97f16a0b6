"""Quantize a channel Concat of upsampled / scaled tensors in one pass (pass ``quant_fold_upsample_concat``).

Rule: a QConv that quantizes its float X statically with one uint8 pair,
whose X is a ``Concat`` over channels (axis 1) read by that QConv alone, gets a
``com.minirt::QuantizeUpsampleConcat`` of the (X, M) pairs before the Concat:
each input that is a nearest integer-factor ``Resize`` (factor f, read once)
is replaced by the Resize's input, each that is a ``Mul`` by an (N, C, 1, 1)
tensor (a squeeze-and-excitation scale, read once) by (x, s); factor 1 and M
absent for the others.  The new node writes the QConv's uint8 input (its
chained form); nothing multiplied, upsampled, concatenated or float is written,
identical results (PP-OCR det's last conv: four Muls, three Resizes and the
Concat; docs/decisions.md D52).  Static int8 only.

Nothing is folded (no refusal: a plain Concat is the common case) when no input
of the Concat is such a Resize or Mul.  Refused (reported): a Concat over
another axis than channels.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.quantize import qir
from minirt.builder.quantize.passes.base import QuantPass


class FoldUpsampleConcat(QuantPass):
    """QConv(Concat(Resize(a), Mul(b, s), c))  =>  QConv(QuantizeUpsampleConcat(a, -, b, s, c, -))."""

    name = "quant_fold_upsample_concat"

    def run(self, model: ir.Model) -> bool:
        graph = model.graph
        outputs = qir.output_ids(graph)
        folded = 0
        for node in list(graph):
            quant = qir.static_u8_input(node, graph)
            if quant is None:
                continue
            cat = qir.sole_producer(node, "Concat", outputs)
            if cat is None:
                continue
            if int(irh.attr(cat, "axis", 0)) != 1:
                self.refuse("Concat+QConv", cat, f"Concat over axis {irh.attr(cat, 'axis', 0)}, not channels")
                continue
            if any(v is None or v.dtype not in (None, ir.DataType.FLOAT) for v in cat.inputs):
                continue
            folded += self._fold(graph, node, cat, quant, outputs)
        return folded > 0

    @staticmethod
    def _fold(graph: ir.Graph, node: ir.Node, cat: ir.Node, quant: tuple[float, int], outputs: set) -> int:
        sources, factors, removed = [], [], []
        for v in cat.inputs:
            r = v.producer()
            f = qir.nearest_integer_upsample(r, graph) if r is not None else None
            if f is not None and id(v) not in outputs and len(list(v.uses())) == 1:
                removed.append(r)
                v = r.inputs[0]
            else:
                f = 1
            src, m = v, None
            parts = qir.channel_mul_parts(v, outputs)
            if parts is not None:
                mul, src, m = parts
                removed.append(mul)
            sources += [src, m]
            factors.append(f)
        if not removed:
            return 0
        x = node.inputs[0]
        q = ir.Node(qir.DOMAIN, "QuantizeUpsampleConcat", sources,
                    attributes=[ir.AttrInt64s("factors", factors), ir.AttrFloat32("scale", quant[0]),
                                ir.AttrInt64("zero_point", quant[1])],
                    name=f"{cat.name}_quantized", num_outputs=1)
        graph.insert_before(cat, q)
        xq = q.outputs[0]
        xq.name = f"{x.name}_u8"
        xq.dtype, xq.shape = ir.DataType.UINT8, x.shape
        node.replace_input_with(0, xq)
        graph.remove(cat, safe=True)
        for r in removed:  # (each Resize before the Mul it reads)
            graph.remove(r, safe=True)
        return 1
