"""Fold each int8 weight's rounding error into its layer's float32 bias (pass ``int8_bias_correction``).

Rule (static int8, before ``quant_layers``): for each Conv / Gemm of the selected candidates whose mean
input patch was measured on the float model over the calibration data (``context.int8_means``,
builder/quantize/bias_correction.py), the bias gains ``-dW . E[x patch]``, where dW is what the
weight loses to its int8 storage, computed by the same function that quantizes it
(qir.quantize_weight, with the layout qir.weight_layout gives): the layer's mean output over that data
is the float model's.  This matters most where the weights lose most: pair-limited weights (AVX2
targets, D172) and inputs with a large mean (after a Relu).  Layers without a measured mean are left
alone; depthwise and weights-only layers are corrected too (their weights are rounded as well).

Runs once: a second run would add the correction again; later sweeps change nothing.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder.quantize import qir
from minirt.builder.quantize.bias_correction import correct_biases
from minirt.builder.quantize.passes.base import BiasCorrectionPass


class Int8BiasCorrection(BiasCorrectionPass):
    """bias += -(dequantize(quantize(W)) - W) . E[x patch], for the int8 layers' weights."""

    name = "int8_bias_correction"

    def correct(self, model: ir.Model) -> int:
        ctx = self.context
        cands = {c.name: c for c in ctx.selected if c.kind in ("conv", "matmul")}
        if not ctx.int8_means or not cands:
            return 0

        def roundtrip(w: np.ndarray, node: ir.Node) -> np.ndarray | None:
            cand = cands.get(node.name)
            if cand is None:
                return None
            axis, pairs = qir.weight_layout(node, cand.kind, cand.depthwise)
            # (a layer computed in float from its int8 weight dequantizes all 8 bits: no pair limit)
            pairs = pairs if ctx.pair_limited and not cand.computes_float else None
            q, s = qir.quantize_weight(w, axis, ctx.per_channel, ctx.reduce_range, pairs, ctx.weight_cache,
                                       node.inputs[1].name)
            shape = [1] * w.ndim
            shape[axis] = -1
            return q.astype(np.float32) * s.reshape(shape)

        names = {node.inputs[1].name for node in model.graph
                 if node.name in cands and len(node.inputs) > 1 and node.inputs[1] is not None}
        return correct_biases(model, names, ctx.int8_means, roundtrip, suffix="int8_bias")
