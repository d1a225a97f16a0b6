"""The base class of the quantizer's rewrite passes: a :class:`builder.passes.manager.Pass` whose
context is a :class:`builder.quantize.qir.QuantContext` (the chosen candidates, the calibrated ranges)."""
from __future__ import annotations

import onnx_ir as ir

from minirt.builder.passes.manager import Pass
from minirt.builder.quantize.qir import QuantContext


class QuantPass(Pass):
    """A pass over quantized IR; ``self.context`` is a :class:`QuantContext` (an empty one by default:
    no candidates, int8-dynamic)."""

    def __init__(self, context: QuantContext | None = None):
        super().__init__(context or QuantContext())


class BiasCorrectionPass(QuantPass):
    """A pass that folds weight rounding errors into biases (fp16_bias_correction, int8_bias_correction):
    it runs once (a second run would add the correction again; later sweeps change nothing), and
    ``corrected`` counts the layers its :meth:`correct` changed."""

    corrected: int | None = None  # layers corrected by the first run; None before it

    def correct(self, model: ir.Model) -> int:
        """Correct ``model``'s biases; the number of layers corrected."""
        raise NotImplementedError

    def run(self, model: ir.Model) -> bool:
        if self.corrected is not None:
            return False
        self.corrected = self.correct(model)
        return self.corrected > 0
