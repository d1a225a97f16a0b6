"""Fold each fp16 weight's rounding error into its layer's float32 bias (pass ``fp16_bias_correction``).

Rule (fp16 mode, before ``fp16_weights``): for each Conv / Gemm reading a weight
of ``context.fp16_only`` whose mean input patch was measured on the float model
(``context.fp16_means``, builder/quantize/bias_correction.py), the bias gains
``-dW . E[x patch]`` where dW is the weight's float16 rounding error: the
layer's mean output is kept.  Layers without a measured mean are left alone
(no refusal: they are the ones no data reached).

Runs once: a second run would add the correction again; later sweeps change nothing.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder.quantize.bias_correction import correct_biases
from minirt.builder.quantize.passes.base import BiasCorrectionPass


class FP16BiasCorrection(BiasCorrectionPass):
    """bias += -(W_fp16 - W) . E[x patch], for the weights converted to float16."""

    name = "fp16_bias_correction"

    def correct(self, model: ir.Model) -> int:
        means = self.context.fp16_means
        return correct_biases(model, set(self.context.fp16_only or ()), means) if means else 0
