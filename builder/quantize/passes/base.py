"""The base class of the quantizer's rewrite passes: a :class:`builder.passes.manager.Pass` whose
context is a :class:`builder.quantize.qir.QuantContext` (the chosen candidates, the calibrated ranges)."""
from __future__ import annotations

from minirt.builder.passes.manager import Pass
from minirt.builder.quantize.qir import QuantContext


class QuantPass(Pass):
    """A pass over quantized IR; ``self.context`` is a :class:`QuantContext` (an empty one by default:
    no candidates, int8-dynamic)."""

    def __init__(self, context: QuantContext | None = None):
        super().__init__(context or QuantContext())
