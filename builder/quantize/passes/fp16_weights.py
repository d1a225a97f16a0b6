"""Store float32 weights as float16 behind a ``com.minirt::DequantizeWeights`` (pass ``fp16_weights``).

Rule (fp16 mode): every float32 initializer of ``context.fp16_only`` with at
least ``context.fp16_min_elements`` elements, read by the graph and not a graph
input, is stored float16 (times a power of two when all its values are small)
and converted back to float32 once by the runtime
(builder/quantize/weights.py: ``convert_to_fp16``).  Kernels compute in float32.

Refused (reported): a weight with values beyond float16's range (|x| > 65504),
which stays float32.

Runs once (its counts are the report's ``fp16`` entry); later sweeps find
nothing float32 left to convert and change nothing.
"""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder.quantize.passes.base import QuantPass
from minirt.builder.quantize.weights import convert_to_fp16


class FP16Weights(QuantPass):
    """float32 initializer  =>  float16 initializer -> DequantizeWeights."""

    name = "fp16_weights"
    stats: dict | None = None  # convert_to_fp16's counts from the first run; None before it

    def run(self, model: ir.Model) -> bool:
        if self.stats is not None:
            self._report_out_of_range()
            return False
        self.stats = convert_to_fp16(model, self.context.fp16_min_elements, only=self.context.fp16_only)
        self._report_out_of_range()
        return self.stats["initializers"] > 0

    def _report_out_of_range(self) -> None:
        if self.stats and self.stats.get("kept_float32_out_of_range"):
            self.refuse("float16 weight", f"{self.stats['kept_float32_out_of_range']} weight(s)",
                        "values beyond float16's range (|x| > 65504): kept float32")
