"""Test helpers for the passes: build tiny models, optimize, lower and run them with minirt.

``run_both(model_proto, feeds)`` is the parity check every pass test uses:
the unoptimized and optimized artifacts run on the same inputs, so a pass is
checked against minirt's own execution of the original graph.
"""
from __future__ import annotations

import collections
from typing import Mapping

import numpy as np
import onnx
import onnx_ir as ir

import minirt
from minirt.builder.build import _normalise
from minirt.builder.load import load_model
from minirt.builder.lower import artifact_bytes


def load(model) -> ir.Model:
    """ONNX (proto/bytes/path) -> normalised onnx-ir, as build() prepares it."""
    m, _ = load_model(model)
    _normalise(m)
    return m


to_bytes = artifact_bytes  # IR -> .mrt bytes, no passes


def run(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return minirt.Session(to_bytes(model)).run(None, dict(feeds))


def optimized(model, opt_level: int = 2, **kwargs):
    """(optimized onnx-ir model, report) from an ONNX model."""
    from minirt.builder.passes import optimize

    m = load(model)
    report = optimize(m, opt_level, **kwargs)
    return m, report


def run_both(model, feeds: Mapping[str, np.ndarray], opt_level: int = 2, rtol=1e-4, atol=1e-5, **kwargs):
    """Run the model unoptimized and optimized; assert parity; return (optimized model, report, outputs)."""
    ref = run(load(model), feeds)
    m, report = optimized(model, opt_level, **kwargs)
    got = run(m, feeds)
    assert len(ref) == len(got)
    for r, g in zip(ref, got):
        assert r.shape == g.shape, (r.shape, g.shape)
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
    return m, report, got


def ops(model: ir.Model) -> collections.Counter:
    """Histogram of ``domain::op_type`` (plain op_type for ONNX ops) in the main graph."""
    return collections.Counter((n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}")
                               for n in model.graph)


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    """A checked ONNX model from helper-made nodes and value infos."""
    graph = onnx.helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tensor(name: str, array) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(array), name)


def vinfo(name: str, shape, dtype=onnx.TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, dtype, shape)
