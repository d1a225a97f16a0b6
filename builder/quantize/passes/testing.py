"""Test helpers for the quantizer's passes: tiny float graphs quantized by ``quant_layers`` with made-up
input ranges (every candidate's input in [-4, 4]), ready for the fold under test.

The folds are exact (or differ by float rounding only): ``run`` executes a model with minirt so a test
can compare the graph before and after a pass.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder.passes import testing as T
from minirt.builder.quantize.candidates import find_candidates
from minirt.builder.quantize.passes.quantize_layers import QuantizeLayers
from minirt.builder.quantize.qir import QuantContext

R = np.random.default_rng(11)
make_model, tensor, vinfo, ops, run = T.make_model, T.tensor, T.vinfo, T.ops, T.run


def weight(*shape) -> np.ndarray:
    return (R.standard_normal(shape) * 0.3).astype(np.float32)


def quantized(model, static: bool = True, chain: bool | str = "depthwise") -> tuple[ir.Model, QuantContext]:
    """(the ONNX ``model`` loaded and its every candidate rewritten by quant_layers, the context used)."""
    m = T.load(model)
    candidates, _ = find_candidates(m)
    ranges = {c.input: (-4.0, 4.0) for c in candidates if c.input} if static else None
    context = QuantContext(selected=candidates, ranges=ranges, chain=chain)
    assert QuantizeLayers(context)(m).modified
    return m, context


def empty_model() -> ir.Model:
    """A model whose graph has no nodes (its input is its output)."""
    x = ir.Value(name="x", shape=ir.Shape([1, 2]), type=ir.TensorType(ir.DataType.FLOAT))
    return ir.Model(ir.Graph([x], [x], nodes=[], opset_imports={"": 17}), ir_version=8)


def parity(before: ir.Model, after: ir.Model, feeds, atol: float = 1e-5) -> None:
    """Both models give the same outputs on ``feeds`` (within ``atol``)."""
    for a, b in zip(run(before, feeds), run(after, feeds)):
        np.testing.assert_allclose(np.asarray(b, np.float32), np.asarray(a, np.float32), atol=atol, rtol=1e-5)
