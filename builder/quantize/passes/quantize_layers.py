"""Rewrite the chosen candidates into minirt's quantized ops (pass ``quant_layers``).

Each candidate of ``context.selected`` (builder/quantize/candidates.py) is
replaced by one quantized node with the same float input and output::

    Conv, FusedConv          -> QConv(x, x_scale, x_zp, W int8, W_scale, B, Z)
    ConvTranspose, FusedConvTranspose with stride == kernel (static int8 only)
                             -> QConvTranspose(x, x_scale, x_zp, W int8, W_scale, B)
    Gemm, FusedGemm          -> QMatMul(a, a_scale, a_zp, B int8, B_scale, C, Z)  transB kept,
                                alpha folded into B_scale, beta into a constant C
    MatMul, FusedMatMul      -> QMatMul(a, a_scale, a_zp, B int8, B_scale, bias, Z)

Static int8 (``context.ranges`` given) takes x_scale / x_zp from calibration
(per channel for the input of a depthwise convolution when its per-channel
range was collected); int8-dynamic leaves them out (the kernel quantizes x at
run time).  No Quantize/Dequantize nodes sit between layers: the rest of the
graph stays float.

*Weight-only* candidates (other ConvTransposes, LSTM/GRU/RNN, convolutions
kept float for speed) get each weight stored int8 behind a
``com.minirt::DequantizeWeights`` (one per weight, first in the graph),
computed in float32.

Refused (reported, the node stays float): a candidate whose node is gone,
and in static int8 one of the main graph whose input has no calibrated range.  The pass rewrites
on its first run only; later sweeps of the manager repeat its refusals and
change nothing (a second run would find the candidates already rewritten, and
an input renamed by a later fold could otherwise find a range it did not have).
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.quantize import qir
from minirt.builder.quantize.passes.base import QuantPass


class QuantizeLayers(QuantPass):
    """Replace the selected candidates by QConv / QConvTranspose / QMatMul, or int8 weight storage."""

    name = "quant_layers"
    _done: list | None = None  # (node, reason) refused on the first run; None before it
    # static int8: the layers inside bodies the calibration never ran, quantized with run-time input scales
    run_time_scales: list | tuple = ()

    @property
    def skipped(self) -> list[tuple[str, str]]:
        """(candidate name, reason) for the candidates the first run left float."""
        return list(self._done or [])

    def run(self, model: ir.Model) -> bool:
        if self._done is not None:
            for name, reason in self._done:
                self.refuse("candidate", name, reason)
            return False
        ctx = self.context
        b = qir.Builder(model, ctx.reduce_range, ctx.symmetric, ctx.per_channel, ctx.pair_limited, ctx.weight_cache)
        self.run_time_scales = []
        # (every graph: layers inside If / Loop / Scan bodies too, D95; names are unique across them)
        by_name = {n.name: n for g in irh.graphs(model) for n in g}
        skipped: list[tuple[str, str]] = []
        changed = False
        for cand in ctx.selected:
            node = by_name.get(cand.name)
            if node is None:
                skipped.append((cand.name, "node not found"))
                continue
            if cand.computes_float:
                idx, axis = qir.weight_only_inputs(node)
                for i in idx:
                    node.replace_input_with(i, b.dequantized(node.inputs[i], axis))
                changed = True
                continue
            why = self._quantize(b, cand, node)
            if why:
                skipped.append((cand.name, why))
            else:
                changed = True
        if changed:
            model.opset_imports.setdefault(qir.DOMAIN, 1)
        self._done = skipped
        for name, reason in skipped:
            self.refuse("candidate", name, reason)
        return changed

    def _quantize(self, b: qir.Builder, cand: qir.Candidate, node: ir.Node) -> str | None:
        """Replace ``node`` by its quantized form; the reason when it cannot be."""
        ranges = self.context.ranges
        x = node.inputs[0]
        xs = xz = None
        if ranges is not None:
            rng = ranges.get(("channel", x.name)) if cand.depthwise else None
            per_channel = rng is not None
            if rng is None:
                rng = ranges.get(x.name)
            if rng is None and (cand.kind == "convt" or node.graph is b.model.graph):
                return f"no calibration range for its input {x.name!r}"
            if rng is not None:
                xs, xz = b.act(x, rng, per_channel)
            else:  # a layer in an If branch (or a Loop / Scan body) the calibration data never ran: its
                # input is quantized at run time, as in int8-dynamic (the quantizer warns, D95)
                self.run_time_scales.append(cand.name)
        ins = list(node.inputs) + [None] * (4 - len(node.inputs))
        axis, pairs = qir.weight_layout(node, cand.kind, cand.depthwise)  # (the weight's scale axis, its pairs)
        if cand.kind == "convt":
            if ranges is None:
                return "QConvTranspose needs a static input scale (int8 mode)"
            wq, ws = b.weight(node.inputs[1], axis, pairs=pairs)
            new = ir.Node(qir.DOMAIN, "QConvTranspose", [x, xs, xz, wq, ws, ins[2]], attributes=irh.copy_attrs(node),
                          name=node.name, num_outputs=1)
        elif cand.kind == "conv":
            wq, ws = b.weight(node.inputs[1], axis, pairs=pairs)
            new = ir.Node(qir.DOMAIN, "QConv", [x, xs, xz, wq, ws, ins[2], ins[3]], attributes=irh.copy_attrs(node),
                          name=node.name, num_outputs=1)
        else:
            attrs = irh.copy_attrs(node, drop=("alpha", "beta", "transA", "transB"))
            c = ins[2]
            if qir.key(node) in qir.GEMM_OPS:
                trans_b = int(irh.attr(node, "transB", 0))
                alpha = float(irh.attr(node, "alpha", 1.0))
                beta = float(irh.attr(node, "beta", 1.0))
                wq, ws = b.weight(node.inputs[1], axis, alpha, pairs=pairs)
                if c is not None and beta != 1.0:
                    c = b.init((c.const_value.numpy() * np.float32(beta)).astype(np.float32), f"{c.name}_beta")
                attrs.append(ir.AttrInt64("transB", trans_b))
            else:
                wq, ws = b.weight(node.inputs[1], axis, pairs=pairs)
            new = ir.Node(qir.DOMAIN, "QMatMul", [x, xs, xz, wq, ws, c, ins[3]], attributes=attrs, name=node.name,
                          num_outputs=1)
        qir.replace_node(node.graph, node, new)  # (the new initializers are the main graph's: a body captures them)
        return None
